// A floor for issue 15's high-throughput dispatch in the per-source,
// in-the-window layout (`moe_ht_dispatch_per_source`, `HtLayout::
// PerSourceInWindow`), in plain CUDA C++ (no devcomm), on `moe_bench`'s
// shape: 2 GPUs (one process, peer access), 4096 tokens per GPU of 7168
// bf16, top-8 of 256 experts (128 local per GPU), 256 channels per
// destination (16 tokens each), 128 CTAs of 256 threads, spans of 2 warps
// (4 a CTA, 512 in all), one launch per dispatch. The question it answers:
// devcomm's sends end at ~167 us, its last channel word is seen 20-30 us
// later and its last receive ends ~20 us after that (session 29) — is that
// tail the structure's, or devcomm's code?
//
//   send:    span s takes (destination, channel) item s (destinations from
//            the next GPU on, as devcomm): each token of the channel's 16
//            that goes to the destination (one of its experts there) is
//            copied to the destination's receive slot (source, position)
//            with its routing row (8 ids, 8 weights); the span's barrier,
//            then its leader stores the channel's first position, a system
//            fence and the channel's word (seq:count), relaxed at system
//            scope. Positions are the host's (devcomm counts them on the GPU).
//   receive: span s takes (source, channel) item s: waits for the channel's
//            word (variant `all`: every thread polls it; `lead`: the leader
//            polls, then the span's barrier), reads the position word, then
//            writes the channel's routing entries (local expert index or -1,
//            weight or 0) and counts each token once per distinct local
//            expert (atomicAdd), the span's barrier. Variant `wait`: no
//            routing (the wait alone). Variant `rel`: `all` with the
//            channel's word stored by one release store (devcomm's
//            `publish`) instead of a fence and a relaxed store. Variant
//            `pair`: `all`, each dispatch followed by a kernel that reads
//            this GPU's tokens back from the peer's receive slots over
//            NVLink (the traffic of devcomm's in-window combine, which
//            reads the peer's rows in place): the time is then a pair's,
//            and the dispatch's stamps show what following such a
//            kernel costs it. Variant `fence`: no receive; after its sends
//            every thread runs a system fence, then "last word seen" and
//            "done" are stamped: when this GPU's writes have landed (as
//            devcomm's diagnostic vi, session 31).
//
// Stamps (%globaltimer, medians over launches of the slowest CTA, us from
// the first CTA's start; per span by atomicMax, as devcomm's `stamp_span`):
// sent (all of the CTA's sends), the last channel word seen, the last
// receive done. Reported per variant: the median over 7 reps of 20
// back-to-back dispatches (both GPUs, the slower GPU's events), #wrong
// (both GPUs' received tokens, routing entries and counts against the
// host's), the stamps.
//
// With FLOOR_VMM=1 the receive areas (slots, routing rows, words,
// positions) are VMM memory (`vmm_alloc`: cuMemCreate / cuMemMap /
// cuMemSetAccess for both GPUs), as devcomm's windows.
//
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -Xcompiler -pthread -o moe_ht_floor benches/gpu/moe_ht_floor.cu -lcuda && ./moe_ht_floor
#include <cuda_runtime.h>

#include "floor_common.cuh"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

constexpr int kRanks = 2;
constexpr int kTokens = 4096;
constexpr int kHidden = 7168;
constexpr int kVec = kHidden * 2 / 16;  // 896 16-byte vectors a token
constexpr int kTopK = 8;
constexpr int kExperts = 256;
constexpr int kLocal = kExperts / kRanks;
constexpr int kChannels = 256;
constexpr int kPerChannel = kTokens / kChannels;  // 16
constexpr int kThreads = 256;
constexpr int kCtas = 128;
constexpr int kSpan = 64;  // 2 warps: 4 spans a CTA, 512 in all
constexpr int kSpans = kCtas * (kThreads / kSpan);
constexpr int kStamps = 4;  // start, sent, last word seen, last receive done
constexpr int kPerThread = kVec / kSpan;  // 14
static_assert(kVec % kSpan == 0, "a token is whole vectors per span thread");
static_assert(kSpans == kRanks * kChannels, "a span an item");

