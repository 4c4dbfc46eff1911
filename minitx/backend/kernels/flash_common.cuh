// minitx flash attention: what both kernel families share.
//
//   * the masking rules (lengths, key mask, bottom-right causal) and the tile-range helpers,
//   * fp16 <-> fp32 conversion, -inf,
//   * the three PTX instructions of the fast kernels, each as a small __device__ function whose
//     body is inline asm on the GPU and, under -DMINITX_EMULATION, the CPU emulation with the same
//     register-level signature (tests/gpu/cuda/emu/cuda_emu.h), so the kernels are the same code in
//     both worlds:
//         cp_async_16 / cp_async_commit / cp_async_wait<N>   (sm_80+; plain copies below sm_80)
//         ldmatrix_x4 / ldmatrix_x4_trans                   (sm_75+)
//         mma_16816 (fp16), mma_1688 and to_tf32 (tf32)      (sm_80+)
//   * flash_bwd_dot<T>, the tiny pre-pass of every backward: Dvec = rowsum(dO * O).
//
// Layout conventions (all tensors contiguous, row major):
//   q (B, H, Nq, D), k and v (B, Hkv, Nk, D), o (B, H, Nq, D), lse (B, H, Nq) float32.
//   q head h reads kv head h / (H / Hkv). D is the compiled (padded) head dim: 32, 64 or 128.
// Masking: key j of batch b is kept for query i iff
//   j < lengths[b] (lengths may be null)  and  kmask[b * Nk + j] != 0 (kmask may be null)
//   and, when CAUSAL, j <= i + (Nk - Nq)   (bottom-right alignment: the last query sees every key).
// A query row with no kept key gets o = 0 and lse = -inf, and zero gradients (never NaN).
#pragma once

#ifdef MINITX_EMULATION
#include "cuda_emu.h"
#else
#include <cuda_fp16.h>
#endif

namespace minitx_flash {

// [[maybe_unused]]: an NVRTC module of the naive kernels alone uses none of them (warning 177).
[[maybe_unused]] constexpr int kThreads = 128;   // threads per block, every kernel: 4 warps
[[maybe_unused]] constexpr float kLog2e = 1.4426950408889634f;   // exp(x) = exp2(x * log2(e))
[[maybe_unused]] constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// Two fp16 values in one 32-bit register, `lo` in the low half (the order mma fragments use).
__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
    return unsigned(__half_as_ushort(__float2half_rn(lo))) |
           (unsigned(__half_as_ushort(__float2half_rn(hi))) << 16);
}

// ------------------------------------------------------------------------------ masking
// Keys a tile of query rows [q0, q0 + rows) may see: j < key_end (lengths and causal only; the
// key mask is checked per key). Keys >= key_end are masked for every row of the tile.
template <bool CAUSAL>
__device__ __forceinline__ int key_end(int b, int q0, int rows, int Nq, int Nk,
                                       const int* lengths) {
    int end = Nk;
    if (lengths != nullptr) {
        int len = lengths[b];
        len = len < 0 ? 0 : len;
        end = len < end ? len : end;
    }
    if (CAUSAL) {
        const int last_row = (q0 + rows < Nq ? q0 + rows : Nq) - 1;
        int lim = last_row + (Nk - Nq) + 1;   // the tile's last row sees keys < lim
        lim = lim < 0 ? 0 : lim;
        end = lim < end ? lim : end;
    }
    return end;
}

// Is key j (< Nk) kept for query i? kv_len = min(Nk, lengths[b]) (key_end<false>).
template <bool CAUSAL>
__device__ __forceinline__ bool kept(int b, int i, int j, int kv_len, int Nq, int Nk,
                                     const unsigned char* kmask) {
    if (j >= kv_len) return false;
    if (kmask != nullptr && kmask[(long long)b * Nk + j] == 0) return false;
    return !CAUSAL || j <= i + (Nk - Nq);
}

// Does the tile of rows [q0, q0 + rows) x keys [k0, k0 + cols) need per-element masking? Not
// when every key is below kv_len, there is no key mask and (causal) even the tile's first row
// sees the tile's last key. Interior tiles skip the mask arithmetic entirely.
template <bool CAUSAL>
__device__ __forceinline__ bool tile_needs_mask(int q0, int k0, int cols, int kv_len, int Nq,
                                                int Nk, const unsigned char* kmask) {
    if (kmask != nullptr || k0 + cols > kv_len) return true;
    return CAUSAL && k0 + cols - 1 > q0 + (Nk - Nq);
}

