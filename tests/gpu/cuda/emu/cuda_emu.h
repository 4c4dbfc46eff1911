// cuda_emu.h -- run CUDA kernels on the CPU, one std::thread per CUDA thread (tests only).
//
// The kernel file is compiled unchanged by g++ (-std=c++20 -DMINITX_EMULATION); this header
// supplies what nvcc/NVRTC would:
//   * __global__/__device__/__host__/__forceinline__/__launch_bounds__/__shared__ as macros,
//   * threadIdx/blockIdx/blockDim/gridDim as thread_local values set per emulated thread,
//   * __syncthreads() as a std::barrier wait over the threads of the block, __syncwarp() and the
//     warp shuffles (__shfl_sync, __shfl_xor_sync, __shfl_down_sync, __shfl_up_sync) through a
//     per-warp exchange buffer guarded by a per-warp std::barrier,
//   * dynamic shared memory: `extern __shared__ float NAME[];` becomes a block-scope extern
//     declaration of a global arena that the driver defines and registers with
//     emu::set_shared_arena(); the arena is filled with 0xFF bytes (NaN for floats) before every
//     block, so reading shared memory that no thread of this block wrote yields NaN,
//   * atomics through std::atomic_ref, a minimal __half (_Float16) with __half2float/__float2half,
//     expf/__expf/exp2f/logf/fmaxf/fmaf/rsqrtf/__fdividef/__int_as_float and INFINITY,
//   * the warp-level matrix instructions the tensor-core kernels use, as C++ functions with the
//     register-level signature of their PTX (the kernel source calls them under
//     #ifdef MINITX_EMULATION and the inline asm otherwise):
//       emu::mma_m16n8k16_f32_f16  mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
//       emu::ldmatrix_x4<TRANS>    ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16
//       emu::mma_m16n8k8_f32_tf32  mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32
//       emu::cvt_rna_tf32          cvt.rna.tf32.f32
//     both laid out exactly as the PTX ISA documents the fragments (see the functions), and
//       emu::cp_async_16 / cp_async_commit / cp_async_wait<N>
//                                 cp.async.cg.shared.global (16 B, src-size zero fill),
//                                 cp.async.commit_group, cp.async.wait_group N
//     where each copy lands, at random, either at once or only when a wait_group retires its
//     group (so both a missing wait and a too-early overwrite of a buffer still being read
//     show up), and a thread that ends with copies never waited for is an error.
// Warp collectives (shuffles, mma, ldmatrix) are a rendezvous: every lane deposits its
// registers in the warp's exchange buffer, waits at the warp barrier, then reads what it needs
// from all lanes. Two exchange buffers are used alternately, so one barrier per collective is
// enough: a lane can write buffer p again only two collectives later, after the barrier of the
// collective in between, which no lane passes before every lane has finished reading buffer p.
// Misuse that the GPU would punish with garbage is reported (message on stderr + abort): a
// misaligned ldmatrix/cp.async address, or one outside the launch's dynamic shared memory.
// Blocks run one after another; all threads of a block run concurrently. Scheduling noise:
// every barrier/shuffle is a "scheduling point" where a thread yields with a configurable
// probability (emu::set_yield_permille), so a missing barrier loses its race reliably.
// A thread that leaves the kernel early while others wait at a barrier hangs the launch (the
// test harness runs every launch in a child process with a timeout and reports the hang).
#pragma once

#include <algorithm>
#include <climits>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#ifndef INFINITY
#define INFINITY (__builtin_huge_valf())
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __shared__
#define __constant__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// __restrict__ is a native g++ keyword.

