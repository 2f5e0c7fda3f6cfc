// A floor for issue 15's low-latency dispatch, in plain CUDA C++ (no
// devcomm): the structure of devcomm's `moe_dispatch` (session 22's
// default: token sent once per rank, per-expert pack) written as simply as
// the hardware allows, on the benchmark's shape — 2 GPUs (one process,
// peer access), 128 tokens per rank of 7168 bf16 (14336 bytes), top-8 of
// 256 experts (128 local experts per GPU), random distinct experts per
// token, 128 CTAs of 256 threads, one launch per dispatch.
//
// Every variant sends alike (CTA b: token b):
//   send: the token's bytes once to every GPU whose experts it names
//         (16-byte vectors, all loaded before any is stored), its 8 expert
//         ids to every GPU's header, `__syncthreads`, then thread 0: a
//         system fence and a relaxed system store of the slot's word
//         `(seq << 32) | 1` on every GPU (devcomm's release of the word);
//   wait: every CTA waits for every source slot's word (a thread per slot,
//         acquire polls), `__syncthreads`.
// and packs, into `out[local expert][row]` in (source GPU, source token)
// order, recording each row in the header entry naming the expert:
//   pe:   per expert (devcomm's `LlPack::PerExpert`): CTA b packs local
//         expert b; each warp scans the headers (32 tokens a round, a
//         ballot), row r copied by warp r % 8 (8 vectors in flight a lane);
//   bal:  balanced without a grid barrier: every CTA counts every local
//         expert's rows itself (shared-memory histogram of all headers),
//         so every CTA knows the whole layout and copies rows
//         [b T / B, (b + 1) T / B) of the T rows (scanning only the experts
//         its range touches), a warp a row: the most loaded expert no
//         longer sets the time (max rows per CTA ~ T / B = 8 here, against
//         ~16 for the most loaded expert);
//   sendonly: no pack (the send and the wait alone);
//   stream: no wait for every slot, no scan: the sender also sends each
//         token's position among its own tokens for each of its experts
//         (in the header, beside the ids) and, before any token, its token
//         count per expert (a word `(seq << 32) | count` per
//         (source, expert) on the expert's GPU); the receiver's warps take
//         items (slot, piece of P, P = warps / slots), wait for that slot's
//         word alone, and copy the piece once from the slot to each of its
//         local rows (row = position + the earlier sources' counts): the
//         pack overlaps the send, and the copies spread evenly over the
//         grid with no grid barrier;
//   stream_row: stream with P = 1 (a warp a slot, its whole row);
//   stream_warp: stream with the routing scanned as devcomm's
//         `dispatch_send_count` and `send_positions` do (a warp per count
//         and per position, ballots over the routing in global memory)
//         instead of once per CTA into shared counters;
//   direct: DeepEP's layout instead of devcomm's: no pack; the send
//         stores the token into each of its 8 experts' rows on their GPU,
//         row (source GPU) * 128 + (the token's position among this GPU's
//         tokens for that expert: counted by the CTA over the tokens before
//         it), 4 times the NVLink bytes of the others here (the check
//         reads those rows);
// and, to find what makes devcomm's pack of the same structure slower,
// `pe` with one of devcomm's traits each:
//   pe_gen:  its 16-byte copies and header loads as devcomm writes them
//            (inline `ld.v4.u32` / `st.v4.u32`, generic addresses);
//   pe_coop: launched cooperatively (`cudaLaunchCooperativeKernel`);
//   pe_vmm:  the receive areas (slots, headers, words) in VMM memory
//            (`cuMemCreate` + `cuMemMap` + `cuMemSetAccess` for both GPUs),
//            as devcomm's windows are;
//   pe_idle: each dispatch alone (the stream synchronized and 50 us of
//            host sleep between them), as `moe_bench --stages` times
//            devcomm's stages (its µs/dispatch column is not comparable).
//
// Reported per variant: the median over 7 reps of 200 back-to-back
// dispatches (both GPUs, the later GPU's events) per dispatch, #wrong
// (every expert's rows and counts against the host's layout, byte for
// byte, both GPUs), and GPU 0's medians over the launches of one more rep
// with %globaltimer stamps per CTA: spread (last CTA start - first),
// sent, waited, packed (slowest CTA, from the first CTA's start).
//
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -Xcompiler -pthread -o moe_floor benches/gpu/moe_floor.cu -lcuda && ./moe_floor [variant ...]
// (each GPU's launches come from its own host thread: `on_both_gpus`).
#include <cuda.h>
#include <cuda_runtime.h>