struct Side {
    const uint4* x;          // [kTokens][kVec] this GPU's tokens
    const int* idx;          // [kTokens][kTopK]
    const float* wts;        // [kTokens][kTopK]
    const int* tpos;         // [kRanks dest][kTokens] position among the tokens to dest, -1: not sent there
    const uint32_t* first;   // [kRanks dest][kChannels] the channel's first position
    uint4* slots;            // [kRanks src][kTokens][kVec] received tokens (in the window)
    int* meta;               // [kRanks src][kTokens][2 * kTopK] received routing rows (ids, weight bits)
    uint64_t* words;         // [kRanks src][kChannels] seq:count
    uint64_t* pos;           // [kRanks src][kChannels] seq:first
    int* recv_idx;           // [kRanks src][kTokens][kTopK]
    float* recv_w;           // same
    uint32_t* counts;        // [kLocal], zeroed before each launch
    uint64_t* stamps;        // null or [launch][kCtas][kStamps]
    uint4* peer_slots[kRanks];
    int* peer_meta[kRanks];
    uint64_t* peer_words[kRanks];
    uint64_t* peer_pos[kRanks];
    int rank;
};

enum Variant { ALL = 0, LEAD = 1, WAIT = 2, REL = 3, PAIR = 4, FENCE = 5, VARIANTS = 6 };
static const char* kVariantName[VARIANTS] = {"all", "lead", "wait", "rel", "pair", "fence"};

__device__ __forceinline__ void stamp(const Side& s, int launch, int k) {
    __syncthreads();
    if (s.stamps && threadIdx.x == 0) s.stamps[((size_t)launch * gridDim.x + blockIdx.x) * kStamps + k] = globaltimer();
}
__device__ __forceinline__ void stamp_span(const Side& s, int launch, int k, int st) {
    if (s.stamps && st == 0)
        atomicMax((unsigned long long*)&s.stamps[((size_t)launch * gridDim.x + blockIdx.x) * kStamps + k],
                  (unsigned long long)globaltimer());
}
__device__ __forceinline__ void span_sync(int sp) { asm volatile("bar.sync %0, %1;" ::"r"(1 + sp), "r"(kSpan) : "memory"); }

__global__ void __launch_bounds__(kThreads) dispatch(Side s, uint32_t seq, int variant, int launch) {
    int tid = threadIdx.x, sp = tid / kSpan, st = tid % kSpan;
    int item = sp * gridDim.x + blockIdx.x;  // devcomm's order: span j of every CTA, then j + 1
    if (s.stamps && tid == 0)
        for (int k = 2; k < kStamps; ++k) s.stamps[((size_t)launch * gridDim.x + blockIdx.x) * kStamps + k] = 0;
    stamp(s, launch, 0);
    // Send item (dest, channel).
    {
        int dest = (s.rank + 1 + item / kChannels) % kRanks, c = item % kChannels;
        uint4* dslots = s.peer_slots[dest] + (size_t)s.rank * kTokens * kVec;
        int* dmeta = s.peer_meta[dest] + (size_t)s.rank * kTokens * 2 * kTopK;
        uint32_t count = 0;
        for (int t = c * kPerChannel; t < (c + 1) * kPerChannel; ++t) {
            int p = s.tpos[dest * kTokens + t];
            if (p < 0) continue;
            ++count;
            const uint4* src = s.x + (size_t)t * kVec;
            uint4 v[kPerThread];
#pragma unroll
            for (int u = 0; u < kPerThread; ++u) v[u] = src[st + u * kSpan];
            uint4* dst = dslots + (size_t)p * kVec;
#pragma unroll
            for (int u = 0; u < kPerThread; ++u) dst[st + u * kSpan] = v[u];
            if (st < kTopK) {
                dmeta[p * 2 * kTopK + st] = s.idx[t * kTopK + st];
                dmeta[p * 2 * kTopK + kTopK + st] = __float_as_int(s.wts[t * kTopK + st]);
            }
        }
        span_sync(sp);
        if (st == 0) {
            st_relaxed_sys(s.peer_pos[dest] + s.rank * kChannels + c, ((uint64_t)seq << 32) | s.first[dest * kChannels + c]);
            if (variant == REL) {
                // devcomm's publish: a release store, no separate fence.
                st_release_sys(s.peer_words[dest] + s.rank * kChannels + c, ((uint64_t)seq << 32) | count);
            } else {
                __threadfence_system();
                st_relaxed_sys(s.peer_words[dest] + s.rank * kChannels + c, ((uint64_t)seq << 32) | count);
            }
        }
    }
    stamp(s, launch, 1);
    if (variant == FENCE) {
        // A system fence by every thread, then the stamps: when this GPU's
        // writes have landed (devcomm's diagnostic vi, session 31). No receive.
        __threadfence_system();
        stamp(s, launch, 2);
        stamp(s, launch, 3);
        return;
    }
    // Receive item (src, channel).
    {
        int src = item / kChannels, c = item % kChannels;
        const uint64_t* wp = s.words + src * kChannels + c;
        uint64_t w;
        if (variant == LEAD) {
            if (st == 0)
                while ((ld_relaxed_sys(wp) >> 32) < seq) {
                }
            span_sync(sp);
            w = ld_acquire_sys(wp);
        } else {
            while (((w = ld_acquire_sys(wp)) >> 32) < seq) {
            }
        }
        uint32_t count = (uint32_t)w, first = (uint32_t)ld_relaxed_sys(s.pos + src * kChannels + c);
        stamp_span(s, launch, 2, st);
        if (variant != WAIT) {
            int lo = s.rank * kLocal;
            const int* meta = s.meta + ((size_t)src * kTokens + first) * 2 * kTopK;
            for (uint32_t i = st; i < count * kTopK; i += kSpan) {
                uint32_t p = i / kTopK, j = i % kTopK;
                const int* ids = meta + p * 2 * kTopK;
                int e = ids[j];
                float wt = __int_as_float(ids[kTopK + j]);
                bool dup = false;
                for (uint32_t q = 0; q < j; ++q) dup |= ids[q] == e;
                bool local = e >= lo && e < lo + kLocal;
                size_t at = ((size_t)src * kTokens + first + p) * kTopK + j;
                s.recv_idx[at] = local ? e - lo : -1;
                s.recv_w[at] = local ? wt : 0.f;
                if (local && !dup) atomicAdd(&s.counts[e - lo], 1u);
            }
        }
        span_sync(sp);
        stamp_span(s, launch, 3, st);
    }
}