struct uint3 { unsigned x = 0, y = 0, z = 0; };
struct alignas(16) float4 { float x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
constexpr int warpSize = 32;

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

// ---------------------------------------------------------------------------- half precision
struct __half { _Float16 v; };
static_assert(sizeof(__half) == 2, "__half must be 2 bytes");
inline float __half2float(__half h) { return static_cast<float>(h.v); }
inline __half __float2half(float f) { __half h; h.v = static_cast<_Float16>(f); return h; }  // RNE
inline __half __float2half_rn(float f) { return __float2half(f); }
inline unsigned short __half_as_ushort(__half h) { unsigned short u; std::memcpy(&u, &h, 2); return u; }
inline __half __ushort_as_half(unsigned short u) { __half h; std::memcpy(&h, &u, 2); return h; }

// ---------------------------------------------------------------------------- math intrinsics
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __saturatef(float x) { return std::min(1.0f, std::max(0.0f, x)); }

namespace emu {

constexpr int kExchangeWords = 8;   // 64-bit words a lane may deposit per collective

struct Warp {
    std::unique_ptr<std::barrier<>> bar;
    std::uint64_t buf[2][32][kExchangeWords];   // [parity][lane][word]
};

struct Block {
    std::unique_ptr<std::barrier<>> bar;
    std::vector<std::unique_ptr<Warp>> warps;
};

inline thread_local Block* tl_block = nullptr;
inline thread_local unsigned tl_lane = 0;
inline thread_local unsigned tl_warp = 0;
inline thread_local std::uint64_t tl_rng = 0x9E3779B97F4A7C15ull;
inline thread_local unsigned tl_parity = 0;     // which exchange buffer the next collective uses

inline unsigned char* g_arena = nullptr;
inline std::size_t g_arena_size = 0;
inline std::size_t g_launch_smem = 0;   // dynamic shared memory of the launch in progress
inline std::atomic<int> g_yield_permille{250};
inline std::atomic<std::uint64_t> g_seed{12345};

inline void set_shared_arena(void* p, std::size_t n) {
    g_arena = static_cast<unsigned char*>(p);
    g_arena_size = n;
}
inline void set_yield_permille(int p) { g_yield_permille.store(p); }
inline void set_seed(std::uint64_t s) { g_seed.store(s); }

inline std::uint64_t next_rand() {
    std::uint64_t x = tl_rng;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    tl_rng = x;
    return x;
}

// A place where the real GPU may interleave threads arbitrarily: sometimes give the core away.
inline void sched_point() {
    int p = g_yield_permille.load(std::memory_order_relaxed);
    if (p > 0 && static_cast<int>(next_rand() % 1000) < p) std::this_thread::yield();
}

// Inside warp collectives (shuffles, mma, ldmatrix) the lanes wait for each other anyway, and
// the tensor-core kernels execute thousands of them per tile: yield there with an eighth of the
// probability (the block-level scheduling points, where cross-warp races live, keep it all).
inline void warp_sched_point() {
    int p = g_yield_permille.load(std::memory_order_relaxed) / 8;
    if (p > 0 && static_cast<int>(next_rand() % 1000) < p) std::this_thread::yield();
}

inline Warp& my_warp() { return *tl_block->warps[tl_warp]; }

[[noreturn]] inline void fail(const char* what) {
    std::fprintf(stderr, "cuda_emu: %s (block %u,%u,%u thread %u)\n", what, blockIdx.x, blockIdx.y,
                 blockIdx.z, threadIdx.x);
    std::fflush(stderr);
    std::abort();
}

// Deposit `n` words for this lane, wait for the whole warp, return every lane's deposit.
inline const std::uint64_t (*rendezvous(const std::uint64_t* mine, int n))[kExchangeWords] {
    Warp& w = my_warp();
    auto& slot = w.buf[tl_parity];
    tl_parity ^= 1u;
    std::memcpy(slot[tl_lane], mine, sizeof(std::uint64_t) * std::size_t(n));
    warp_sched_point();
    w.bar->arrive_and_wait();
    return slot;
}

template <class T>
inline T exchange(T v, unsigned src_lane) {
    static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    auto all = rendezvous(&bits, 1);
    T r;
    std::memcpy(&r, &all[src_lane][0], sizeof(T));
    return r;
}

inline bool in_shared(const void* p, std::size_t bytes) {
    auto* c = static_cast<const unsigned char*>(p);
    return g_arena != nullptr && c >= g_arena && c + bytes <= g_arena + g_launch_smem;
}

// ---------------------------------------------------------------------------- cp.async
// cp.async.cg.shared.global [dst], [src], 16, src_bytes: copy src_bytes (0..16) bytes from global
// memory and zero fill the rest of the 16. The copy is asynchronous: it is only guaranteed to
// have landed after a cp.async.wait_group that retires its group (commit_group closes a group of
// this thread's copies). Here each copy lands, chosen at random, either at once (like a fast
// memory system: a buffer still being read by other threads gets overwritten early) or only at
// the wait that retires its group (a missing wait reads poison or stale data).
struct PendingCopy {
    void* dst;
    const void* src;
    int src_bytes;
};
inline thread_local std::vector<PendingCopy> tl_uncommitted;            // not yet in a group
inline thread_local std::vector<std::vector<PendingCopy>> tl_groups;   // committed, oldest first

inline void do_copy(const PendingCopy& c) {
    unsigned char tmp[16] = {0};
    if (c.src_bytes > 0) std::memcpy(tmp, c.src, std::size_t(c.src_bytes));
    std::memcpy(c.dst, tmp, 16);
}

inline void cp_async_16(void* dst, const void* src, int src_bytes) {
    if (reinterpret_cast<std::uintptr_t>(dst) % 16 || reinterpret_cast<std::uintptr_t>(src) % 16)
        fail("cp.async: 16-byte copy with a misaligned address");
    if (!in_shared(dst, 16)) fail("cp.async: destination outside the dynamic shared memory");
    if (src_bytes < 0 || src_bytes > 16) fail("cp.async: src-size outside 0..16");
    PendingCopy c{dst, src, src_bytes};
    if (next_rand() % 2 == 0) do_copy(c);       // landed at once
    else tl_uncommitted.push_back(c);           // lands when its group is waited for
}

inline void cp_async_commit() {
    tl_groups.push_back(std::move(tl_uncommitted));
    tl_uncommitted.clear();
}

// cp.async.wait_group n: every committed group but the n most recent ones has landed.
inline void cp_async_wait(int n) {
    while (tl_groups.size() > std::size_t(n)) {
        for (const auto& c : tl_groups.front()) do_copy(c);
        tl_groups.erase(tl_groups.begin());
    }
    sched_point();
}

inline void cp_async_check_drained() {
    std::size_t n = tl_uncommitted.size();
    for (const auto& g : tl_groups) n += g.size();
    if (n) fail("a thread ended with cp.async copies that were never waited for");
}

// ---------------------------------------------------------------------------- tensor cores
// Fragment layouts of the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point
// type"; groupID = laneid >> 2, threadID_in_group = laneid % 4; element i of a fragment sits in
// register i / 2, low half first):
//   A (16x16, .f16, a0..a7 in 4 regs): row = groupID      for i in {0,1,4,5}, groupID + 8 else;
//                                      col = 2 * threadID_in_group + (i & 1) (+ 8 for i >= 4)
//   B (16x8, .f16, b0..b3 in 2 regs):  row = 2 * threadID_in_group + (i & 1) (+ 8 for i >= 2);
//                                      col = groupID
//   C, D (16x8, .f32, c0..c3):         row = groupID (+ 8 for i >= 2);
//                                      col = 2 * threadID_in_group + (i & 1)
inline float half_bits_to_float(unsigned bits16) {
    _Float16 h;
    std::uint16_t b = static_cast<std::uint16_t>(bits16);
    std::memcpy(&h, &b, 2);
    return static_cast<float>(h);
}

inline int mma_a_row(int lane, int i) { return (lane >> 2) + ((i == 2 || i == 3 || i >= 6) ? 8 : 0); }
inline int mma_a_col(int lane, int i) { return 2 * (lane & 3) + (i & 1) + (i >= 4 ? 8 : 0); }
inline int mma_b_row(int lane, int i) { return 2 * (lane & 3) + (i & 1) + (i >= 2 ? 8 : 0); }
inline int mma_b_col(int lane, int /*i*/) { return lane >> 2; }
inline int mma_c_row(int lane, int i) { return (lane >> 2) + (i >= 2 ? 8 : 0); }
inline int mma_c_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }

// d = A * B + c for one 16x8x16 tile; d may alias c.
inline void mma_m16n8k16_f32_f16(float d[4], const unsigned a[4], const unsigned b[2],
                                 const float c[4]) {
    std::uint64_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    auto all = rendezvous(mine, 6);
    float A[16][16], B[16][8];
    for (int lane = 0; lane < 32; ++lane) {
        for (int i = 0; i < 8; ++i) {
            unsigned reg = unsigned(all[lane][i / 2]);
            A[mma_a_row(lane, i)][mma_a_col(lane, i)] = half_bits_to_float(i & 1 ? reg >> 16 : reg);
        }
        for (int i = 0; i < 4; ++i) {
            unsigned reg = unsigned(all[lane][4 + i / 2]);
            B[mma_b_row(lane, i)][mma_b_col(lane, i)] = half_bits_to_float(i & 1 ? reg >> 16 : reg);
        }
    }
    const int lane = int(tl_lane);
    float out[4];
    for (int i = 0; i < 4; ++i) {
        const int r = mma_c_row(lane, i), col = mma_c_col(lane, i);
        float acc = c[i];
        for (int kk = 0; kk < 16; ++kk) acc = std::fma(A[r][kk], B[kk][col], acc);  // exact products
        out[i] = acc;
    }
    for (int i = 0; i < 4; ++i) d[i] = out[i];
}

// cvt.rna.tf32.f32: x rounded to 10 mantissa bits, to nearest with ties away from zero (add
// half of the 13 dropped bits' weight to the magnitude, then cut them); NaN and +-inf pass
// through. The result is an fp32 bit pattern whose low 13 bits are zero.
inline unsigned cvt_rna_tf32(float x) {
    unsigned bits;
    std::memcpy(&bits, &x, 4);
    if ((bits & 0x7f800000u) == 0x7f800000u) return bits;   // inf / NaN
    return (bits + 0x1000u) & 0xffffe000u;
}

// A .tf32 operand register as the tensor core reads it: the top 19 bits (sign, exponent, 10
// mantissa bits); the low 13 bits are ignored, so an operand that skipped cvt.rna.tf32 is
// truncated here and a kernel that forgot its split shows ~1e-3 errors.
inline float tf32_operand(unsigned reg) {
    reg &= 0xffffe000u;
    float f;
    std::memcpy(&f, &reg, 4);
    return f;
}

// Fragment layouts of the PTX ISA for mma.m16n8k8 with .tf32 (one element per register):
//   A (16x8, a0..a3):  row = groupID (+ 8 for a1, a3);  col = threadID_in_group (+ 4 for a2, a3)
//   B (8x8, b0, b1):   row = threadID_in_group (+ 4 for b1);  col = groupID
//   C, D (16x8 .f32):  as for m16n8k16 (mma_c_row / mma_c_col)
inline int mma_tf32_a_row(int lane, int i) { return (lane >> 2) + (i & 1 ? 8 : 0); }
inline int mma_tf32_a_col(int lane, int i) { return (lane & 3) + (i >= 2 ? 4 : 0); }
inline int mma_tf32_b_row(int lane, int i) { return (lane & 3) + (i ? 4 : 0); }

// How a tensor core adds the products of one mma to its accumulator. Measurements of the
// hardware (Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior of NVIDIA tensor cores",
// PeerJ CS 2021) find the products exact, every term aligned to the largest one with the bits
// shifted out cut off (no guard bits), and the sum normalized toward zero. Each mma therefore
// loses up to an fp32 ulp of its largest term, always toward zero: a bias, not noise, so an
// accumulator that an mma chain carries over thousands of k-steps drifts by thousands of ulps
// (an fma chain's rounding to nearest grows only as the square root). 1 (the default) models
// that; 0 is the ideal fma chain, kept to measure what the model changes.
inline std::atomic<int> g_mma_truncates{1};
inline void set_mma_truncates(int on) { g_mma_truncates.store(on); }

// c + sum_k a[k] b[k] as the tensor core adds it (g_mma_truncates) or as an fma chain.
inline float mma_dot(float c, const float* a, const float* b, int n) {
    if (!g_mma_truncates.load(std::memory_order_relaxed)) {
        float acc = c;
        for (int kk = 0; kk < n; ++kk) acc = std::fma(a[kk], b[kk], acc);
        return acc;
    }
    double terms[17];
    terms[0] = c;
    int emax = INT_MIN;
    bool finite = std::isfinite(c);
    for (int kk = 0; kk < n; ++kk) {
        terms[kk + 1] = double(a[kk]) * double(b[kk]);   // exact: 11 (or 24) x 11 bits
        finite = finite && std::isfinite(terms[kk + 1]);
    }
    if (!finite) {   // inf / NaN (e.g. shared memory nobody wrote) propagate as they would
        double s = 0.0;
        for (int kk = 0; kk <= n; ++kk) s += terms[kk];
        return float(s);
    }
    for (int kk = 0; kk <= n; ++kk)
        if (terms[kk] != 0.0) emax = std::max(emax, std::ilogb(terms[kk]));
    if (emax == INT_MIN) return c;   // every term zero
    const double ulp = std::ldexp(1.0, emax - 23);   // fp32 ulp of the largest term
    double sum = 0.0;   // exact: at most 17 terms, each below 2^24 of these ulps
    for (int kk = 0; kk <= n; ++kk) sum += std::trunc(terms[kk] / ulp) * ulp;
    float r = float(sum);                             // to nearest, then toward zero
    if (std::fabs(double(r)) > std::fabs(sum)) r = std::nextafter(r, 0.0f);
    return r;
}

// d = A * B + c for one 16x8x8 tf32 tile; d may alias c. Products of two tf32 numbers are exact
// in fp32 (11 x 11 significant bits); their sum with c is mma_dot's.
inline void mma_m16n8k8_f32_tf32(float d[4], const unsigned a[4], const unsigned b[2],
                                 const float c[4]) {
    std::uint64_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    auto all = rendezvous(mine, 6);
    float A[16][8], B[8][8];
    for (int lane = 0; lane < 32; ++lane) {
        for (int i = 0; i < 4; ++i)
            A[mma_tf32_a_row(lane, i)][mma_tf32_a_col(lane, i)] = tf32_operand(unsigned(all[lane][i]));
        for (int i = 0; i < 2; ++i)
            B[mma_tf32_b_row(lane, i)][lane >> 2] = tf32_operand(unsigned(all[lane][4 + i]));
    }
    const int lane = int(tl_lane);
    float out[4];
    for (int i = 0; i < 4; ++i) {
        const int r = mma_c_row(lane, i), col = mma_c_col(lane, i);
        float bcol[8];
        for (int kk = 0; kk < 8; ++kk) bcol[kk] = B[kk][col];
        out[i] = mma_dot(c[i], A[r], bcol, 8);
    }
    for (int i = 0; i < 4; ++i) d[i] = out[i];
}

// ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16: lanes 8m .. 8m+7 give the addresses of the
// 8 rows (16 bytes = 8 halves each) of matrix m; register m of every lane receives from matrix m
//   no .trans: the two halves (row laneid / 4, cols 2 * (laneid % 4) + {0, 1})
//   .trans:    the two halves (rows 2 * (laneid % 4) + {0, 1}, col laneid / 4)  (column major)
// low half first. A group of four consecutive lanes thus holds one row (no .trans) or one column
// (.trans) of each matrix: exactly the A/B fragment rows above.
template <bool TRANS>
inline void ldmatrix_x4(unsigned r[4], const void* row_addr) {
    if (reinterpret_cast<std::uintptr_t>(row_addr) % 16) fail("ldmatrix: row address not 16-byte aligned");
    if (!in_shared(row_addr, 16)) fail("ldmatrix: row outside the dynamic shared memory");
    std::uint64_t mine = reinterpret_cast<std::uintptr_t>(row_addr);
    auto all = rendezvous(&mine, 1);
    const int lane = int(tl_lane);
    for (int m = 0; m < 4; ++m) {
        unsigned halves[2];
        for (int e = 0; e < 2; ++e) {
            const int row = TRANS ? 2 * (lane & 3) + e : lane >> 2;
            const int col = TRANS ? lane >> 2 : 2 * (lane & 3) + e;
            auto* p = reinterpret_cast<const unsigned char*>(std::uintptr_t(all[8 * m + row][0]));
            std::uint16_t v;
            std::memcpy(&v, p + 2 * col, 2);
            halves[e] = v;
        }
        r[m] = halves[0] | (halves[1] << 16);
    }
}

// Launch `body` (which calls the kernel) over grid x block; returns 0 or a negative error code.
template <class F>
int launch(dim3 grid, dim3 block, std::size_t smem, F&& body) {
    const std::size_t nthreads = std::size_t(block.x) * block.y * block.z;
    if (nthreads == 0 || nthreads > 1024) return -3;
    if (smem > g_arena_size) return -2;
    g_launch_smem = smem;
    const unsigned nwarps = unsigned((nthreads + 31) / 32);
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                if (g_arena) std::memset(g_arena, 0xFF, g_arena_size);  // poison shared memory
                Block blk;
                blk.bar = std::make_unique<std::barrier<>>(std::ptrdiff_t(nthreads));
                for (unsigned w = 0; w < nwarps; ++w) {
                    auto wp = std::make_unique<Warp>();
                    std::size_t n = std::min<std::size_t>(32, nthreads - std::size_t(w) * 32);
                    wp->bar = std::make_unique<std::barrier<>>(std::ptrdiff_t(n));
                    blk.warps.push_back(std::move(wp));
                }
                const std::uint64_t seed = g_seed.load() ^
                    ((std::uint64_t(bz) * 1315423911u + by) * 2654435761u + bx) * 0x9E3779B97F4A7C15ull;
                std::vector<std::thread> ts;
                ts.reserve(nthreads);
                for (std::size_t t = 0; t < nthreads; ++t) {
                    ts.emplace_back([&, t] {
                        threadIdx.x = unsigned(t % block.x);
                        threadIdx.y = unsigned((t / block.x) % block.y);
                        threadIdx.z = unsigned(t / (std::size_t(block.x) * block.y));
                        blockIdx.x = bx; blockIdx.y = by; blockIdx.z = bz;
                        blockDim = block;
                        gridDim = grid;
                        tl_block = &blk;
                        tl_lane = unsigned(t % 32);
                        tl_warp = unsigned(t / 32);
                        tl_rng = (seed + 0x632BE59BD9B4E019ull * (t + 1)) | 1;
                        body();
                        cp_async_check_drained();
                    });
                }
                for (auto& th : ts) th.join();
            }
    return 0;
}

}  // namespace emu

