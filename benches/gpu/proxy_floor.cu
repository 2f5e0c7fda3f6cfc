// Floors of a CPU proxy's landing paths between two GPUs of one host, in
// plain CUDA C++ (no devcomm): what each way of landing an 8-byte put and
// its signal costs from the moment a proxy thread acts to the moment a
// kernel on the other GPU has seen the signal and the data.
//
// GPU1 runs a responder (one thread): for round i it waits until the
// signal reads i (host-pinned word or its own device word, by variant),
// checks that the data word reads i, and writes i to a host-pinned ack
// word. The CPU thread (the "proxy") lands round i by the variant's path
// and spins on the ack. Reported: median round time (proxy acts -> ack
// seen), and the CPU time of the driver calls. The ack path is the same in
// every variant, so differences between variants are what the landing path
// costs.
//
// Build and run on the GPU machine (benches/gpu/gin.sh does both):
//   nvcc -O2 -arch=sm_90 -o proxy_floor proxy_floor.cu -lcuda && ./proxy_floor
#include <cuda.h>
#include <cuda_runtime.h>

#include "floor_common.cuh"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

// slots > 1: the signal is the sum of `slots` words at `sig` (one per writer).
__global__ void responder(const uint64_t* sig, int slots, const uint64_t* data, uint64_t* ack, int rounds,
                          uint64_t* bad) {
    // data == nullptr: a variant without data (only the signal travels)
    for (int i = 1; i <= rounds; i++) {
        uint64_t want = (uint64_t)i;
        for (;;) {
            uint64_t s = 0;
            if (slots == 1) {
                s = ld_acquire_sys(sig);
            } else {
                // All loads first (they travel together), then the sum.
                uint64_t w[8];
#pragma unroll
                for (int k = 0; k < 8; k++) w[k] = k < slots ? ld_relaxed_sys(sig + k) : 0;
#pragma unroll
                for (int k = 0; k < 8; k++) s += w[k];
                if (s >= want) asm volatile("fence.acq_rel.sys;" ::: "memory");
            }
            if (s >= want) break;
        }
        if (data && ld_relaxed_sys(data) != want) atomicAdd((unsigned long long*)bad, 1ull);
        st_release_sys(ack, want);
    }
}

static double now_us() {
    using namespace std::chrono;
    return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Background load for the "under load" table: lane 0 of every warp loops
// until `ms` have passed, each turn napping `nap_ns` and then (kind 1)
// loading a device word, (2) loading a host word, (3) storing a 64-byte
// descriptor-like line to host memory as four 16-byte stores.
__global__ void load_kernel(int kind, int nap_ns, uint64_t* dev_words, uint64_t* host_words, int ms, uint64_t* sink) {
    uint64_t end = global_ns() + (uint64_t)ms * 1000000ull;
    uint64_t acc = 0;
    unsigned w = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (threadIdx.x % 32 != 0) return;
    while (global_ns() < end) {
        for (int i = 0; i < 16; i++) {
            __nanosleep(nap_ns);
            if (kind == 1) acc += ld_relaxed_sys(dev_words + w % 512);
            if (kind == 2) acc += ld_relaxed_sys(host_words + 8 * (w % 64));
            if (kind == 3) {
                uint64_t* line = host_words + 8 * (w % 64);
                for (int k = 0; k < 4; k++)
                    asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(line + 2 * k), "l"(acc), "l"(acc + k)
                                 : "memory");
            }
        }
    }
    if (acc == 42) *sink = acc;
}

static double pct(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v[(size_t)(p * (v.size() - 1))];
}

