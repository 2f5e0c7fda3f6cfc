// A floor for issue 14's 2 MiB all-reduce goal, in plain CUDA C++ (no
// devcomm): two-GPU all-reduces of floats written as simply as the
// hardware allows, timed the way `devcomm-perf --graph` times devcomm's
// (graphed launches back to back, and many all-reduces inside one kernel:
// "in kernel").
//
// One process, two GPUs with peer access. Variants (CTA b of each GPU
// works with CTA b of the other; GPU r owns shard r, half the vectors):
//   pull: meet (the peer's input is ready), read the own shard of the
//         peer's input over NVLink, add the own, store the sum into both
//         outputs, meet;
//   push: meet, store the peer's shard of the input into its staging,
//         meet, sum, store into both outputs, meet (only stores cross
//         NVLink);
//   os:   devcomm's pushed one-shot on two ranks: the whole input into the
//         peer's staging area of the call's parity, meet, the sum computed
//         locally; no closing meet (the parity keeps the next call off the
//         area the peer may still read);
//   osr:  os with the input held in registers across the meet;
//   ts:   devcomm's pushed two-shot: the peer's shard into its input area,
//         meet, the own shard's sum into the output and the peer's result
//         area, meet, the peer's shard copied out; no closing meet;
//   osc:  os with devcomm's data layout and launch: each CTA a contiguous
//         range of the vectors, 256 threads, each loading 4 vectors before
//         storing them (devcomm's `copy_strided`) and, after the meet,
//         loading 4 of the input and 4 of the staging before adding
//         (devcomm's `reduce_into`): whether devcomm's 2 MiB gap to `os`
//         is its layout or its code;
//   osw:  os with a flag per warp instead of the CTA's meet: each warp
//         releases its own flag after its stores (`__syncwarp` first) and
//         sums its own vectors once the peer's same warp flagged them
//         (devcomm's `CollConfig::warp_flags`).
// Meets: a release store of the epoch into the peer's flag of CTA b, an
// acquire spin on its own (thread 0), `__syncthreads` around.
//
// Reported per size, variant and CTA count: the median over 7 reps of
// (a) graphed: 200 kernel launches captured in one CUDA graph per GPU,
//     time per all-reduce (the later GPU's events),
// (b) in kernel: one launch doing 200 all-reduces, time per all-reduce;
// #wrong (outputs of both GPUs against in0 + in1, exact in f32); and from
// one more graphed replay whose kernels stamp %globaltimer per CTA (entry,
// after the first data step, after the meet, exit), GPU 0's medians over
// launches of the gap between launches, the launch's duration, the spread
// of its CTAs' starts and each step's time.
//
// Build and run on the GPU machine (as `benches/results/raw/2026-11-27-h200x2-moe-stages/call5/run17d.sh` did):
//   nvcc -O3 -arch=sm_90 -o allreduce_floor allreduce_floor.cu && ./allreduce_floor [variant ...]
#include <cuda_runtime.h>

#include "floor_common.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

struct Side {
    const float4* in;       // this GPU's input
    const float4* peer_in;  // the peer's input (mapped)
    float4* out;            // this GPU's output
    float4* peer_out;       // the peer's output (mapped)
    float4* stage;          // this GPU's staging: 4 areas of `area` vectors
    float4* peer_stage;     // the peer's staging (mapped)
    uint64_t* flags;        // this GPU's flags, one per CTA (osw: per warp of the grid)
    uint64_t* peer_flags;   // the peer's
    uint64_t* stamps;       // null, or [launch][cta][4] %globaltimer stamps
    int rank;               // 0 or 1
    int vecs;               // float4 vectors in all
    int area;               // vectors per staging area
};

// The variants (see the header).
enum Variant { PULL = 0, PUSH = 1, OS = 2, OSR = 3, TS = 4, OSW = 5, OSC = 6, VARIANTS = 7 };
static const char* kVariantName[VARIANTS] = {"pull", "push", "os", "osr", "ts", "osw", "osc"};

// Vectors each thread of `osc` keeps in flight (devcomm's `UNROLL`).
constexpr int kUnroll = 4;