// ---------------------------------------------------------------------------- synchronisation
inline void __syncthreads() {
    emu::sched_point();
    emu::tl_block->bar->arrive_and_wait();
    emu::sched_point();
}
inline void __syncwarp(unsigned /*mask*/ = 0xffffffffu) {
    emu::sched_point();
    emu::my_warp().bar->arrive_and_wait();
    emu::sched_point();
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// Shuffles: every lane of the (full) warp must call them together, as on the GPU with a full
// mask. `width` splits the warp into segments as in CUDA.
template <class T>
inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
    unsigned base = emu::tl_lane & ~unsigned(width - 1);
    return emu::exchange(v, base + (unsigned(src) & unsigned(width - 1)));
}
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
    unsigned s = emu::tl_lane ^ unsigned(lane_mask);
    unsigned base = emu::tl_lane & ~unsigned(width - 1);
    if (s < base || s >= base + unsigned(width)) s = emu::tl_lane;
    return emu::exchange(v, s);
}
template <class T>
inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
    unsigned s = emu::tl_lane + delta;
    unsigned base = emu::tl_lane & ~unsigned(width - 1);
    if (s >= base + unsigned(width)) s = emu::tl_lane;
    return emu::exchange(v, s);
}
template <class T>
inline T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
    unsigned base = emu::tl_lane & ~unsigned(width - 1);
    unsigned s = (emu::tl_lane >= base + delta) ? emu::tl_lane - delta : emu::tl_lane;
    return emu::exchange(v, s);
}

// ---------------------------------------------------------------------------- atomics
template <class T> inline T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
template <class T> inline T atomicSub(T* p, T v) { return std::atomic_ref<T>(*p).fetch_sub(v); }
template <class T> inline T atomicExch(T* p, T v) { return std::atomic_ref<T>(*p).exchange(v); }
template <class T> inline T atomicMax(T* p, T v) {
    std::atomic_ref<T> a(*p);
    T cur = a.load();
    while (cur < v && !a.compare_exchange_weak(cur, v)) {}
    return cur;
}
template <class T> inline T atomicMin(T* p, T v) {
    std::atomic_ref<T> a(*p);
    T cur = a.load();
    while (cur > v && !a.compare_exchange_weak(cur, v)) {}
    return cur;
}
template <class T> inline T atomicCAS(T* p, T cmp, T v) {
    std::atomic_ref<T>(*p).compare_exchange_strong(cmp, v);
    return cmp;
}
