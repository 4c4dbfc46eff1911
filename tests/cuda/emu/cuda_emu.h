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
//     expf/__expf/logf/fmaxf/fmaf/rsqrtf/__fdividef/__int_as_float and INFINITY.
// Blocks run one after another; all threads of a block run concurrently. Scheduling noise:
// every barrier/shuffle is a "scheduling point" where a thread yields with a configurable
// probability (emu::set_yield_permille), so a missing barrier loses its race reliably.
// A thread that leaves the kernel early while others wait at a barrier hangs the launch (the
// test harness runs every launch in a child process with a timeout and reports the hang).
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
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

struct Warp {
    std::unique_ptr<std::barrier<>> bar;
    std::uint64_t buf[32];
};

struct Block {
    std::unique_ptr<std::barrier<>> bar;
    std::vector<std::unique_ptr<Warp>> warps;
};

inline thread_local Block* tl_block = nullptr;
inline thread_local unsigned tl_lane = 0;
inline thread_local unsigned tl_warp = 0;
inline thread_local std::uint64_t tl_rng = 0x9E3779B97F4A7C15ull;

inline unsigned char* g_arena = nullptr;
inline std::size_t g_arena_size = 0;
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

inline Warp& my_warp() { return *tl_block->warps[tl_warp]; }

template <class T>
inline T exchange(T v, unsigned src_lane) {
    static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
    Warp& w = my_warp();
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    w.buf[tl_lane] = bits;
    sched_point();
    w.bar->arrive_and_wait();
    T r;
    std::uint64_t got = w.buf[src_lane];
    std::memcpy(&r, &got, sizeof(T));
    sched_point();
    w.bar->arrive_and_wait();  // nobody overwrites buf before every lane has read it
    return r;
}

// Launch `body` (which calls the kernel) over grid x block; returns 0 or a negative error code.
template <class F>
int launch(dim3 grid, dim3 block, std::size_t smem, F&& body) {
    const std::size_t nthreads = std::size_t(block.x) * block.y * block.z;
    if (nthreads == 0 || nthreads > 1024) return -3;
    if (smem > g_arena_size) return -2;
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