// CTA b meets CTA b of the peer at `epoch`.
__device__ __forceinline__ void meet(const Side& s, uint64_t epoch) {
    __syncthreads();
    if (threadIdx.x == 0) {
        st_release_sys(&s.peer_flags[blockIdx.x], epoch);
        while (ld_acquire_sys(&s.flags[blockIdx.x]) < epoch) {
        }
    }
    __syncthreads();
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// Stamp `k` of this CTA for launch `launch` (thread 0), when stamping.
__device__ __forceinline__ void stamp(const Side& s, int launch, int k) {
    if (s.stamps && threadIdx.x == 0) s.stamps[((size_t)launch * gridDim.x + blockIdx.x) * 4 + k] = globaltimer();
}

// Vectors per thread the `osr` variant keeps in registers.
constexpr int kRegVecs = 8;

// All-reduce number `iter` (0, 1, ...: its staging parity), meeting at
// epochs `epoch`, `epoch + 1`, `epoch + 2`. Stamps: entry, after the
// first data step, after the (first) meet, exit.
template <int V>
__device__ __forceinline__ void one(const Side& s, uint64_t epoch, int iter, int launch) {
    int half = s.vecs / 2;
    int lo = s.rank == 0 ? 0 : half, hi = s.rank == 0 ? half : s.vecs;
    int plo = s.rank == 0 ? half : 0, phi = s.rank == 0 ? s.vecs : half;
    int t = blockIdx.x * blockDim.x + threadIdx.x, n = gridDim.x * blockDim.x;
    int par = iter & 1;
    stamp(s, launch, 0);
    if (V == PULL) {
        meet(s, epoch);
        stamp(s, launch, 1);
        stamp(s, launch, 2);
        for (int i = lo + t; i < hi; i += n) {
            float4 c = add4(s.in[i], s.peer_in[i]);
            s.out[i] = c;
            s.peer_out[i] = c;
        }
        meet(s, epoch + 2);
    } else if (V == PUSH) {
        meet(s, epoch);
        for (int i = plo + t; i < phi; i += n) s.peer_stage[i] = s.in[i];
        stamp(s, launch, 1);
        meet(s, epoch + 1);
        stamp(s, launch, 2);
        for (int i = lo + t; i < hi; i += n) {
            float4 c = add4(s.in[i], s.stage[i]);
            s.out[i] = c;
            s.peer_out[i] = c;
        }
        meet(s, epoch + 2);
    } else if (V == OS) {
        // devcomm's pushed one-shot on two ranks: the whole input into the
        // peer's staging area of this call's parity, one meet, the sum
        // computed locally; no closing meet (the parity keeps the next
        // call's pushes off the area the peer may still read).
        float4* mine = s.stage + (size_t)par * s.area;
        float4* theirs = s.peer_stage + (size_t)par * s.area;
        for (int i = t; i < s.vecs; i += n) theirs[i] = s.in[i];
        stamp(s, launch, 1);
        meet(s, epoch);
        stamp(s, launch, 2);
        for (int i = t; i < s.vecs; i += n) s.out[i] = add4(s.in[i], mine[i]);
    } else if (V == OSR) {
        // As `os`, the input kept in registers across the meet.
        float4* mine = s.stage + (size_t)par * s.area;
        float4* theirs = s.peer_stage + (size_t)par * s.area;
        float4 x[kRegVecs];
#pragma unroll
        for (int j = 0; j < kRegVecs; ++j) {
            int i = t + j * n;
            if (i < s.vecs) x[j] = s.in[i];
        }
#pragma unroll
        for (int j = 0; j < kRegVecs; ++j) {
            int i = t + j * n;
            if (i < s.vecs) theirs[i] = x[j];
        }
        stamp(s, launch, 1);
        meet(s, epoch);
        stamp(s, launch, 2);
#pragma unroll
        for (int j = 0; j < kRegVecs; ++j) {
            int i = t + j * n;
            if (i < s.vecs) s.out[i] = add4(x[j], mine[i]);
        }
    } else if (V == OSC) {
        // CTA b's contiguous range [b0, b1) of the vectors, devcomm's
        // `part_range`; 4 vectors per thread in flight.
        float4* mine = s.stage + (size_t)par * s.area;
        float4* theirs = s.peer_stage + (size_t)par * s.area;
        int per = (s.vecs + gridDim.x - 1) / gridDim.x;
        int b0 = min(s.vecs, (int)blockIdx.x * per), b1 = min(s.vecs, b0 + per);
        for (int base = b0 + threadIdx.x; base < b1; base += kUnroll * blockDim.x) {
            float4 v[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                int i = base + u * blockDim.x;
                if (i < b1) v[u] = s.in[i];
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                int i = base + u * blockDim.x;
                if (i < b1) theirs[i] = v[u];
            }
        }
        stamp(s, launch, 1);
        meet(s, epoch);
        stamp(s, launch, 2);
        for (int base = b0 + threadIdx.x; base < b1; base += kUnroll * blockDim.x) {
            float4 a[kUnroll], b[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                int i = base + u * blockDim.x;
                if (i < b1) a[u] = s.in[i];
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                int i = base + u * blockDim.x;
                if (i < b1) b[u] = mine[i];
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                int i = base + u * blockDim.x;
                if (i < b1) s.out[i] = add4(a[u], b[u]);
            }
        }
    } else if (V == OSW) {
        // os with a flag per warp of the grid: warp `gw`'s vectors are its
        // 32 threads' (the same mapping on both GPUs), so the peer's warp
        // `gw` sums exactly what this one stored.
        float4* mine = s.stage + (size_t)par * s.area;
        float4* theirs = s.peer_stage + (size_t)par * s.area;
        for (int i = t; i < s.vecs; i += n) theirs[i] = s.in[i];
        __syncwarp();
        int gw = t / 32;
        if ((threadIdx.x & 31) == 0) st_release_sys(&s.peer_flags[gw], epoch);
        stamp(s, launch, 1);
        if ((threadIdx.x & 31) == 0)
            while (ld_acquire_sys(&s.flags[gw]) < epoch) {
            }
        __syncwarp();
        stamp(s, launch, 2);
        for (int i = t; i < s.vecs; i += n) s.out[i] = add4(s.in[i], mine[i]);
    } else {
        // devcomm's pushed two-shot: the peer's shard into its input area,
        // meet, reduce the own shard into the output and the peer's result
        // area, meet, copy the peer's shard out; no closing meet.
        float4* in_mine = s.stage + (size_t)par * s.area;
        float4* in_theirs = s.peer_stage + (size_t)par * s.area;
        float4* res_mine = s.stage + (size_t)(2 + par) * s.area;
        float4* res_theirs = s.peer_stage + (size_t)(2 + par) * s.area;
        for (int i = plo + t; i < phi; i += n) in_theirs[i] = s.in[i];
        stamp(s, launch, 1);
        meet(s, epoch);
        stamp(s, launch, 2);
        for (int i = lo + t; i < hi; i += n) {
            float4 c = add4(s.in[i], in_mine[i]);
            s.out[i] = c;
            res_theirs[i] = c;
        }
        meet(s, epoch + 1);
        for (int i = plo + t; i < phi; i += n) s.out[i] = res_mine[i];
    }
    if (s.stamps) __syncthreads();
    stamp(s, launch, 3);
}

// `iters` all-reduces from number `iter0` (epochs 3 apart).
template <int V>
__global__ void __launch_bounds__(512) allreduce(Side s, uint64_t epoch0, int iter0, int iters) {
    for (int k = 0; k < iters; ++k) one<V>(s, epoch0 + 3 * (uint64_t)k, iter0 + k, iter0 + k);
}

static void launch_variant(int v, int ctas, cudaStream_t st, const Side& s, uint64_t epoch, int iter0, int n) {
    switch (v) {
        case PULL: allreduce<PULL><<<ctas, 512, 0, st>>>(s, epoch, iter0, n); break;
        case PUSH: allreduce<PUSH><<<ctas, 512, 0, st>>>(s, epoch, iter0, n); break;
        case OS: allreduce<OS><<<ctas, 512, 0, st>>>(s, epoch, iter0, n); break;
        case OSR: allreduce<OSR><<<ctas, 512, 0, st>>>(s, epoch, iter0, n); break;
        case OSW: allreduce<OSW><<<ctas, 512, 0, st>>>(s, epoch, iter0, n); break;
        case OSC: allreduce<OSC><<<ctas, 256, 0, st>>>(s, epoch, iter0, n); break;
        default: allreduce<TS><<<ctas, 512, 0, st>>>(s, epoch, iter0, n); break;
    }
}

int main(int argc, char** argv) {
    // Optional arguments: the variants to run (default all).
    auto wanted = [&](int v) { return variant_wanted(argc, argv, kVariantName[v]); };
    std::string gpu = open_two_gpus("allreduce_floor");
    printf("# allreduce_floor: 2 x %s, plain CUDA all-reduce of floats (sum) on two GPUs, one process, peer access\n",
           gpu.c_str());
    printf("# pull: meet, read the peer's shard, store the sum to both outputs, meet\n");
    printf("# push: meet, store the peer's shard into its staging, meet, sum, store to both, meet\n");
    printf("# os: devcomm's pushed one-shot (2 ranks): whole input into the peer's staging (parity area), meet, local sum; no closing meet\n");
    printf("# osr: os with the input held in registers across the meet\n");
    printf("# osw: os with a flag per warp instead of the CTA's meet\n");
    printf("# osc: os with devcomm's layout: a contiguous range per CTA, 256 threads, 4 vectors in flight each\n");
    printf("# ts: devcomm's pushed two-shot: shard to the peer, meet, sum to own output + peer's result area, meet, copy out; no closing meet\n");
    printf("# stamps (GPU 0, a separate graphed replay with %%globaltimer stamps, medians over launches, us):\n");
    printf("#   gap = first CTA start - last CTA end of the previous launch; dur = last end - first start;\n");
    printf("#   spread = last start - first start; step1 = entry -> after the first data step; meet = -> after the meet; rest = -> exit\n");
    printf("#    bytes variant ctas | graphed_us in_kernel_us | #wrong | gap dur spread step1 meet rest\n");
    const size_t max_bytes = 8u << 20;
    const int max_ctas = 128;
    const int iters = 200, reps = 7;
    float4 *in[2], *out[2], *stage[2];
    uint64_t *flags[2], *stamps[2];
    std::vector<float> h0(max_bytes / 4), h1(max_bytes / 4);
    srand(7);
    for (size_t i = 0; i < h0.size(); ++i) {
        h0[i] = (float)(rand() % 2001 - 1000) / 64.0f;
        h1[i] = (float)(rand() % 2001 - 1000) / 64.0f;
    }
    const size_t stamp_words = (size_t)iters * max_ctas * 4;
    cudaStream_t st[2];
    for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaMalloc(&in[d], max_bytes));
        CK(cudaMalloc(&out[d], max_bytes));
        CK(cudaMalloc(&stage[d], 4 * max_bytes));
        CK(cudaMalloc(&flags[d], max_ctas * 16 * sizeof(uint64_t)));
        CK(cudaMalloc(&stamps[d], stamp_words * sizeof(uint64_t)));
        CK(cudaMemcpy(in[d], d == 0 ? h0.data() : h1.data(), max_bytes, cudaMemcpyHostToDevice));
        CK(cudaStreamCreateWithFlags(&st[d], cudaStreamNonBlocking));
    }
    std::vector<uint64_t> hs(stamp_words);
    for (size_t bytes : {512u << 10, 2u << 20, 8u << 20}) {
        for (int v = 0; v < VARIANTS; ++v) {
            if (!wanted(v)) continue;
            if (v == OSR && bytes / 16 > (size_t)kRegVecs * 64 * 512) continue;  // registers hold it at >= 64 CTAs only
            for (int ctas : {64, 128}) {
                Side side[2];
                for (int d = 0; d < 2; ++d) {
                    side[d] = Side{in[d], in[1 - d], out[d], out[1 - d], stage[d], stage[1 - d], flags[d],
                                   flags[1 - d], nullptr, d, (int)(bytes / 16), (int)(max_bytes / 16)};
                    CK(cudaSetDevice(d));
                    CK(cudaMemset(flags[d], 0, max_ctas * 16 * sizeof(uint64_t)));
                    CK(cudaMemset(out[d], 0xff, bytes));
                    CK(cudaDeviceSynchronize());
                }
                // Graphs: `iters` launches each, epochs and numbers baked in
                // at capture; the flags are reset before every replay. One
                // graph per GPU as timed, one with stamps.
                cudaGraphExec_t exec[2][2];
                for (int stamped = 0; stamped < 2; ++stamped) {
                    for (int d = 0; d < 2; ++d) {
                        CK(cudaSetDevice(d));
                        Side sd = side[d];
                        sd.stamps = stamped ? stamps[d] : nullptr;
                        cudaGraph_t g;
                        CK(cudaStreamBeginCapture(st[d], cudaStreamCaptureModeThreadLocal));
                        for (int k = 0; k < iters; ++k) launch_variant(v, ctas, st[d], sd, 1 + 3 * (uint64_t)k, k, 1);
                        CK(cudaStreamEndCapture(st[d], &g));
                        CK(cudaGraphInstantiate(&exec[stamped][d], g, 0));
                        CK(cudaGraphDestroy(g));
                    }
                }
                cudaEvent_t ev[2][2];
                for (int d = 0; d < 2; ++d) {
                    CK(cudaSetDevice(d));
                    CK(cudaEventCreate(&ev[d][0]));
                    CK(cudaEventCreate(&ev[d][1]));
                }
                // One replay (graphed: `kernel` false) or one long launch;
                // the later GPU's time per all-reduce in us.
                auto timed = [&](bool kernel, int stamped) {
                    for (int d = 0; d < 2; ++d) {
                        CK(cudaSetDevice(d));
                        CK(cudaMemsetAsync(flags[d], 0, max_ctas * 16 * sizeof(uint64_t), st[d]));
                        CK(cudaStreamSynchronize(st[d]));
                    }
                    for (int d = 0; d < 2; ++d) {
                        CK(cudaSetDevice(d));
                        CK(cudaEventRecord(ev[d][0], st[d]));
                        if (kernel)
                            launch_variant(v, ctas, st[d], side[d], 1, 0, iters);
                        else
                            CK(cudaGraphLaunch(exec[stamped][d], st[d]));
                        CK(cudaEventRecord(ev[d][1], st[d]));
                    }
                    float worst = 0;
                    for (int d = 0; d < 2; ++d) {
                        CK(cudaSetDevice(d));
                        CK(cudaStreamSynchronize(st[d]));
                        CK(cudaGetLastError());
                        float ms;
                        CK(cudaEventElapsedTime(&ms, ev[d][0], ev[d][1]));
                        worst = std::max(worst, ms);
                    }
                    return worst * 1e3 / iters;
                };
                std::vector<double> tg, tk;
                for (int r = 0; r < reps + 1; ++r) {
                    double t = timed(false, 0);
                    if (r > 0) tg.push_back(t);
                }
                for (int r = 0; r < reps + 1; ++r) {
                    double t = timed(true, 0);
                    if (r > 0) tk.push_back(t);
                }
                size_t wrong = 0;
                std::vector<float> got(bytes / 4);
                for (int d = 0; d < 2; ++d) {
                    CK(cudaSetDevice(d));
                    CK(cudaMemcpy(got.data(), out[d], bytes, cudaMemcpyDeviceToHost));
                    for (size_t i = 0; i < got.size(); ++i)
                        if (got[i] != h0[i] + h1[i]) ++wrong;
                }
                // The stamped replay: GPU 0's stamps, launches 1.. (launch 0
                // has no predecessor).
                timed(false, 1);
                CK(cudaSetDevice(0));
                CK(cudaMemcpy(hs.data(), stamps[0], (size_t)iters * ctas * 4 * sizeof(uint64_t), cudaMemcpyDeviceToHost));
                std::vector<double> gap, dur, spread, s1, s2, s3;
                // Stamps relative to the first one (doubles lose nanoseconds
                // at %globaltimer's magnitude).
                const uint64_t base = hs[0];
                auto at = [&](int l, int b, int k) { return (double)(int64_t)(hs[((size_t)l * ctas + b) * 4 + k] - base); };
                for (int l = 1; l < iters; ++l) {
                    double first = 1e300, last_start = -1e300, last_end = -1e300, prev_end = -1e300;
                    std::vector<double> a, b2, c;
                    for (int b = 0; b < ctas; ++b) {
                        first = std::min(first, at(l, b, 0));
                        last_start = std::max(last_start, at(l, b, 0));
                        last_end = std::max(last_end, at(l, b, 3));
                        prev_end = std::max(prev_end, at(l - 1, b, 3));
                        a.push_back(at(l, b, 1) - at(l, b, 0));
                        b2.push_back(at(l, b, 2) - at(l, b, 1));
                        c.push_back(at(l, b, 3) - at(l, b, 2));
                    }
                    gap.push_back(first - prev_end);
                    dur.push_back(last_end - first);
                    spread.push_back(last_start - first);
                    s1.push_back(median(a));
                    s2.push_back(median(b2));
                    s3.push_back(median(c));
                }
                printf("%10zu %7s %4d | %10.2f %12.2f | %zu | %5.2f %5.2f %5.2f %5.2f %5.2f %5.2f\n", bytes,
                       kVariantName[v], ctas, median(tg), median(tk), wrong, median(gap) / 1e3, median(dur) / 1e3,
                       median(spread) / 1e3, median(s1) / 1e3, median(s2) / 1e3, median(s3) / 1e3);
                fflush(stdout);
                for (int d = 0; d < 2; ++d) {
                    CK(cudaSetDevice(d));
                    CK(cudaGraphExecDestroy(exec[0][d]));
                    CK(cudaGraphExecDestroy(exec[1][d]));
                    CK(cudaEventDestroy(ev[d][0]));
                    CK(cudaEventDestroy(ev[d][1]));
                }
            }
        }
    }
    return 0;
}