// Reads `count` rows of this GPU's tokens back from the peer's receive
// slots (rows `me * kTokens + p`) into `back`, 16 bytes a thread at a time.
__global__ void __launch_bounds__(kThreads) pull(const uint4* peer_rows, uint4* back, size_t vecs) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < vecs; i += (size_t)gridDim.x * blockDim.x) back[i] = peer_rows[i];
}

int main(int argc, char** argv) {
    auto wanted = [&](int v) { return variant_wanted(argc, argv, kVariantName[v]); };
    std::string gpu = open_two_gpus("moe_ht_floor");
    const bool vmm = getenv("FLOOR_VMM") && strcmp(getenv("FLOOR_VMM"), "1") == 0;
    printf("# moe_ht_floor: 2 x %s, plain-CUDA high-throughput MoE dispatch (per source, in the window), %d tokens/GPU x %d bf16, top-%d of %d, %d channels, %d CTAs x %d threads, spans of %d; receive areas in %s\n",
           gpu.c_str(), kTokens, kHidden, kTopK, kExperts, kChannels, kCtas, kThreads, kSpan,
           vmm ? "VMM memory (FLOOR_VMM=1)" : "cudaMalloc memory");
    const int iters = 20, reps = 7;
    std::mt19937 rng(30);
    std::vector<int> idx[2], tpos[2];
    std::vector<float> wts[2];
    std::vector<uint32_t> first[2], x[2];
    for (int r = 0; r < 2; ++r) {
        idx[r] = random_topk(rng, kTokens, kTopK, kExperts);
        wts[r].resize(kTokens * kTopK);
        std::uniform_real_distribution<float> gate(0.05f, 1.f);
        for (auto& w : wts[r]) w = gate(rng);
        tpos[r].assign(kRanks * kTokens, -1);
        first[r].assign(kRanks * kChannels, 0);
        for (int d = 0; d < kRanks; ++d) {
            int n = 0;
            for (int t = 0; t < kTokens; ++t) {
                if (t % kPerChannel == 0) first[r][d * kChannels + t / kPerChannel] = n;
                bool to = false;
                for (int j = 0; j < kTopK; ++j) to |= idx[r][t * kTopK + j] / kLocal == d;
                if (to) tpos[r][d * kTokens + t] = n++;
            }
        }
        x[r].resize((size_t)kTokens * kVec * 4);
        std::uniform_int_distribution<uint32_t> bits;
        for (auto& v : x[r]) v = bits(rng);
    }
    Side side[2];
    const size_t slot_bytes = (size_t)kRanks * kTokens * kVec * 16, meta_ints = (size_t)kRanks * kTokens * 2 * kTopK;
    const size_t entries = (size_t)kRanks * kTokens * kTopK, stamp_words = (size_t)iters * kCtas * kStamps;
    cudaStream_t st[2];
    cudaEvent_t ev0[2], ev1[2];
    for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        Side& s = side[d];
        s.rank = d;
        uint4 *xd, *slots;
        int *id, *tp, *meta, *ri;
        float *w, *rw;
        uint32_t *fi, *counts;
        uint64_t *words, *pos, *stamps;
        CK(cudaMalloc(&xd, x[d].size() * 4));
        CK(cudaMalloc(&id, idx[d].size() * sizeof(int)));
        CK(cudaMalloc(&w, wts[d].size() * sizeof(float)));
        CK(cudaMalloc(&tp, tpos[d].size() * sizeof(int)));
        CK(cudaMalloc(&fi, first[d].size() * sizeof(uint32_t)));
        if (vmm) {
            slots = (uint4*)vmm_alloc(d, slot_bytes);
            meta = (int*)vmm_alloc(d, meta_ints * sizeof(int));
            words = (uint64_t*)vmm_alloc(d, kRanks * kChannels * sizeof(uint64_t));
            pos = (uint64_t*)vmm_alloc(d, kRanks * kChannels * sizeof(uint64_t));
        } else {
            CK(cudaMalloc(&slots, slot_bytes));
            CK(cudaMalloc(&meta, meta_ints * sizeof(int)));
            CK(cudaMalloc(&words, kRanks * kChannels * sizeof(uint64_t)));
            CK(cudaMalloc(&pos, kRanks * kChannels * sizeof(uint64_t)));
        }
        CK(cudaMalloc(&ri, entries * sizeof(int)));
        CK(cudaMalloc(&rw, entries * sizeof(float)));
        CK(cudaMalloc(&counts, kLocal * sizeof(uint32_t)));
        CK(cudaMalloc(&stamps, stamp_words * sizeof(uint64_t)));
        CK(cudaMemcpy(xd, x[d].data(), x[d].size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(id, idx[d].data(), idx[d].size() * sizeof(int), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(w, wts[d].data(), wts[d].size() * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(tp, tpos[d].data(), tpos[d].size() * sizeof(int), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(fi, first[d].data(), first[d].size() * sizeof(uint32_t), cudaMemcpyHostToDevice));
        CK(cudaMemset(words, 0, kRanks * kChannels * sizeof(uint64_t)));
        CK(cudaMemset(pos, 0, kRanks * kChannels * sizeof(uint64_t)));
        s.x = xd, s.idx = id, s.wts = w, s.tpos = tp, s.first = fi, s.slots = slots, s.meta = meta, s.words = words;
        s.pos = pos, s.recv_idx = ri, s.recv_w = rw, s.counts = counts, s.stamps = stamps;
        CK(cudaStreamCreateWithFlags(&st[d], cudaStreamNonBlocking));
        CK(cudaEventCreate(&ev0[d]));
        CK(cudaEventCreate(&ev1[d]));
    }
    for (int d = 0; d < 2; ++d)
        for (int p = 0; p < 2; ++p) {
            side[d].peer_slots[p] = side[p].slots, side[d].peer_meta[p] = side[p].meta;
            side[d].peer_words[p] = side[p].words, side[d].peer_pos[p] = side[p].pos;
        }
    uint4* back[2];
    int sent_to[2];
    for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaMalloc(&back[d], (size_t)kTokens * kVec * 16));
        sent_to[d] = 0;
        for (int t = 0; t < kTokens; ++t) sent_to[d] += tpos[d][(1 - d) * kTokens + t] >= 0;
    }
    printf("# variant | us/dispatch (%d back to back, median of %d; `pair`: a dispatch and its read back) | #wrong | GPU 0 stamps (medians, us from the first CTA's start): sent, last word seen, last receive done | GPU 1's\n", iters, reps);
    uint32_t seq = 0;
    std::vector<uint64_t> hs(stamp_words);
    for (int v = 0; v < VARIANTS; ++v) {
        if (!wanted(v)) continue;
        auto launch_all = [&](bool stamped, bool timed) {
            uint32_t base = seq + 1;
            float ms = on_both_gpus(st, ev0, ev1, timed, [&](int d) {
                Side s = side[d];
                if (!stamped) s.stamps = nullptr;
                for (int it = 0; it < iters; ++it) {
                    CK(cudaMemsetAsync(s.counts, 0, kLocal * sizeof(uint32_t), st[d]));
                    dispatch<<<kCtas, kThreads, 0, st[d]>>>(s, base + it, v == PAIR ? ALL : v, it);
                    if (v == PAIR)
                        pull<<<kCtas, kThreads, 0, st[d]>>>(s.peer_slots[1 - d] + (size_t)d * kTokens * kVec, back[d],
                                                            (size_t)sent_to[d] * kVec);
                }
            });
            seq += iters;
            return ms;
        };
        for (int d = 0; d < 2; ++d) {
            CK(cudaSetDevice(d));
            CK(cudaMemset(side[d].slots, 0xA5, slot_bytes));  // poisoned
            CK(cudaMemset(side[d].recv_idx, 0xA5, entries * sizeof(int)));
        }
        launch_all(false, false);  // warm-up
        std::vector<double> per = per_launch_us(reps, iters, [&] { return launch_all(false, true); });
        std::vector<double> m[2];
        for (int d = 0; d < 2; ++d) {
            CK(cudaSetDevice(d));
            CK(cudaMemset(side[d].slots, 0xA5, slot_bytes));
            CK(cudaMemset(side[d].recv_idx, 0xA5, entries * sizeof(int)));
        }
        launch_all(true, false);
        for (int d = 0; d < 2; ++d) {
            CK(cudaSetDevice(d));
            CK(cudaMemcpy(hs.data(), side[d].stamps, stamp_words * sizeof(uint64_t), cudaMemcpyDeviceToHost));
            m[d] = stage_medians(hs, iters, kCtas, kStamps);
        }
        // Check both GPUs: tokens from the peer and from itself, routing entries, counts.
        long wrong = 0;
        std::vector<uint32_t> hslots(slot_bytes / 4);
        std::vector<int> hri(entries);
        std::vector<uint32_t> hc(kLocal);
        for (int d = 0; d < 2; ++d) {
            CK(cudaSetDevice(d));
            CK(cudaMemcpy(hslots.data(), side[d].slots, slot_bytes, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hri.data(), side[d].recv_idx, entries * sizeof(int), cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hc.data(), side[d].counts, kLocal * sizeof(uint32_t), cudaMemcpyDeviceToHost));
            std::vector<uint32_t> want_c(kLocal, 0);
            for (int src = 0; src < 2; ++src)
                for (int t = 0; t < kTokens; ++t) {
                    int p = tpos[src][d * kTokens + t];
                    if (p < 0) continue;
                    wrong += memcmp(&hslots[((size_t)src * kTokens + p) * kVec * 4], &x[src][(size_t)t * kVec * 4], kVec * 16) != 0;
                    for (int j = 0; j < kTopK; ++j) {
                        int e = idx[src][t * kTopK + j];
                        bool local = e / kLocal == d, dup = false;
                        for (int q = 0; q < j; ++q) dup |= idx[src][t * kTopK + q] == e;
                        if (local && !dup) want_c[e - d * kLocal]++;
                        if (v != WAIT && v != FENCE) wrong += hri[((size_t)src * kTokens + p) * kTopK + j] != (local ? e - d * kLocal : -1);
                    }
                }
            if (v != WAIT && v != FENCE)
                for (int l = 0; l < kLocal; ++l) wrong += hc[l] != want_c[l];
        }
        printf("%-4s | %7.2f (min %.2f max %.2f) | %ld | %.1f %.1f %.1f | %.1f %.1f %.1f\n", kVariantName[v], per[reps / 2], per[0], per[reps - 1],
               wrong, m[0][1], m[0][2], m[0][3], m[1][1], m[1][2], m[1][3]);
        fflush(stdout);
    }
    return 0;
}