// ------------------------------------------------------------------------------ cp.async
// Copy 16 bytes global -> shared without passing through registers; src_bytes < 16 zero fills
// the rest (0 = a row outside the matrix becomes zeros, never garbage: 0 * garbage can be NaN).
// The copy lands only after cp_async_wait retires its group; commit closes a group.
#if defined(MINITX_EMULATION)
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
    emu::cp_async_16(smem, gmem, src_bytes);
}
__device__ __forceinline__ void cp_async_commit() { emu::cp_async_commit(); }
template <int N> __device__ __forceinline__ void cp_async_wait() { emu::cp_async_wait(N); }
#elif __CUDA_ARCH__ >= 800
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// "memory": the compiler must not move shared-memory accesses across the copy or the wait
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#else   // sm_70 / sm_75 (fp32 kernels only): an ordinary synchronous 16-byte copy
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
    int4 v = make_int4(0, 0, 0, 0);
    if (src_bytes == 16) v = *reinterpret_cast<const int4*>(gmem);   // rows are whole or absent
    *reinterpret_cast<int4*>(smem) = v;
}
__device__ __forceinline__ void cp_async_commit() {}
template <int N> __device__ __forceinline__ void cp_async_wait() {}
#endif

// Start copying `rows` rows of a (n_rows, D) matrix of T, from row r0, into shared memory with
// row stride `stride` elements. Rows >= n_rows become zeros. 16-byte chunks are spread over the
// block's threads so consecutive threads read consecutive global addresses (coalesced).
template <typename T, int D>
__device__ __forceinline__ void load_tile_async(T* dst, int stride, const T* __restrict__ src,
                                                int r0, int n_rows, int rows) {
    constexpr int kChunk = 16 / sizeof(T);      // elements per 16-byte chunk (4 fp32, 8 fp16)
    constexpr int kPerRow = D / kChunk;
    for (int e = threadIdx.x; e < rows * kPerRow; e += kThreads) {
        const int r = e / kPerRow, c = (e - r * kPerRow) * kChunk;
        const int gr = r0 + r;
        const bool in = gr < n_rows;
        const T* g = src + (long long)(in ? gr : 0) * D + c;   // a valid address even if unused
        cp_async_16(dst + r * stride + c, g, in ? 16 : 0);
    }
}

// ------------------------------------------------------------------------------ tensor cores
// ldmatrix.x4: lane l gives the shared address of row (l % 8) of 8x8 matrix (l / 8) (16 bytes,
// 8 fp16); register m receives matrix m's elements (row l / 4, cols 2 (l % 4) + {0, 1})
// (.trans: rows 2 (l % 4) + {0, 1}, col l / 4). See docs/cuda_kernel.md for the pictures.
__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], const __half* row) {
#ifdef MINITX_EMULATION
    emu::ldmatrix_x4<false>(r, row);
#else
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned r[4], const __half* row) {
#ifdef MINITX_EMULATION
    emu::ldmatrix_x4<true>(r, row);
#else
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
#endif
}

// acc (16x8 fp32 C/D fragment) += A (16x16 fp16 fragment, 4 regs) * B (16x8 fp16, 2 regs).
__device__ __forceinline__ void mma_16816(float acc[4], const unsigned a[4], const unsigned b[2]) {
#ifdef MINITX_EMULATION
    emu::mma_m16n8k16_f32_f16(acc, a, b, acc);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// tf32(x): x rounded to tf32 (10 mantissa bits, to nearest, ties away from zero), in a 32-bit
// register whose low 13 bits are zero; the operand format of mma_1688.
__device__ __forceinline__ unsigned to_tf32(float x) {
#ifdef MINITX_EMULATION
    return emu::cvt_rna_tf32(x);
#else
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
#endif
}

// acc (16x8 fp32 C/D fragment) += A (16x8 tf32 fragment, 4 regs) * B (8x8 tf32, 2 regs).
__device__ __forceinline__ void mma_1688(float acc[4], const unsigned a[4], const unsigned b[2]) {
#ifdef MINITX_EMULATION
    emu::mma_m16n8k8_f32_tf32(acc, a, b, acc);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

template <int NT>
__device__ __forceinline__ void zero(float (&acc)[NT][4]) {
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

}  // namespace minitx_flash

// ------------------------------------------------------------------------------------------
// Backward pre-pass: Dvec[row] = sum_d dO[row, d] * O[row, d]  (rows = B * H * Nq), one warp per
// row (lanes stride over d, then a __shfl_down_sync tree). grid = ceil(rows / 4), block = 128.
// ------------------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(128, 4)
flash_bwd_dot(const T* __restrict__ o, const T* __restrict__ dout, float* __restrict__ dvec,
              int rows, int D) {
    const int lane = threadIdx.x % 32;
    const long long row = (long long)blockIdx.x * (128 / 32) + threadIdx.x / 32;
    float acc = 0.0f;
    if (row < rows) {
        const T* orow = o + row * D;
        const T* drow = dout + row * D;
        for (int d = lane; d < D; d += 32)
            acc = fmaf(minitx_flash::to_f(orow[d]), minitx_flash::to_f(drow[d]), acc);
    }
    for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
    if (row < rows && lane == 0) dvec[row] = acc;
}
