// A floor for issue 14's 2 MiB all-reduce goal, in plain CUDA C++ (no
// devcomm): the fastest two-GPU two-shot all-reduce of floats written as
// simply as the hardware allows, timed the way `devcomm-perf --graph`
// times devcomm's (graphed launches back to back, and many all-reduces
// inside one kernel: "in kernel").
//
// One process, two GPUs with peer access. GPU r owns shard r (half the
// vectors). Per all-reduce, each CTA b of each GPU:
//   1. barrier with CTA b of the other GPU (its input is ready),
//   2. variant `pull`: reads its shard of the peer's input over NVLink,
//      adds its own, stores the sum into its own output and the peer's;
//      variant `push`: first stores the peer's shard of its input into the
//      peer's staging buffer, barrier, then adds staging + own input and
//      stores the sum into both outputs (only stores cross NVLink: what
//      devcomm's two-shot does),
//   3. barrier with CTA b of the other GPU (the peer's half of the output
//      is in).
// Barriers: a release store of the epoch into the peer's flag of CTA b,
// an acquire spin on its own (thread 0), `__syncthreads` around.
//
// Reported per size, variant and CTA count: the median over 7 reps of
// (a) graphed: 200 kernel launches captured in one CUDA graph per GPU,
//     time per all-reduce (the later GPU's events),
// (b) in kernel: one launch doing 200 all-reduces, time per all-reduce;
// and #wrong (outputs of both GPUs against in0 + in1, exact in f32).
//
// Build and run on the GPU machine (as `benches/results/raw/2026-11-27-h200x2-moe-stages/call5/run17d.sh` did):
//   nvcc -O3 -arch=sm_90 -o allreduce_floor allreduce_floor.cu && ./allreduce_floor
#include <cuda_runtime.h>

#include "floor_common.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

struct Side {
    const float4* in;       // this GPU's input
    const float4* peer_in;  // the peer's input (mapped)
    float4* out;            // this GPU's output
    float4* peer_out;       // the peer's output (mapped)
    float4* stage;          // this GPU's staging (push)
    float4* peer_stage;     // the peer's staging (mapped)
    uint64_t* flags;        // this GPU's flags, one per CTA
    uint64_t* peer_flags;   // the peer's
    int rank;               // 0 or 1
    int vecs;               // float4 vectors in all
};

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

template <bool PUSH>
__device__ __forceinline__ void one(const Side& s, uint64_t epoch) {
    int half = s.vecs / 2;
    int lo = s.rank == 0 ? 0 : half, hi = s.rank == 0 ? half : s.vecs;
    int plo = s.rank == 0 ? half : 0, phi = s.rank == 0 ? s.vecs : half;
    int t = blockIdx.x * blockDim.x + threadIdx.x, n = gridDim.x * blockDim.x;
    meet(s, epoch);
    if (PUSH) {
        for (int i = plo + t; i < phi; i += n) s.peer_stage[i] = s.in[i];
        meet(s, epoch + 1);
        for (int i = lo + t; i < hi; i += n) {
            float4 a = s.in[i], b = s.stage[i];
            float4 c = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
            s.out[i] = c;
            s.peer_out[i] = c;
        }
    } else {
        for (int i = lo + t; i < hi; i += n) {
            float4 a = s.in[i], b = s.peer_in[i];
            float4 c = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
            s.out[i] = c;
            s.peer_out[i] = c;
        }
    }
    meet(s, epoch + 2);
}

template <bool PUSH>
__global__ void __launch_bounds__(512) allreduce(Side s, uint64_t epoch0, int iters) {
    for (int k = 0; k < iters; ++k) one<PUSH>(s, epoch0 + 3 * (uint64_t)k);
}