// Latency of [8-byte stream write + fence write to host] (proxy acts ->
// fence seen) while both GPUs run a background load kernel.
static void under_load(uint64_t* host, cudaStream_t s0, uint64_t* d0_data, uint64_t* d1_data) {
    auto A = [](uint64_t* p) { return reinterpret_cast<std::atomic<uint64_t>*>(p); };
    uint64_t* h_fence = host + 32;
    uint64_t* h_load = host + 64;  // 512 words for the load kernels
    void* p;
    CK(cudaHostGetDevicePointer(&p, h_fence, 0));
    CUdeviceptr dev_fence = (CUdeviceptr)p;
    uint64_t* dh_load;
    CK(cudaHostGetDevicePointer((void**)&dh_load, h_load, 0));
    uint64_t *lw[2], *sink[2];
    cudaStream_t ls[2];
    for (int d = 0; d < 2; d++) {
        CK(cudaSetDevice(d));
        CK(cudaMalloc(&lw[d], 512 * 8));
        CK(cudaMemset(lw[d], 0, 512 * 8));
        CK(cudaMalloc(&sink[d], 8));
        CK(cudaStreamCreateWithFlags(&ls[d], cudaStreamNonBlocking));
    }
    CK(cudaSetDevice(0));
    struct Load {
        const char* name;
        int kind, nap;
    } loads[] = {{"idle", 0, 0},
                 {"device load / 1 us", 1, 1000},
                 {"host load / 100 us", 2, 100000},
                 {"host load / 10 us", 2, 10000},
                 {"host load / 1 us", 2, 1000},
                 {"host 64B store / 100 us", 3, 100000},
                 {"host 64B store / 10 us", 3, 10000},
                 {"host 64B store / 1 us", 3, 1000}};
    printf("\n# [8 B stream write + fence to host] latency (us) while both GPUs run 64 x 128 threads,\n"
           "# lane 0 of each of the 256 warps loading or storing host memory once per nap\n");
    printf("%-24s %-12s %9s %9s %9s %7s\n", "load (per warp)", "target", "median", "p90", "max", "rounds");
    uint64_t fence = A(h_fence)->load();
    for (const Load& L : loads) {
        for (int target = 0; target < 3; target++) {
            const int ms = 200;
            if (L.kind > 0) {
                for (int d = 0; d < 2; d++) {
                    CK(cudaSetDevice(d));
                    load_kernel<<<64, 128, 0, ls[d]>>>(L.kind, L.nap, lw[d], dh_load, ms, sink[d]);
                    CK(cudaGetLastError());
                }
                CK(cudaSetDevice(0));
            }
            double start = now_us();
            std::vector<double> lat;
            while (lat.size() < 2000 && now_us() - start < ms * 1000.0 * 0.8) {
                fence++;
                double t0 = now_us();
                CUdeviceptr dst = (CUdeviceptr)(target == 0 ? d0_data : d1_data);
                if (target == 2) {
                    CK(cudaMemcpyAsync(d1_data, d0_data + 8, 8, cudaMemcpyDeviceToDevice, s0));
                    CU(cuStreamWriteValue64((CUstream)s0, dev_fence, fence, CU_STREAM_WRITE_VALUE_DEFAULT));
                } else {
                    CUstreamBatchMemOpParams ops[2] = {};
                    ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
                    ops[0].writeValue.address = dst;
                    ops[0].writeValue.value64 = fence;
                    ops[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
                    ops[1].writeValue.address = dev_fence;
                    ops[1].writeValue.value64 = fence;
                    CU(cuStreamBatchMemOp((CUstream)s0, 2, ops, 0));
                }
                bool late = false;
                while (A(h_fence)->load(std::memory_order_acquire) < fence) {
                    if (now_us() - t0 > 1e6) {
                        late = true;
                        break;
                    }
                }
                lat.push_back(now_us() - t0);
                if (late) {
                    printf("#   fence %llu not seen after 1 s\n", (unsigned long long)fence);
                    break;
                }
            }
            const char* tn[] = {"own GPU", "peer GPU", "peer, copy"};
            printf("%-24s %-12s %9.2f %9.2f %9.2f %7zu\n", L.name, tn[target], pct(lat, 0.5), pct(lat, 0.9),
                   pct(lat, 1.0), lat.size());
            for (int d = 0; d < 2; d++) {
                CK(cudaSetDevice(d));
                CK(cudaDeviceSynchronize());
            }
            CK(cudaSetDevice(0));
            while (A(h_fence)->load(std::memory_order_acquire) < fence) {
            }
        }
    }
}

// Throughput of gathered stream writes (each with a memory barrier, as the
// driver requires for peer memory) and of one copy carrying the same bytes,
// own GPU vs peer GPU, idle: us per 8-byte value.
static void write_throughput(uint64_t* host, cudaStream_t s0, uint64_t* d0_data, uint64_t* d1_data) {
    auto A = [](uint64_t* p) { return reinterpret_cast<std::atomic<uint64_t>*>(p); };
    uint64_t* h_fence = host + 32;
    void* p;
    CK(cudaHostGetDevicePointer(&p, h_fence, 0));
    CUdeviceptr dev_fence = (CUdeviceptr)p;
    uint64_t* src;
    CK(cudaMalloc(&src, 4096));
    printf("\n# 64 x 8-byte values then a fence, idle GPUs: us per value (median of 200 batches)\n");
    printf("%-40s %9s %9s\n", "how", "own GPU", "peer GPU");
    uint64_t fence = A(h_fence)->load();
    const char* hows[] = {"stream writes, barrier each (one call)", "stream writes, no barrier (one call)",
                          "one 512-byte copy"};
    for (int how = 0; how < 3; how++) {
        double res[2] = {0, 0};
        for (int target = 0; target < 2; target++) {
            uint64_t* dst = target == 0 ? d0_data : d1_data;
            std::vector<double> per;
            bool refused = false;
            for (int r = 0; r < 220 && !refused; r++) {
                fence++;
                double t0 = now_us();
                if (how == 2) {
                    CK(cudaMemcpyAsync(dst, src, 512, cudaMemcpyDeviceToDevice, s0));
                    CU(cuStreamWriteValue64((CUstream)s0, dev_fence, fence, CU_STREAM_WRITE_VALUE_DEFAULT));
                } else {
                    CUstreamBatchMemOpParams ops[65] = {};
                    for (int k = 0; k < 65; k++) {
                        ops[k].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
                        ops[k].writeValue.address = k < 64 ? (CUdeviceptr)(dst + k) : dev_fence;
                        ops[k].writeValue.value64 = k < 64 ? fence + k : fence;
                        ops[k].writeValue.flags =
                            (how == 1 && k < 64) ? CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER : CU_STREAM_WRITE_VALUE_DEFAULT;
                    }
                    if (cuStreamBatchMemOp((CUstream)s0, 65, ops, 0) != CUDA_SUCCESS) {
                        refused = true;
                        fence--;
                        break;
                    }
                }
                while (A(h_fence)->load(std::memory_order_acquire) < fence) {
                }
                if (r >= 20) per.push_back((now_us() - t0) / 64);
            }
            res[target] = refused ? -1 : pct(per, 0.5);
        }
        auto fmt = [](double v, char* b) {
            if (v < 0)
                snprintf(b, 32, "refused");
            else
                snprintf(b, 32, "%.3f", v);
        };
        char a[32], b[32];
        fmt(res[0], a);
        fmt(res[1], b);
        printf("%-40s %9s %9s\n", hows[how], a, b);
    }
}

int main() {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    const int rounds = 3000, warm = 300;
    int n = 0;
    CK(cudaGetDeviceCount(&n));
    if (n < 2) {
        fprintf(stderr, "needs 2 GPUs\n");
        return 1;
    }
    CK(cudaSetDevice(1));
    CK(cudaDeviceEnablePeerAccess(0, 0));
    uint64_t *d1_data, *d1_sig, *d1_bad;
    CK(cudaMalloc(&d1_data, 4096));
    CK(cudaMalloc(&d1_sig, 4096));
    CK(cudaMalloc(&d1_bad, 8));
    cudaStream_t s1;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaSetDevice(0));
    CK(cudaDeviceEnablePeerAccess(1, 0));
    cudaStream_t s0;
    CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    // Host words: signal slots (line 0), ack (line 1), fence (line 2), staging (line 3).
    uint64_t* host;
    CK(cudaHostAlloc((void**)&host, 16384, cudaHostAllocMapped | cudaHostAllocPortable));
    uint64_t* h_sig = host;
    uint64_t* h_ack = host + 16;
    uint64_t* h_fence = host + 32;
    uint64_t* h_stage = host + 48;
    uint64_t* dh_sig;
    uint64_t* dh_ack;
    CK(cudaHostGetDevicePointer((void**)&dh_sig, h_sig, 0));
    CK(cudaHostGetDevicePointer((void**)&dh_ack, h_ack, 0));
    CUdeviceptr dev_fence = (CUdeviceptr)(uintptr_t)0, dev_hsig = 0;
    {
        void* p;
        CK(cudaHostGetDevicePointer(&p, h_fence, 0));
        dev_fence = (CUdeviceptr)p;
        CK(cudaHostGetDevicePointer(&p, h_sig, 0));
        dev_hsig = (CUdeviceptr)p;
    }
    auto A = [](uint64_t* p) { return reinterpret_cast<std::atomic<uint64_t>*>(p); };

    printf("# proxy landing floors, GPU0 proxy stream -> kernel on GPU1 (one process, peer access)\n");
    printf("# round = proxy acts .. GPU1 saw signal + data and its ack reached the CPU; call = CPU time in driver calls\n");
    printf("%-58s %9s %9s %9s\n", "variant", "round_us", "p90_us", "call_us");

    enum Variant { CPU_SIGNAL, MEMOP_SIG_ONLY, FENCED, MEMOP_HOST_SIG, MEMOP_HOST_SIG8, MEMOP_DEV_SIG, MEMOP_HOST_SIG_NOBAR, COPY_HOST_SIG, FENCED_2CALLS };
    const char* names[] = {
        "cpu store to host signal (no data; PCIe floor)",
        "memop signal (host word) only, no data",
        "today: memop data+fence; cpu sees fence; cpu host signal",
        "memop data + memop signal (host word), one call",
        "as above, signal = sum of 8 host words (writer's slot)",
        "memop data + memop signal (GPU1 word), one call",
        "memop data (no barrier) + memop signal (host), one call",
        "memcpy HtoD data + memop signal (host)",
        "memop data, memop fence as 2 calls; cpu host signal",
    };
    for (int v = CPU_SIGNAL; v <= FENCED_2CALLS; v++) {
        memset(host, 0, 4096);
        CK(cudaSetDevice(1));
        CK(cudaMemset(d1_data, 0, 4096));
        CK(cudaMemset(d1_sig, 0, 4096));
        CK(cudaMemset(d1_bad, 0, 8));
        CK(cudaDeviceSynchronize());
        bool dev_sig = v == MEMOP_DEV_SIG;
        responder<<<1, 1, 0, s1>>>(dev_sig ? d1_sig : dh_sig, v == MEMOP_HOST_SIG8 ? 8 : 1, v == CPU_SIGNAL || v == MEMOP_SIG_ONLY ? nullptr : d1_data, dh_ack, rounds,
                                   d1_bad);
        CK(cudaGetLastError());
        CK(cudaSetDevice(0));
        std::vector<double> rt, call;
        bool refused = false;
        for (int i = 1; i <= rounds && !refused; i++) {
            uint64_t val = (uint64_t)i;
            double t0 = now_us(), tc = 0;
            CUstreamBatchMemOpParams ops[3] = {};
            auto wr = [&](int k, CUdeviceptr addr, uint64_t x, unsigned flags) {
                ops[k].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
                ops[k].writeValue.address = addr;
                ops[k].writeValue.value64 = x;
                ops[k].writeValue.flags = flags;
            };
            switch (v) {
            case CPU_SIGNAL:
                A(h_sig)->store(val, std::memory_order_release);
                break;
            case MEMOP_SIG_ONLY:
                wr(0, dev_hsig, val, CU_STREAM_WRITE_VALUE_DEFAULT);
                CU(cuStreamBatchMemOp((CUstream)s0, 1, ops, 0));
                tc = now_us() - t0;
                break;
            case FENCED: {
                wr(0, (CUdeviceptr)d1_data, val, CU_STREAM_WRITE_VALUE_DEFAULT);
                wr(1, dev_fence, val, CU_STREAM_WRITE_VALUE_DEFAULT);
                CU(cuStreamBatchMemOp((CUstream)s0, 2, ops, 0));
                tc = now_us() - t0;
                while (A(h_fence)->load(std::memory_order_acquire) < val) {
                }
                A(h_sig)->fetch_add(1, std::memory_order_seq_cst);
                break;
            }
            case FENCED_2CALLS: {
                CU(cuStreamWriteValue64((CUstream)s0, (CUdeviceptr)d1_data, val, CU_STREAM_WRITE_VALUE_DEFAULT));
                CU(cuStreamWriteValue64((CUstream)s0, dev_fence, val, CU_STREAM_WRITE_VALUE_DEFAULT));
                tc = now_us() - t0;
                while (A(h_fence)->load(std::memory_order_acquire) < val) {
                }
                A(h_sig)->fetch_add(1, std::memory_order_seq_cst);
                break;
            }
            case MEMOP_HOST_SIG:
            case MEMOP_HOST_SIG8:
            case MEMOP_DEV_SIG: {
                // The signal: the host word, the writer's slot 3 of 8 host words, or GPU1's word.
                CUdeviceptr sig = v == MEMOP_DEV_SIG ? (CUdeviceptr)d1_sig : dev_hsig + (v == MEMOP_HOST_SIG8 ? 3 * 8 : 0);
                wr(0, (CUdeviceptr)d1_data, val, CU_STREAM_WRITE_VALUE_DEFAULT);
                wr(1, sig, val, CU_STREAM_WRITE_VALUE_DEFAULT);
                CU(cuStreamBatchMemOp((CUstream)s0, 2, ops, 0));
                tc = now_us() - t0;
                break;
            }
            case MEMOP_HOST_SIG_NOBAR: {
                wr(0, (CUdeviceptr)d1_data, val, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER);
                wr(1, dev_hsig, val, CU_STREAM_WRITE_VALUE_DEFAULT);
                CUresult r = cuStreamBatchMemOp((CUstream)s0, 2, ops, 0);
                if (r != CUDA_SUCCESS) {
                    printf("%-58s refused by the driver (%d)\n", names[v], (int)r);
                    refused = true;
                    A(h_sig)->store(rounds, std::memory_order_release);  // let the responder run out
                    CU(cuStreamWriteValue64((CUstream)s0, (CUdeviceptr)d1_data, rounds, 0));
                    continue;
                }
                tc = now_us() - t0;
                break;
            }
            case COPY_HOST_SIG:
                h_stage[i % 8] = val;
                CK(cudaMemcpyAsync(d1_data, &h_stage[i % 8], 8, cudaMemcpyHostToDevice, s0));
                wr(0, dev_hsig, val, CU_STREAM_WRITE_VALUE_DEFAULT);
                CU(cuStreamBatchMemOp((CUstream)s0, 1, ops, 0));
                tc = now_us() - t0;
                break;
            }
            while (A(h_ack)->load(std::memory_order_acquire) < val) {
            }
            double t1 = now_us();
            if (i > warm) {
                rt.push_back(t1 - t0);
                call.push_back(tc);
            }
        }
        CK(cudaSetDevice(1));
        CK(cudaDeviceSynchronize());
        uint64_t bad = 0;
        CK(cudaMemcpy(&bad, d1_bad, 8, cudaMemcpyDeviceToHost));
        CK(cudaSetDevice(0));
        CK(cudaStreamSynchronize(s0));
        if (refused) continue;
        printf("%-58s %9.2f %9.2f %9.2f%s\n", names[v], pct(rt, 0.5), pct(rt, 0.9), pct(call, 0.5),
               bad ? "  DATA NOT VISIBLE WITH ITS SIGNAL" : "");
        if (bad) printf("#   %llu of %d rounds saw the signal before the data\n", (unsigned long long)bad, rounds);
    }
    uint64_t* d0_data;
    CK(cudaMalloc(&d0_data, 4096));
    write_throughput(host, s0, d0_data, d1_data);
    under_load(host, s0, d0_data, d1_data);
    return 0;
}