#include "floor_common.cuh"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#ifndef RANKS
#define RANKS 2
#endif
constexpr int kRanks = RANKS;  // GPUs (-DRANKS=1: one GPU, no peers)
constexpr int kTokens = 128;           // per rank
constexpr int kRowBytes = 7168 * 2;    // bf16
constexpr int kVec = kRowBytes / 16;   // 896 vectors a row
constexpr int kTopK = 8;
constexpr int kExperts = 256;
constexpr int kLocal = kExperts / kRanks;  // 128
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kCtas = 128;
constexpr int kSlots = kRanks * kTokens;  // source slots a GPU receives
constexpr int kStamps = 4;               // start, sent, waited, packed

struct Side {
    const uint4* x;           // [kTokens][kVec] this GPU's tokens
    const int* idx;           // [kTokens][kTopK] its routing
    uint4* slots;             // [2 parity][kRanks src][kTokens][kVec] (written by the sources)
    int* hdr;                 // [2][kRanks][kTokens][kTopK] ids (written by the sources)
    int* rowrec;              // [2][kRanks][kTokens][kTopK] rows recorded by the pack
    uint64_t* meta;           // [kRanks][kTokens] slot words
    int* pos;                 // [2][kRanks][kTokens][kTopK] positions among the source's tokens for the expert (stream)
    uint64_t* cntw;           // [2][kRanks src][kLocal] words (seq << 32) | the source's tokens for the expert (stream)
    uint4* out;               // [kLocal][kSlots][kVec]
    int* counts;              // [kLocal]
    uint64_t* stamps;         // null or [launch][kCtas][kStamps]
    uint4* peer_slots[kRanks];
    int* peer_hdr[kRanks];
    uint64_t* peer_meta[kRanks];
    int* peer_pos[kRanks];
    uint64_t* peer_cntw[kRanks];
    uint4* peer_out[kRanks];
    int rank;
};

enum Variant { PE = 0, BAL = 1, SENDONLY = 2, DIRECT = 3, PE_GEN = 4, PE_COOP = 5, PE_VMM = 6, PE_IDLE = 7, PE_SPAN = 8, STREAM = 9, STREAM_ROW = 10, STREAM_WARP = 11, VARIANTS = 12 };
static const char* kVariantName[VARIANTS] = {"pe", "bal", "sendonly", "direct", "pe_gen", "pe_coop", "pe_vmm", "pe_idle", "pe_span", "stream", "stream_row", "stream_warp"};

__device__ __forceinline__ void stamp(const Side& s, int launch, int k) {
    __syncthreads();
    if (s.stamps && threadIdx.x == 0) s.stamps[((size_t)launch * gridDim.x + blockIdx.x) * kStamps + k] = globaltimer();
}

