// A floor for issue 15's low-latency combine, in plain CUDA C++ (no
// devcomm): the structure of devcomm's per-rank combine (`moe_combine_bf16`
// with `LlCombine::PerRank`, the default) written as simply as the hardware
// allows, on `moe_bench`'s shape — 2 GPUs (one process, peer access), 128
// tokens per GPU of 7168 bf16, top-8 of 256 experts (128 local per GPU),
// random distinct experts and gate weights, 128 CTAs of 256 threads, one
// launch per combine. The experts' outputs are rows `[local][src * 128 +
// i]` as the dispatch packs them (the host lays them out and writes each
// token's ids, weights and rows where devcomm's headers hold them).
//
//   send:   spans of 4 warps, span s of the grid's 256 takes (source GPU,
//           token) item s: the gate-weighted f32 sum of the token's rows on
//           this GPU's experts, rounded to bf16 once, stored into the
//           source's partial slot for this GPU (NVLink, or local), then the
//           span's barrier and its leader's system fence and relaxed
//           system store of the item's word;
//   wait:   every CTA waits for every (GPU, token) word (a thread a word,
//           acquire polls), `__syncthreads`;
//   reduce: the grid adds, per token and 16-byte vector, the partials of
//           the GPUs its experts live on (f32, rounded once).
// Variants: `pr` (the above: per entry, its 7 vectors a thread in flight);
// `prl` (this GPU's entries gathered first, then four entries' vectors in
// flight at once before any is added).
//
// Reported per variant: the median over 7 reps of 200 back-to-back combines
// (both GPUs, the slower GPU's events) per combine, #wrong (outputs of both
// GPUs against the host's f32 reference of the same roundings, within
// 2^-6 relative + 0.07: two bf16 ulps of a partial below 8, where FMA on
// the GPU may round a partial the other way), and GPU 0's stamps (medians over launches, µs from the
// first CTA's start to the slowest CTA's): sent, waited, reduced.
//
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -Xcompiler -pthread -o moe_combine_floor benches/gpu/moe_combine_floor.cu && ./moe_combine_floor
#include <cuda_runtime.h>

#include "floor_common.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

constexpr int kRanks = 2;
constexpr int kTokens = 128;
constexpr int kHidden = 7168;
constexpr int kVec = kHidden * 2 / 16;  // 896 16-byte vectors of 8 bf16
constexpr int kTopK = 8;
constexpr int kExperts = 256;
constexpr int kLocal = kExperts / kRanks;
constexpr int kThreads = 256;
constexpr int kCtas = 128;
constexpr int kSlots = kRanks * kTokens;
constexpr int kSpanThreads = 128;  // 4 warps: 2 spans a CTA, 256 spans for 256 items
constexpr int kStamps = 4;

struct Side {
    const uint4* eo;       // [kLocal][kSlots][kVec] the experts' outputs
    const int* hid;        // [kRanks src][kTokens][kTopK] the source token's expert ids
    const float* hw;       // its gate weights
    const int* hrow;       // its rows (-1: not this GPU's)
    const int* idx;        // [kTokens][kTopK] this GPU's routing
    uint4* partial;        // [2 parity][kRanks][kTokens][kVec] (written by the holders)
    uint64_t* words;       // [kRanks][kTokens]
    uint4* out;            // [kTokens][kVec]
    uint64_t* stamps;      // null or [launch][kCtas][kStamps]
    uint4* peer_partial[kRanks];
    uint64_t* peer_words[kRanks];
    int rank;
};

enum Variant { PR = 0, PRL = 1, VARIANTS = 2 };
static const char* kVariantName[VARIANTS] = {"pr", "prl"};

__device__ __forceinline__ void stamp(const Side& s, int launch, int k) {
    __syncthreads();
    if (s.stamps && threadIdx.x == 0) s.stamps[((size_t)launch * gridDim.x + blockIdx.x) * kStamps + k] = globaltimer();
}
__host__ __device__ __forceinline__ float bf(uint32_t h) {
    uint32_t b = h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}