int main() {
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    if (ndev < 2) {
        fprintf(stderr, "allreduce_floor: needs 2 GPUs, found %d\n", ndev);
        return 1;
    }
    for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("# allreduce_floor: 2 x %s, plain CUDA two-shot all-reduce of floats (sum), one process, peer access\n",
           prop.name);
    printf("# variant: pull = read the peer's shard, store the sum to both; push = store the peer's shard into its staging, barrier, sum, store to both\n");
    printf("#    bytes variant ctas | graphed_us in_kernel_us | #wrong\n");
    const size_t max_bytes = 8u << 20;
    const int max_ctas = 128;
    float4 *in[2], *out[2], *stage[2];
    uint64_t* flags[2];
    std::vector<float> h0(max_bytes / 4), h1(max_bytes / 4);
    srand(7);
    for (size_t i = 0; i < h0.size(); ++i) {
        h0[i] = (float)(rand() % 2001 - 1000) / 64.0f;
        h1[i] = (float)(rand() % 2001 - 1000) / 64.0f;
    }
    cudaStream_t st[2];
    for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaMalloc(&in[d], max_bytes));
        CK(cudaMalloc(&out[d], max_bytes));
        CK(cudaMalloc(&stage[d], max_bytes));
        CK(cudaMalloc(&flags[d], max_ctas * sizeof(uint64_t)));
        CK(cudaMemcpy(in[d], d == 0 ? h0.data() : h1.data(), max_bytes, cudaMemcpyHostToDevice));
        CK(cudaStreamCreateWithFlags(&st[d], cudaStreamNonBlocking));
    }
    const int iters = 200, reps = 7;
    uint64_t epoch = 1;
    for (size_t bytes : {512u << 10, 2u << 20, 8u << 20}) {
        for (int push = 0; push < 2; ++push) {
            for (int ctas : {32, 64, 128}) {
                Side side[2];
                for (int d = 0; d < 2; ++d) {
                    side[d] = Side{in[d], in[1 - d], out[d], out[1 - d], stage[d], stage[1 - d],
                                   flags[d], flags[1 - d], d, (int)(bytes / 16)};
                    CK(cudaSetDevice(d));
                    CK(cudaMemset(flags[d], 0, max_ctas * sizeof(uint64_t)));
                    CK(cudaMemset(out[d], 0xff, bytes));
                    CK(cudaDeviceSynchronize());
                }
                epoch = 1;
                auto launch = [&](int d, int n) {
                    if (push)
                        allreduce<true><<<ctas, 512, 0, st[d]>>>(side[d], epoch, n);
                    else
                        allreduce<false><<<ctas, 512, 0, st[d]>>>(side[d], epoch, n);
                };
                // Graphs: `iters` launches each, epochs baked in at capture;
                // the flags are reset before every replay.
                cudaGraphExec_t exec[2];
                uint64_t e0 = epoch;
                for (int d = 0; d < 2; ++d) {
                    CK(cudaSetDevice(d));
                    cudaGraph_t g;
                    CK(cudaStreamBeginCapture(st[d], cudaStreamCaptureModeThreadLocal));
                    epoch = e0;
                    for (int k = 0; k < iters; ++k) {
                        launch(d, 1);
                        epoch += 3;
                    }
                    CK(cudaStreamEndCapture(st[d], &g));
                    CK(cudaGraphInstantiate(&exec[d], g, 0));
                    CK(cudaGraphDestroy(g));
                }
                std::vector<double> tg, tk;
                cudaEvent_t ev[2][2];
                for (int d = 0; d < 2; ++d) {
                    CK(cudaSetDevice(d));
                    CK(cudaEventCreate(&ev[d][0]));
                    CK(cudaEventCreate(&ev[d][1]));
                }
                for (int r = 0; r < reps + 1; ++r) {
                    for (int d = 0; d < 2; ++d) {
                        CK(cudaSetDevice(d));
                        CK(cudaMemsetAsync(flags[d], 0, max_ctas * sizeof(uint64_t), st[d]));
                        CK(cudaStreamSynchronize(st[d]));
                    }
                    for (int d = 0; d < 2; ++d) {
                        CK(cudaSetDevice(d));
                        CK(cudaEventRecord(ev[d][0], st[d]));
                        CK(cudaGraphLaunch(exec[d], st[d]));
                        CK(cudaEventRecord(ev[d][1], st[d]));
                    }
                    float worst = 0;
                    for (int d = 0; d < 2; ++d) {
                        CK(cudaSetDevice(d));
                        CK(cudaStreamSynchronize(st[d]));
                        float ms;
                        CK(cudaEventElapsedTime(&ms, ev[d][0], ev[d][1]));
                        worst = std::max(worst, ms);
                    }
                    if (r > 0) tg.push_back(worst * 1e3 / iters);
                }
                for (int r = 0; r < reps + 1; ++r) {
                    for (int d = 0; d < 2; ++d) {
                        CK(cudaSetDevice(d));
                        CK(cudaMemsetAsync(flags[d], 0, max_ctas * sizeof(uint64_t), st[d]));
                        CK(cudaStreamSynchronize(st[d]));
                    }
                    epoch = 1;
                    for (int d = 0; d < 2; ++d) {
                        CK(cudaSetDevice(d));
                        CK(cudaEventRecord(ev[d][0], st[d]));
                        launch(d, iters);
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
                    if (r > 0) tk.push_back(worst * 1e3 / iters);
                }
                size_t wrong = 0;
                std::vector<float> got(bytes / 4);
                for (int d = 0; d < 2; ++d) {
                    CK(cudaSetDevice(d));
                    CK(cudaMemcpy(got.data(), out[d], bytes, cudaMemcpyDeviceToHost));
                    for (size_t i = 0; i < got.size(); ++i)
                        if (got[i] != h0[i] + h1[i]) ++wrong;
                }
                std::sort(tg.begin(), tg.end());
                std::sort(tk.begin(), tk.end());
                printf("%10zu %7s %4d | %10.2f %12.2f | %zu\n", bytes, push ? "push" : "pull", ctas,
                       tg[tg.size() / 2], tk[tk.size() / 2], wrong);
                fflush(stdout);
                for (int d = 0; d < 2; ++d) {
                    CK(cudaSetDevice(d));
                    CK(cudaGraphExecDestroy(exec[d]));
                    CK(cudaEventDestroy(ev[d][0]));
                    CK(cudaEventDestroy(ev[d][1]));
                }
            }
        }
    }
    return 0;
}