// devcomm's 16-byte accesses: inline PTX on generic addresses.
__device__ __forceinline__ uint4 ld_gen(const void* p) {
    uint4 v;
    asm volatile("ld.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_gen(void* p, uint4 v) {
    asm volatile("st.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ uint4 ld16(const uint4* p, bool gen) { return gen ? ld_gen(p) : *p; }

// Copies one row (kVec vectors) with the 32 lanes of a warp, 8 vectors in
// flight a lane.
__device__ __forceinline__ void warp_copy_row(uint4* dst, const uint4* src, int lane, bool gen) {
    for (int base = lane; base < kVec; base += 32 * 8) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            int i = base + u * 32;
            if (i < kVec) v[u] = ld16(src + i, gen);
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            int i = base + u * 32;
            if (i < kVec) {
                if (gen)
                    st_gen(dst + i, v[u]);
                else
                    dst[i] = v[u];
            }
        }
    }
}

// Header (par, src, tok)'s index.
__device__ __forceinline__ size_t hslot(int par, int src, int tok) { return ((size_t)par * kRanks + src) * kTokens + tok; }

// Whether the lane's token `tok` of source `src` names global expert `e`
// (its 8 ids: two 16-byte loads).
__device__ __forceinline__ bool names(const Side& s, int par, int src, int tok, int e, bool gen = false) {
    const uint4* h = reinterpret_cast<const uint4*>(s.hdr + hslot(par, src, tok) * kTopK);
    uint4 ua = ld16(h, gen), ub = ld16(h + 1, gen);
    int4 a = make_int4(ua.x, ua.y, ua.z, ua.w), b = make_int4(ub.x, ub.y, ub.z, ub.w);
    return a.x == e || a.y == e || a.z == e || a.w == e || b.x == e || b.y == e || b.z == e || b.w == e;
}

// The warp's part of packing expert `l`'s rows `lo..hi` (numbered within
// the expert): scans the sources in order, row r copied by warp
// (f + r) % kWarps (`f`: the expert's first row among all experts', so a
// CTA's rows of two experts go to different warps) when lo <= r < hi,
// and recorded in the header entry naming the expert.
__device__ __forceinline__ void pack_rows(const Side& s, int par, int l, int f, int lo, int hi, bool gen = false,
                                          int w = threadIdx.x / 32, int nw = kWarps) {
    int lane = threadIdx.x % 32;
    int e = s.rank * kLocal + l;
    int at = 0;
    for (int src = 0; src < kRanks && at < hi; ++src) {
        for (int g = 0; g < kTokens / 32 && at < hi; ++g) {
            int tok = g * 32 + lane;
            unsigned mask = __ballot_sync(0xffffffffu, names(s, par, src, tok, e, gen));
            while (mask) {
                int t = g * 32 + __ffs(mask) - 1;
                mask &= mask - 1;
                int r = at++;
                if (r < lo || r >= hi || (f + r) % nw != w) continue;
                size_t row = (size_t)l * kSlots + r;
                const uint4* from = s.slots + hslot(par, src, t) * kVec;
                warp_copy_row(s.out + row * kVec, from, lane, gen);
                if (lane < kTopK) {
                    size_t h = hslot(par, src, t) * kTopK + lane;
                    if (s.hdr[h] == e) s.rowrec[h] = r;
                }
            }
        }
    }
}

// Local expert `l`'s row count, scanned again by the calling warp (every
// source's headers, a ballot per 32 tokens), stored by its lane 0.
__device__ __forceinline__ void count_expert(const Side& s, int par, int l) {
    int e = s.rank * kLocal + l, c = 0, lane = threadIdx.x % 32;
    for (int src = 0; src < kRanks; ++src)
        for (int g = 0; g < kTokens / 32; ++g) c += __popc(__ballot_sync(0xffffffffu, names(s, par, src, g * 32 + lane, e)));
    if (lane == 0) s.counts[l] = c;
}

__global__ void __launch_bounds__(kThreads) dispatch(Side s, uint32_t seq, int variant, int launch) {
    __shared__ int cnt[kLocal];
    __shared__ int base[kLocal + 1];
    int b = blockIdx.x, tid = threadIdx.x;
    int par = seq & 1;
    stamp(s, launch, 0);
    const bool streamed = variant == STREAM || variant == STREAM_ROW || variant == STREAM_WARP;
    // The streamed variants' routing work, from one 16-byte load of the
    // routing a thread (thread i: ids 4i..4i+3, token i / 2), counted with
    // ballots into shared counters: this GPU's token count for its experts
    // b, b + B (sent first, a word each) and token t = b's position among
    // this GPU's tokens for each of its experts (sent in the header).
    static_assert(kTokens * kTopK == 4 * kThreads && kTopK == 8 && kTokens == kCtas, "the streamed routing pass's shape");
    __shared__ int scnt[kExperts / kCtas], spos[kTopK];
    if (variant == STREAM_WARP) {
        // devcomm's way (`dispatch_send_count`, `send_positions`): warp w
        // scans the routing in global memory with ballots, 32 tokens a
        // lane-round, four rounds' ids loaded at once: warps 0..E/B-1
        // count expert b + w B (stored right away), warp j < K counts
        // the tokens before b naming b's entry j.
        int w = tid / 32, lane = tid % 32;
        auto naming = [&](int e, int count) {
            int ids[kTokens / 32][kTopK];
#pragma unroll
            for (int g = 0; g < kTokens / 32; ++g)
#pragma unroll
                for (int q = 0; q < kTopK; ++q) ids[g][q] = g * 32 + lane < count ? s.idx[(g * 32 + lane) * kTopK + q] : -1;
            int c = 0;
#pragma unroll
            for (int g = 0; g < kTokens / 32; ++g) {
                bool hit = false;
#pragma unroll
                for (int q = 0; q < kTopK; ++q) hit |= ids[g][q] == e;
                c += __popc(__ballot_sync(0xffffffffu, hit));
            }
            return c;
        };
        if (w < kExperts / kCtas) {
            int e = b + w * kCtas;
            int c = naming(e, kTokens);
            if (lane == 0)
                st_relaxed_sys(s.peer_cntw[e / kLocal] + ((size_t)par * kRanks + s.rank) * kLocal + e % kLocal, ((uint64_t)seq << 32) | (uint32_t)c);
        }
        if (w < kTopK) {
            int c = naming(s.idx[b * kTopK + w], b);
            if (lane == 0) spos[w] = c;
        }
        __syncthreads();
    } else if (streamed) {
        if (tid < kExperts / kCtas) scnt[tid] = 0;
        if (tid < kTopK) spos[tid] = 0;
        int4 mine = reinterpret_cast<const int4*>(s.idx)[tid];
        int4 ta = reinterpret_cast<const int4*>(s.idx)[2 * b], tb = reinterpret_cast<const int4*>(s.idx)[2 * b + 1];
        int tid_token = tid / 2, lane = tid % 32;
        int tok_ids[kTopK] = {ta.x, ta.y, ta.z, ta.w, tb.x, tb.y, tb.z, tb.w};
        __syncthreads();
#pragma unroll
        for (int c = 0; c < kExperts / kCtas; ++c) {
            int e = b + c * kCtas;
            unsigned m = __ballot_sync(0xffffffffu, mine.x == e || mine.y == e || mine.z == e || mine.w == e);
            if (lane == 0 && m) atomicAdd(&scnt[c], __popc(m));
        }
#pragma unroll
        for (int j = 0; j < kTopK; ++j) {
            int e = tok_ids[j];
            unsigned m = __ballot_sync(0xffffffffu, tid_token < b && (mine.x == e || mine.y == e || mine.z == e || mine.w == e));
            if (lane == 0 && m) atomicAdd(&spos[j], __popc(m));
        }
        __syncthreads();
        // Relaxed: the word is its own data (no fence, ~1 us each).
        if (tid < kExperts / kCtas) {
            int e = b + tid * kCtas;
            st_relaxed_sys(s.peer_cntw[e / kLocal] + ((size_t)par * kRanks + s.rank) * kLocal + e % kLocal, ((uint64_t)seq << 32) | (uint32_t)scnt[tid]);
        }
    }
    // Send: token t to every GPU its experts name, the ids to every GPU.
    for (int t = b; t < kTokens; t += gridDim.x) {
        const int* id = s.idx + t * kTopK;
        bool to[kRanks] = {};
        for (int j = 0; j < kTopK; ++j) to[id[j] / kLocal] = true;
        const uint4* src = s.x + (size_t)t * kVec;
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            int i = tid + u * kThreads;
            if (i < kVec) v[u] = src[i];
        }
        if (variant == DIRECT) {
            // Each expert's row on its GPU: position among this GPU's tokens for it.
            for (int j = 0; j < kTopK; ++j) {
                int e = id[j];
                bool before = false;
                if (tid < t) {
                    const int* o = s.idx + tid * kTopK;
                    for (int q = 0; q < kTopK; ++q) before |= o[q] == e;
                }
                int pos = __syncthreads_count(before);
                uint4* d = s.peer_out[e / kLocal] + ((size_t)(e % kLocal) * kSlots + s.rank * kTokens + pos) * kVec;
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    int i = tid + u * kThreads;
                    if (i < kVec) d[i] = v[u];
                }
            }
        } else {
            for (int p = 0; p < kRanks; ++p) {
                if (!to[p]) continue;
                uint4* d = s.peer_slots[p] + hslot(par, s.rank, t) * kVec;
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    int i = tid + u * kThreads;
                    if (i < kVec) d[i] = v[u];
                }
            }
        }
        if (streamed && tid < kTopK)
            for (int p = 0; p < kRanks; ++p) s.peer_pos[p][hslot(par, s.rank, t) * kTopK + tid] = spos[tid];
        if (tid < kTopK)
            for (int p = 0; p < kRanks; ++p) s.peer_hdr[p][hslot(par, s.rank, t) * kTopK + tid] = id[tid];
        __syncthreads();
        if (tid == 0) {
            __threadfence_system();
            for (int p = 0; p < kRanks; ++p) st_relaxed_sys(s.peer_meta[p] + s.rank * kTokens + t, ((uint64_t)seq << 32) | 1);
        }
    }
    stamp(s, launch, 1);
    // Wait: every source slot's word (the streamed packs wait per slot).
    if (!streamed)
        for (int i = tid; i < kSlots; i += blockDim.x)
            while (ld_acquire_sys(s.meta + i) < ((uint64_t)seq << 32)) {
            }
    stamp(s, launch, 2);
    if (streamed) {
        // Items (slot, piece of P): warp gw of the grid takes items gw,
        // gw + TW, ...; waits for the slot's word alone, reads the ids and
        // positions, each local entry's row = its position + the earlier
        // sources' counts for the expert, and copies the piece once from
        // the slot to every local row.
        int lane = tid % 32, tw = gridDim.x * kWarps, gw = b * kWarps + tid / 32;
        int P = variant == STREAM_ROW ? 1 : max(1, tw / kSlots);
        int pv = (kVec + P - 1) / P;
        for (int i = gw; i < kSlots * P; i += tw) {
            int slot = i / P, piece = i % P, src = slot / kTokens, t = slot % kTokens;
            if (lane == 0)
                while (ld_acquire_sys(s.meta + slot) < ((uint64_t)seq << 32)) {
                }
            __syncwarp();
            size_t h = hslot(par, src, t) * kTopK;
            int l = -1, row = 0;
            if (lane < kTopK) {
                l = s.hdr[h + lane] - s.rank * kLocal;
                if (l >= 0 && l < kLocal) {
                    row = s.pos[h + lane];
                    for (int q = 0; q < src; ++q) {
                        const uint64_t* cw = s.cntw + ((size_t)par * kRanks + q) * kLocal + l;
                        uint64_t c;
                        while (((c = ld_acquire_sys(cw)) >> 32) < seq) {
                        }
                        row += (int)(uint32_t)c;
                    }
                    if (piece == 0) s.rowrec[h + lane] = row;
                } else {
                    l = -1;
                }
            }
            uint4* dst[kTopK];
#pragma unroll
            for (int k = 0; k < kTopK; ++k) {
                int lk = __shfl_sync(0xffffffffu, l, k), rk = __shfl_sync(0xffffffffu, row, k);
                dst[k] = lk >= 0 ? s.out + ((size_t)lk * kSlots + rk) * kVec : nullptr;
            }
            const uint4* from = s.slots + hslot(par, src, t) * kVec;
            int lo = piece * pv, hi = min(kVec, lo + pv);
            for (int base = lo + lane; base < hi; base += 32 * 4) {
                uint4 v[4];
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    if (base + u * 32 < hi) v[u] = from[base + u * 32];
#pragma unroll
                for (int k = 0; k < kTopK; ++k)
                    if (dst[k])
#pragma unroll
                        for (int u = 0; u < 4; ++u)
                            if (base + u * 32 < hi) dst[k][base + u * 32] = v[u];
            }
        }
        for (int l = b; l < kLocal; l += gridDim.x)
            if (tid == 0) {
                int c = 0;
                for (int q = 0; q < kRanks; ++q) {
                    const uint64_t* cw = s.cntw + ((size_t)par * kRanks + q) * kLocal + l;
                    uint64_t w;
                    while (((w = ld_acquire_sys(cw)) >> 32) < seq) {
                    }
                    c += (int)(uint32_t)w;
                }
                s.counts[l] = c;
            }
    } else if (variant == PE || (variant >= PE_GEN && variant < PE_SPAN)) {
        for (int l = b; l < kLocal; l += gridDim.x) {
            pack_rows(s, par, l, 0, 0, kSlots, variant == PE_GEN);
            // The count: a second scan by warp 0 (the first kept no total per warp it could share cheaply).
            if (tid < 32) count_expert(s, par, l);
        }
    } else if (variant == PE_SPAN) {
        // Spans of kWarps / S warps, S = the experts each CTA takes (at
        // most kWarps): all of a CTA's experts at once, not one after
        // another (with one GPU, 256 experts on 128 CTAs: 2 spans of 4).
        int spans = min(kWarps, max(1, (kLocal + gridDim.x - 1) / gridDim.x));
        int g = kWarps / spans, j = (tid / 32) / g;
        if (j < spans)
            for (int l = j * gridDim.x + b; l < kLocal; l += gridDim.x * spans) {
                pack_rows(s, par, l, 0, 0, kSlots, false, (tid / 32) % g, g);
                if ((tid / 32) % g == 0) count_expert(s, par, l);
            }
    } else if (variant == BAL) {
        // Every CTA: each local expert's row count, from every header.
        for (int l = tid; l < kLocal; l += blockDim.x) cnt[l] = 0;
        __syncthreads();
        for (int i = tid; i < kSlots; i += blockDim.x) {
            const int* h = s.hdr + hslot(par, i / kTokens, i % kTokens) * kTopK;
            for (int j = 0; j < kTopK; ++j) {
                int l = h[j] - s.rank * kLocal;
                if (l >= 0 && l < kLocal) atomicAdd(&cnt[l], 1);
            }
        }
        __syncthreads();
        if (tid < 32) {  // exclusive prefix over the experts, a warp
            int carry = 0;
            for (int l0 = 0; l0 < kLocal; l0 += 32) {
                int c = cnt[l0 + tid], x = c;
                for (int o = 1; o < 32; o <<= 1) {
                    int y = __shfl_up_sync(0xffffffffu, x, o);
                    if (tid >= o) x += y;
                }
                base[l0 + tid] = carry + x - c;
                carry += __shfl_sync(0xffffffffu, x, 31);
            }
            if (tid == 0) base[kLocal] = carry;
        }
        __syncthreads();
        int total = base[kLocal];
        int lo = (int)((long long)b * total / gridDim.x), hi = (int)((long long)(b + 1) * total / gridDim.x);
        for (int l = b; l < kLocal; l += gridDim.x)
            if (tid == 0) s.counts[l] = cnt[l];
        // The experts whose rows meet [lo, hi).
        for (int l = 0; l < kLocal; ++l) {
            int f = base[l], n = cnt[l];
            if (f + n <= lo || n == 0) continue;
            if (f >= hi) break;
            pack_rows(s, par, l, f, max(lo - f, 0), min(hi - f, n));
        }
    }
    stamp(s, launch, 3);
}