__host__ __device__ __forceinline__ uint32_t to_bf(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    return (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
}
// acc[0..8] += w * the 8 bf16 of v
__device__ __forceinline__ void fma8(float* acc, float w, uint4 v) {
    uint32_t q[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        acc[2 * i] += w * bf(q[i] & 0xFFFF);
        acc[2 * i + 1] += w * bf(q[i] >> 16);
    }
}
__device__ __forceinline__ uint4 pack8(const float* acc) {
    uint4 r;
    r.x = to_bf(acc[0]) | to_bf(acc[1]) << 16;
    r.y = to_bf(acc[2]) | to_bf(acc[3]) << 16;
    r.z = to_bf(acc[4]) | to_bf(acc[5]) << 16;
    r.w = to_bf(acc[6]) | to_bf(acc[7]) << 16;
    return r;
}

constexpr int kPerThread = (kVec + kSpanThreads - 1) / kSpanThreads;  // 7

__global__ void __launch_bounds__(kThreads) combine(Side s, uint32_t seq, int variant, int launch) {
    int tid = threadIdx.x, par = seq & 1;
    stamp(s, launch, 0);
    // Send: span `sp` of this CTA takes item blockIdx.x * 2 + sp.
    int sp = tid / kSpanThreads, st = tid % kSpanThreads;
    for (int item = blockIdx.x * (kThreads / kSpanThreads) + sp; item < kSlots; item += gridDim.x * (kThreads / kSpanThreads)) {
        int src = item / kTokens, tok = item % kTokens;
        const int* rows = s.hrow + item * kTopK;
        const float* ws = s.hw + item * kTopK;
        const int* ids = s.hid + item * kTopK;
        bool any = false;
        float acc[kPerThread][8];
#pragma unroll
        for (int u = 0; u < kPerThread; ++u)
#pragma unroll
            for (int c = 0; c < 8; ++c) acc[u][c] = 0.f;
        if (variant == PRL) {
            // This GPU's entries first (row index, weight), then their
            // vectors four entries at a time, all in flight before any add.
            int lr[kTopK];
            float lw[kTopK];
            int nl = 0;
            for (int j = 0; j < kTopK; ++j)
                if (rows[j] >= 0) lr[nl] = (ids[j] - s.rank * kLocal) * kSlots + rows[j], lw[nl++] = ws[j];
            any = nl > 0;
            for (int b = 0; b < nl; b += 4) {
                uint4 v[4][kPerThread];
#pragma unroll
                for (int q = 0; q < 4; ++q)
#pragma unroll
                    for (int u = 0; u < kPerThread; ++u) {
                        int i = st + u * kSpanThreads;
                        v[q][u] = (b + q < nl && i < kVec) ? s.eo[(size_t)lr[b + q] * kVec + i] : make_uint4(0, 0, 0, 0);
                    }
#pragma unroll
                for (int q = 0; q < 4; ++q)
                    if (b + q < nl)
#pragma unroll
                        for (int u = 0; u < kPerThread; ++u) fma8(acc[u], lw[b + q], v[q][u]);
            }
        } else {
            for (int j = 0; j < kTopK; ++j) {
                int r = rows[j];
                if (r < 0) continue;
                any = true;
                float w = ws[j];
                const uint4* e = s.eo + ((size_t)(ids[j] - s.rank * kLocal) * kSlots + r) * kVec;
#pragma unroll
                for (int u = 0; u < kPerThread; ++u) {
                    int i = st + u * kSpanThreads;
                    if (i < kVec) fma8(acc[u], w, e[i]);
                }
            }
        }
        if (any) {
            uint4* d = s.peer_partial[src] + (((size_t)par * kRanks + s.rank) * kTokens + tok) * kVec;
#pragma unroll
            for (int u = 0; u < kPerThread; ++u) {
                int i = st + u * kSpanThreads;
                if (i < kVec) d[i] = pack8(acc[u]);
            }
        }
        asm volatile("bar.sync %0, %1;" ::"r"(1 + sp), "r"(kSpanThreads) : "memory");
        if (st == 0) {
            __threadfence_system();
            st_relaxed_sys(s.peer_words[src] + s.rank * kTokens + tok, ((uint64_t)seq << 32) | (any ? 1 : 0));
        }
    }
    stamp(s, launch, 1);
    for (int i = tid; i < kSlots; i += blockDim.x)
        while (ld_acquire_sys(s.words + i) < ((uint64_t)seq << 32)) {
        }
    stamp(s, launch, 2);
    // Reduce: per (token, vector), the partials of the GPUs its experts live on.
    int n = gridDim.x * blockDim.x;
    for (int w = blockIdx.x * blockDim.x + tid; w < kTokens * kVec; w += n) {
        int tok = w / kVec, i = w % kVec;
        const int* id = s.idx + tok * kTopK;
        bool on[kRanks] = {};
        for (int j = 0; j < kTopK; ++j) on[id[j] / kLocal] = true;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        uint4 v[kRanks];
#pragma unroll
        for (int d = 0; d < kRanks; ++d) v[d] = on[d] ? s.partial[(((size_t)par * kRanks + d) * kTokens + tok) * kVec + i] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int d = 0; d < kRanks; ++d)
            if (on[d]) fma8(acc, 1.f, v[d]);
        s.out[(size_t)tok * kVec + i] = pack8(acc);
    }
    stamp(s, launch, 3);
}

