// Shared by the plain-CUDA floor programs here (proxy_floor.cu,
// allreduce_floor.cu, moe_floor.cu, moe_combine_floor.cu, moe_ht_floor.cu): CUDA runtime
// and driver call checkers, VMM memory shared by both GPUs (`vmm_alloc`, as
// devcomm's windows are made), the .sys-scope acquire / relaxed / release accesses their
// waits use, %globaltimer, and the host side's common steps (two GPUs with
// peer access, the variants named on the command line, random top-k
// routing, per-launch stage stamps reduced to medians).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#define CK(x)                                                                          \
    do {                                                                               \
        cudaError_t e_ = (x);                                                          \
        if (e_ != cudaSuccess) {                                                       \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

#define CU(x)                                                                          \
    do {                                                                               \
        CUresult r_ = (x);                                                             \
        if (r_ != CUDA_SUCCESS) {                                                      \
            const char* s_ = nullptr;                                                  \
            cuGetErrorString(r_, &s_);                                                 \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?"); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

// `bytes` of VMM memory on GPU `d` (`cuMemCreate` with a POSIX-fd handle
// type, `cuMemMap`, `cuMemSetAccess`), readable and writable from GPUs
// 0..gpus (default both): the kind of memory devcomm's windows are. Link
// with -lcuda.
static inline void* vmm_alloc(int d, size_t bytes, int gpus = 2) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = d;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    bytes = (bytes + gran - 1) / gran * gran;
    CUmemGenericAllocationHandle h;
    CU(cuMemCreate(&h, bytes, &prop, 0));
    CUdeviceptr ptr;
    CU(cuMemAddressReserve(&ptr, bytes, gran, 0, 0));
    CU(cuMemMap(ptr, bytes, 0, h, 0));
    std::vector<CUmemAccessDesc> acc(gpus);
    for (int g = 0; g < gpus; ++g) {
        acc[g] = {};
        acc[g].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc[g].location.id = g;
        acc[g].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    CU(cuMemSetAccess(ptr, bytes, acc.data(), gpus));
    return (void*)ptr;
}

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ uint64_t ld_relaxed_sys(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed_sys(uint64_t* p, uint64_t v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// GPUs 0 and 1 with peer access both ways; exits with a message naming
// `prog` when there are fewer. Returns GPU 0's name.
static inline std::string open_gpus(const char* prog, int n) {
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    if (ndev < n) {
        fprintf(stderr, "%s: needs %d GPUs, found %d\n", prog, n, ndev);
        exit(1);
    }
    for (int d = 0; d < n; ++d) {
        CK(cudaSetDevice(d));
        for (int p = 0; p < n; ++p)
            if (p != d) CK(cudaDeviceEnablePeerAccess(p, 0));
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    return prop.name;
}

static inline std::string open_two_gpus(const char* prog) { return open_gpus(prog, 2); }

// Whether variant `name` runs: every one when the command line names none.
static inline bool variant_wanted(int argc, char** argv, const char* name) {
    if (argc < 2) return true;
    for (int a = 1; a < argc; ++a)
        if (std::string(argv[a]) == name) return true;
    return false;
}

// `tokens` tokens' `topk` distinct experts of `experts`, uniformly random.
static inline std::vector<int> random_topk(std::mt19937& rng, int tokens, int topk, int experts) {
    std::vector<int> idx(tokens * topk), all(experts);
    for (int t = 0; t < tokens; ++t) {
        for (int e = 0; e < experts; ++e) all[e] = e;
        std::shuffle(all.begin(), all.end(), rng);
        for (int j = 0; j < topk; ++j) idx[t * topk + j] = all[j];
    }
    return idx;
}

// The median (the upper one of an even count); 0 of none.
static inline double median(std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x.empty() ? 0.0 : x[x.size() / 2];
}

// Stamps `[launch][ctas][stamps]` (%globaltimer, stamp 0 a CTA's start) of
// launches 1..launches-1 reduced to medians over the launches: element 0
// the spread of the CTAs' starts (last - first), element k >= 1 the
// slowest CTA's stamp k from the first CTA's start; in microseconds.
static inline std::vector<double> stage_medians(const std::vector<uint64_t>& hs, int launches, int ctas, int stamps) {
    std::vector<std::vector<double>> m(stamps);
    for (int it = 1; it < launches; ++it) {
        const uint64_t* c = hs.data() + (size_t)it * ctas * stamps;
        uint64_t first = ~0ull, last_start = 0;
        std::vector<uint64_t> mx(stamps, 0);
        for (int b = 0; b < ctas; ++b) {
            first = std::min(first, c[b * stamps]);
            last_start = std::max(last_start, c[b * stamps]);
            for (int k = 1; k < stamps; ++k) mx[k] = std::max(mx[k], c[b * stamps + k]);
        }
        m[0].push_back((last_start - first) / 1e3);
        for (int k = 1; k < stamps; ++k) m[k].push_back((mx[k] - first) / 1e3);
    }
    std::vector<double> out(stamps);
    for (int k = 0; k < stamps; ++k) out[k] = median(m[k]);
    return out;
}

// `launches(d)` enqueues a batch on GPU d's stream `st[d]`, for GPUs
// 0..n at once, each from its own host thread (one thread switching
// devices launches slower than short kernels run); waits for all. With
// `timed`, events around each batch: returns the slowest GPU's
// milliseconds. `on_both_gpus`: n = 2.
static inline float on_gpus(int n, cudaStream_t* st, cudaEvent_t* ev0, cudaEvent_t* ev1, bool timed,
                            const std::function<void(int)>& launches) {
    std::vector<float> ms(n, 0.0f);
    auto run = [&](int d) {
        CK(cudaSetDevice(d));
        if (timed) CK(cudaEventRecord(ev0[d], st[d]));
        launches(d);
        CK(cudaGetLastError());
        if (timed) CK(cudaEventRecord(ev1[d], st[d]));
        CK(cudaStreamSynchronize(st[d]));
        if (timed) CK(cudaEventElapsedTime(&ms[d], ev0[d], ev1[d]));
    };
    std::vector<std::thread> others;
    for (int d = 1; d < n; ++d) others.emplace_back(run, d);
    run(0);
    for (auto& t : others) t.join();
    return *std::max_element(ms.begin(), ms.end());
}

static inline float on_both_gpus(cudaStream_t* st, cudaEvent_t* ev0, cudaEvent_t* ev1, bool timed,
                                 const std::function<void(int)>& launches) {
    return on_gpus(2, st, ev0, ev1, timed, launches);
}

// Microseconds per launch of `reps` timed batches of `iters` launches
// (`batch()` returns a batch's milliseconds), sorted.
static inline std::vector<double> per_launch_us(int reps, int iters, const std::function<float()>& batch) {
    std::vector<double> per;
    for (int rep = 0; rep < reps; ++rep) per.push_back(batch() * 1e3 / iters);
    std::sort(per.begin(), per.end());
    return per;
}