int main(int argc, char** argv) {
    auto wanted = [&](int v) { return variant_wanted(argc, argv, kVariantName[v]); };
    std::string gpu = open_gpus("moe_floor", kRanks);
    printf("# moe_floor: %d x %s, plain-CUDA low-latency MoE dispatch, %d tokens/rank x %d B, top-%d of %d experts, %d CTAs x %d threads\n",
           kRanks, gpu.c_str(), kTokens, kRowBytes, kTopK, kExperts, kCtas, kThreads);
    const int iters = 200, reps = 7;
    // Routing: distinct random experts per token; random token bytes.
    std::mt19937 rng(15);
    std::vector<int> idx[kRanks];
    std::vector<uint32_t> xs[kRanks];
    for (int r = 0; r < kRanks; ++r) {
        idx[r] = random_topk(rng, kTokens, kTopK, kExperts);
        xs[r].resize((size_t)kTokens * kRowBytes / 4);
        for (auto& w : xs[r]) w = rng();
    }
    Side side[kRanks];
    const size_t slot_bytes = (size_t)2 * kSlots * kRowBytes, hdr_ints = (size_t)2 * kSlots * kTopK;
    const size_t out_bytes = (size_t)kLocal * kSlots * kRowBytes, stamp_words = (size_t)iters * kCtas * kStamps;
    cudaStream_t st[kRanks];
    cudaEvent_t ev0[kRanks], ev1[kRanks];
    for (int d = 0; d < kRanks; ++d) {
        CK(cudaSetDevice(d));
        Side& s = side[d];
        s.rank = d;
        uint4 *x, *slots, *out;
        int *id, *hdr, *rowrec, *counts;
        uint64_t *meta, *stamps, *cntw;
        int* pos;
        CK(cudaMalloc(&x, (size_t)kTokens * kRowBytes));
        CK(cudaMalloc(&id, kTokens * kTopK * sizeof(int)));
        CK(cudaMalloc(&slots, slot_bytes));
        CK(cudaMalloc(&hdr, hdr_ints * sizeof(int)));
        CK(cudaMalloc(&rowrec, hdr_ints * sizeof(int)));
        CK(cudaMalloc(&meta, kSlots * sizeof(uint64_t)));
        CK(cudaMalloc(&out, out_bytes));
        CK(cudaMalloc(&counts, kLocal * sizeof(int)));
        CK(cudaMalloc(&stamps, stamp_words * sizeof(uint64_t)));
        CK(cudaMemcpy(x, xs[d].data(), (size_t)kTokens * kRowBytes, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(id, idx[d].data(), kTokens * kTopK * sizeof(int), cudaMemcpyHostToDevice));
        CK(cudaMemset(meta, 0, kSlots * sizeof(uint64_t)));
        CK(cudaMalloc(&pos, hdr_ints * sizeof(int)));
        CK(cudaMalloc(&cntw, (size_t)2 * kRanks * kLocal * sizeof(uint64_t)));
        CK(cudaMemset(cntw, 0, (size_t)2 * kRanks * kLocal * sizeof(uint64_t)));
        side[d].pos = pos, side[d].cntw = cntw;
        s.x = x, s.idx = id, s.slots = slots, s.hdr = hdr, s.rowrec = rowrec, s.meta = meta, s.out = out, s.counts = counts;
        s.stamps = stamps;
        CK(cudaStreamCreateWithFlags(&st[d], cudaStreamNonBlocking));
        CK(cudaEventCreate(&ev0[d]));
        CK(cudaEventCreate(&ev1[d]));
    }
    for (int d = 0; d < kRanks; ++d)
        for (int p = 0; p < kRanks; ++p) {
            side[d].peer_slots[p] = side[p].slots;
            side[d].peer_hdr[p] = side[p].hdr;
            side[d].peer_meta[p] = side[p].meta;
            side[d].peer_out[p] = side[p].out;
            side[d].peer_pos[p] = side[p].pos;
            side[d].peer_cntw[p] = side[p].cntw;
        }
    // pe_vmm's sides: the receive areas in VMM memory.
    Side vside[kRanks];
    for (int d = 0; d < kRanks; ++d) {
        CK(cudaSetDevice(d));
        vside[d] = side[d];
        vside[d].slots = (uint4*)vmm_alloc(d, slot_bytes, kRanks);
        vside[d].hdr = (int*)vmm_alloc(d, hdr_ints * sizeof(int), kRanks);
        vside[d].meta = (uint64_t*)vmm_alloc(d, kSlots * sizeof(uint64_t), kRanks);
        CK(cudaMemset(vside[d].meta, 0, kSlots * sizeof(uint64_t)));
    }
    for (int d = 0; d < kRanks; ++d)
        for (int p = 0; p < kRanks; ++p) {
            vside[d].peer_slots[p] = vside[p].slots;
            vside[d].peer_hdr[p] = vside[p].hdr;
            vside[d].peer_meta[p] = vside[p].meta;
        }
    // The host's layout: GPU r's local expert l gets, in (source, token)
    // order, the tokens naming expert r * kLocal + l.
    std::vector<std::vector<std::pair<int, int>>> want[kRanks];
    for (int r = 0; r < kRanks; ++r) {
        want[r].resize(kLocal);
        for (int l = 0; l < kLocal; ++l)
            for (int src = 0; src < kRanks; ++src)
                for (int t = 0; t < kTokens; ++t)
                    for (int j = 0; j < kTopK; ++j)
                        if (idx[src][t * kTopK + j] == r * kLocal + l) want[r][l].push_back({src, t});
    }
    size_t most = 0;
    for (int r = 0; r < kRanks; ++r)
        for (auto& v : want[r]) most = std::max(most, v.size());
    printf("# rows: %d per GPU on average per expert, the most loaded expert %zu\n", kSlots * kTopK / kExperts, most);
    printf("# variant | us/dispatch (200 back to back, median of %d) | #wrong | GPU 0 stamps, us from the first CTA's start (medians): spread sent waited packed\n", reps);
    uint32_t seq = 0;
    std::vector<uint64_t> hs(stamp_words);
    std::vector<uint8_t> hout(out_bytes);
    std::vector<int> hcounts(kLocal);
    for (int v = 0; v < VARIANTS; ++v) {
        if (!wanted(v)) continue;
        // 200 dispatches on both GPUs, each GPU's from its own thread;
        // with `timed`, between events: the slower GPU's time.
        auto launch_all = [&](bool stamped, bool timed) {
            uint32_t first = seq + 1;
            float ms = on_gpus(kRanks, st, ev0, ev1, timed, [&](int d) {
                Side s = v == PE_VMM ? vside[d] : side[d];
                if (!stamped) s.stamps = nullptr;
                for (int it = 0; it < iters; ++it) {
                    uint32_t q = first + it;
                    int vv = v, launch = it;
                    if (v == PE_COOP) {
                        void* args[] = {&s, &q, &vv, &launch};
                        CK(cudaLaunchCooperativeKernel((void*)dispatch, kCtas, kThreads, args, 0, st[d]));
                    } else {
                        dispatch<<<kCtas, kThreads, 0, st[d]>>>(s, q, vv, launch);
                    }
                    if (v == PE_IDLE) {
                        CK(cudaStreamSynchronize(st[d]));
                        usleep(50);
                    }
                }
            });
            seq += iters;
            return ms;
        };
        for (int d = 0; d < kRanks; ++d) {
            CK(cudaSetDevice(d));
            CK(cudaMemset(side[d].out, 0xA5, out_bytes));  // poisoned
            CK(cudaMemset(side[d].counts, 0xFF, kLocal * sizeof(int)));
        }
        launch_all(false, false);  // warm-up
        std::vector<double> per = per_launch_us(reps, iters, [&] { return launch_all(false, true); });
        launch_all(true, false);
        long wrong = 0;
        for (int d = 0; d < kRanks; ++d) {
            CK(cudaSetDevice(d));
            CK(cudaStreamSynchronize(st[d]));
            if (v == SENDONLY) continue;
            CK(cudaMemcpy(hout.data(), side[d].out, out_bytes, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hcounts.data(), side[d].counts, kLocal * sizeof(int), cudaMemcpyDeviceToHost));
            for (int l = 0; l < kLocal; ++l) {
                if (v != DIRECT) wrong += hcounts[l] != (int)want[d][l].size();
                int per_src[kRanks] = {};
                for (size_t i = 0; i < want[d][l].size(); ++i) {
                    auto [src, t] = want[d][l][i];
                    size_t r = v == DIRECT ? (size_t)src * kTokens + per_src[src]++ : i;
                    const uint8_t* got = hout.data() + ((size_t)l * kSlots + r) * kRowBytes;
                    const uint8_t* exp = reinterpret_cast<const uint8_t*>(xs[src].data()) + (size_t)t * kRowBytes;
                    wrong += memcmp(got, exp, kRowBytes) != 0;
                }
            }
        }
        CK(cudaSetDevice(0));
        CK(cudaMemcpy(hs.data(), side[0].stamps, stamp_words * sizeof(uint64_t), cudaMemcpyDeviceToHost));
        std::vector<double> m = stage_medians(hs, iters, kCtas, kStamps);
        printf("%-9s | %7.2f (min %.2f max %.2f) | %ld | %.2f %.2f %.2f %.2f\n", kVariantName[v], per[reps / 2], per[0], per[reps - 1],
               wrong, m[0], m[1], m[2], m[3]);
        fflush(stdout);
    }
    return 0;
}