int main(int argc, char** argv) {
    auto wanted = [&](int v) { return variant_wanted(argc, argv, kVariantName[v]); };
    std::string gpu = open_two_gpus("moe_combine_floor");
    printf("# moe_combine_floor: 2 x %s, plain-CUDA low-latency MoE combine (per-rank partials), %d tokens/GPU x %d bf16, top-%d of %d, %d CTAs x %d threads\n",
           gpu.c_str(), kTokens, kHidden, kTopK, kExperts, kCtas, kThreads);
    const int iters = 200, reps = 7;
    std::mt19937 rng(16);
    std::uniform_real_distribution<float> unit(-1.f, 1.f), gate(0.05f, 1.f);
    std::vector<int> idx[2];
    std::vector<float> wts[2];
    for (int r = 0; r < 2; ++r) {
        idx[r] = random_topk(rng, kTokens, kTopK, kExperts);
        wts[r].resize(kTokens * kTopK);
        for (auto& w : wts[r]) w = gate(rng);
    }
    // Rows as the dispatch packs them: expert e's tokens in (source, token) order.
    std::vector<int> hrow[2];  // per holder GPU: [src][tok][j]
    for (int g = 0; g < 2; ++g) {
        hrow[g].assign(kSlots * kTopK, -1);
        std::vector<int> next(kLocal, 0);
        for (int src = 0; src < 2; ++src)
            for (int t = 0; t < kTokens; ++t)
                for (int j = 0; j < kTopK; ++j) {
                    int e = idx[src][t * kTopK + j];
                    if (e / kLocal == g) hrow[g][(src * kTokens + t) * kTopK + j] = next[e % kLocal]++;
                }
    }
    std::vector<int> hid(kSlots * kTopK);
    std::vector<float> hw(kSlots * kTopK);
    for (int src = 0; src < 2; ++src)
        for (int i = 0; i < kTokens * kTopK; ++i) hid[src * kTokens * kTopK + i] = idx[src][i], hw[src * kTokens * kTopK + i] = wts[src][i];
    const size_t eo_words = (size_t)kLocal * kSlots * kVec * 4;  // u32 words
    std::vector<uint32_t> eo[2];
    for (int g = 0; g < 2; ++g) {
        eo[g].resize(eo_words);
        for (auto& w : eo[g]) w = to_bf(unit(rng)) | to_bf(unit(rng)) << 16;
    }
    // The host's reference, with the kernel's roundings (partial rounded to bf16 once, the sum once).
    std::vector<float> ref[2];
    for (int r = 0; r < 2; ++r) {
        ref[r].assign((size_t)kTokens * kHidden, 0.f);
        for (int t = 0; t < kTokens; ++t) {
            std::vector<float> sum(kHidden, 0.f);
            for (int g = 0; g < 2; ++g) {
                std::vector<float> part(kHidden, 0.f);
                bool any = false;
                for (int j = 0; j < kTopK; ++j) {
                    int row = hrow[g][(r * kTokens + t) * kTopK + j];
                    if (row < 0) continue;
                    any = true;
                    int l = idx[r][t * kTopK + j] % kLocal;
                    const uint16_t* x = reinterpret_cast<const uint16_t*>(eo[g].data()) + ((size_t)l * kSlots + row) * kHidden;
                    for (int c = 0; c < kHidden; ++c) part[c] += wts[r][t * kTopK + j] * bf(x[c]);
                }
                if (any)
                    for (int c = 0; c < kHidden; ++c) sum[c] += bf(to_bf(part[c]));
            }
            for (int c = 0; c < kHidden; ++c) ref[r][(size_t)t * kHidden + c] = bf(to_bf(sum[c]));
        }
    }
    Side side[2];
    const size_t partial_bytes = (size_t)2 * kSlots * kVec * 16, out_bytes = (size_t)kTokens * kVec * 16;
    const size_t stamp_words = (size_t)iters * kCtas * kStamps;
    cudaStream_t st[2];
    cudaEvent_t ev0[2], ev1[2];
    for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        Side& s = side[d];
        s.rank = d;
        uint4 *e, *partial, *out;
        int *id, *row, *myidx;
        float* w;
        uint64_t *words, *stamps;
        CK(cudaMalloc(&e, eo_words * 4));
        CK(cudaMalloc(&id, hid.size() * sizeof(int)));
        CK(cudaMalloc(&w, hw.size() * sizeof(float)));
        CK(cudaMalloc(&row, hrow[d].size() * sizeof(int)));
        CK(cudaMalloc(&myidx, kTokens * kTopK * sizeof(int)));
        CK(cudaMalloc(&partial, partial_bytes));
        CK(cudaMalloc(&words, kSlots * sizeof(uint64_t)));
        CK(cudaMalloc(&out, out_bytes));
        CK(cudaMalloc(&stamps, stamp_words * sizeof(uint64_t)));
        CK(cudaMemcpy(e, eo[d].data(), eo_words * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(id, hid.data(), hid.size() * sizeof(int), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(w, hw.data(), hw.size() * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(row, hrow[d].data(), hrow[d].size() * sizeof(int), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(myidx, idx[d].data(), kTokens * kTopK * sizeof(int), cudaMemcpyHostToDevice));
        CK(cudaMemset(words, 0, kSlots * sizeof(uint64_t)));
        s.eo = e, s.hid = id, s.hw = w, s.hrow = row, s.idx = myidx, s.partial = partial, s.words = words, s.out = out, s.stamps = stamps;
        CK(cudaStreamCreateWithFlags(&st[d], cudaStreamNonBlocking));
        CK(cudaEventCreate(&ev0[d]));
        CK(cudaEventCreate(&ev1[d]));
    }
    for (int d = 0; d < 2; ++d)
        for (int p = 0; p < 2; ++p) side[d].peer_partial[p] = side[p].partial, side[d].peer_words[p] = side[p].words;
    printf("# variant | us/combine (200 back to back, median of %d) | #wrong | GPU 0 stamps (medians, us from the first CTA's start): sent waited reduced\n", reps);
    uint32_t seq = 0;
    std::vector<uint64_t> hs(stamp_words);
    std::vector<uint32_t> hout(out_bytes / 4);
    for (int v = 0; v < VARIANTS; ++v) {
        if (!wanted(v)) continue;
        auto launch_all = [&](bool stamped, bool timed) {
            uint32_t first = seq + 1;
            float ms = on_both_gpus(st, ev0, ev1, timed, [&](int d) {
                Side s = side[d];
                if (!stamped) s.stamps = nullptr;
                for (int it = 0; it < iters; ++it) combine<<<kCtas, kThreads, 0, st[d]>>>(s, first + it, v, it);
            });
            seq += iters;
            return ms;
        };
        for (int d = 0; d < 2; ++d) {
            CK(cudaSetDevice(d));
            CK(cudaMemset(side[d].out, 0xA5, out_bytes));  // poisoned
        }
        launch_all(false, false);  // warm-up
        std::vector<double> per = per_launch_us(reps, iters, [&] { return launch_all(false, true); });
        launch_all(true, false);
        long wrong = 0;
        double worst = 0;
        for (int d = 0; d < 2; ++d) {
            CK(cudaSetDevice(d));
            CK(cudaMemcpy(hout.data(), side[d].out, out_bytes, cudaMemcpyDeviceToHost));
            const uint16_t* got = reinterpret_cast<const uint16_t*>(hout.data());
            for (size_t c = 0; c < (size_t)kTokens * kHidden; ++c) {
                double g = bf(got[c]), r = ref[d][c], err = fabs(g - r);
                worst = std::max(worst, err / (fabs(r) + 1e-3));
                // One bf16 rounding of a partial (|partial| < 8: an ulp of
                // at most 2^-5) may differ from the host's (FMA on the GPU).
                wrong += !(err <= fabs(r) / 64 + 0.07);
            }
        }
        CK(cudaSetDevice(0));
        CK(cudaMemcpy(hs.data(), side[0].stamps, stamp_words * sizeof(uint64_t), cudaMemcpyDeviceToHost));
        std::vector<double> m = stage_medians(hs, iters, kCtas, kStamps);
        printf("%-4s | %7.2f (min %.2f max %.2f) | %ld (worst relative error %.2e) | %.2f %.2f %.2f\n", kVariantName[v], per[reps / 2], per[0],
               per[reps - 1], wrong, worst, m[1], m[2], m[3]);
        fflush(stdout);
    }
    return 0;
}
