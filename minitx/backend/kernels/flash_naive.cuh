// minitx flash attention, the naive kernels: one thread per row, fp32, online softmax.
//
// Read these first. They compute what the tiled kernels compute (same masks, same lse, same
// empty-row rule, flash_common.cuh) in the plainest way there is: thread i of one (batch, head)
// walks over every key j it may see, holding a running max m, a running sum l and its output
// row acc[D] in registers, and rescales l and acc whenever the max grows (the online softmax):
//
//     s = scale q_i . k_j       m' = max(m, s)
//     alpha = e^(m - m')        p = e^(s - m')
//     l = alpha l + p           acc = alpha acc + p v_j
//     m = m'
//     after the last key: o_i = acc / l, lse_i = m + ln l
//
// Why it is slow: every thread reads all of K and V from global memory by itself (a block of
// 128 rows reads each key 128 times; the tiled kernels copy a tile once per block into shared
// memory and reuse it for 64 rows), every loaded value feeds one FMA, and nothing runs on the
// tensor cores. flash_simt.cuh and flash_tc.cuh are the same loop made fast.
//
// Kernels (fp32; D = 32, 64, 128, the launcher zero pads other head dims; block = 128 threads;
// __launch_bounds__(128, 3) as the CUDA-core kernels: <= 168 registers, enough for acc[128]),
// each a thread per row, and writing:
//   flash_fwd_naive<D, CAUSAL>       query row: O, lse
//   flash_bwd_dkdv_naive<D, CAUSAL>  key row: dK, dV
//   flash_bwd_dq_naive<D, CAUSAL>    query row: dQ
// Each grid is (ceil(rows / 128), B * H), rows being the Nq queries or the Nk keys.
// The backward recomputes P = e^(s - lse) from the forward's lse and takes Dvec = rowsum(dO * O)
// from flash_bwd_dot<float> (flash_common.cuh). dK and dV are written per q head in fp32; the
// launcher sums GQA groups. Every output element has one writer: no atomics, deterministic.
#pragma once

#include "flash_common.cuh"

namespace minitx_flash {

// dot(a, b) over D floats. Unrolled by 4, not fully: fully unrolled, the compiler may hoist a
// whole q row into registers beside acc[128], which does not fit without spills.
template <int D>
__device__ __forceinline__ float naive_dot(const float* a, const float* b) {
    float s = 0.0f;
#pragma unroll 4
    for (int d = 0; d < D; ++d) s = fmaf(a[d], b[d], s);
    return s;
}

// P[i][j] = e^(scale q_i . k_j - lse_i), or 0 for a masked key or a row that kept no key.
template <int D, bool CAUSAL>
__device__ __forceinline__ float naive_prob(const float* qi, const float* kj, float lse_i,
                                            float scale, int b, int i, int j, int kv_len,
                                            int Nq, int Nk, const unsigned char* kmask) {
    if (lse_i == neg_inf() || !kept<CAUSAL>(b, i, j, kv_len, Nq, Nk, kmask)) return 0.0f;
    return expf(scale * naive_dot<D>(qi, kj) - lse_i);
}

}  // namespace minitx_flash

// ------------------------------------------------------------------------------------------
// Forward: thread = query row i; keys j < key_end (min(Nk, lengths[b]) and, when causal,
// j <= i + Nk - Nq), skipping keys the key mask drops.
// ------------------------------------------------------------------------------------------
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 3)
flash_fwd_naive(const float* __restrict__ q, const float* __restrict__ k,
                const float* __restrict__ v, float* __restrict__ o, float* __restrict__ lse,
                const int* __restrict__ lengths, const unsigned char* __restrict__ kmask,
                int H, int Hkv, int Nq, int Nk, float scale) {
    using namespace minitx_flash;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;          // this thread's query row
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);   // GQA: kv head hk
    if (i >= Nq) return;
    const float* qi = q + ((long long)bh * Nq + i) * D;
    const float* kb = k + ((long long)b * Hkv + hk) * Nk * D;
    const float* vb = v + ((long long)b * Hkv + hk) * Nk * D;
    const int kv_len = key_end<false>(b, i, 1, Nq, Nk, lengths);  // min(Nk, lengths[b])
    const int end = key_end<CAUSAL>(b, i, 1, Nq, Nk, lengths);    // and the causal limit

    float m = neg_inf(), l = 0.0f, acc[D];
#pragma unroll
    for (int d = 0; d < D; ++d) acc[d] = 0.0f;
    for (int j = 0; j < end; ++j) {
        if (!kept<CAUSAL>(b, i, j, kv_len, Nq, Nk, kmask)) continue;
        const float* kj = kb + (long long)j * D;                  // read from global memory,
        const float* vj = vb + (long long)j * D;                  // by every thread, every time
        const float s = scale * naive_dot<D>(qi, kj);
        const float m_new = fmaxf(m, s);
        const float alpha = expf(m - m_new);    // 0 at the first kept key (m = -inf)
        const float p = expf(s - m_new);
        l = alpha * l + p;
#pragma unroll
        for (int d = 0; d < D; ++d) acc[d] = alpha * acc[d] + p * vj[d];
        m = m_new;
    }

    float* oi = o + ((long long)bh * Nq + i) * D;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;                 // no kept key: o = 0
#pragma unroll
    for (int d = 0; d < D; ++d) oi[d] = acc[d] * inv;
    lse[(long long)bh * Nq + i] = l > 0.0f ? m + logf(l) : neg_inf();
}

// ------------------------------------------------------------------------------------------
// Backward, dK and dV: thread = key row j of q head h; two passes over the queries
// that may see key j, one accumulator each (both at once would not fit in the
// registers at D = 128):
//     pass 1:  dV_j = sum_i P_ij dO_i
//     pass 2:  dK_j = scale sum_i dS_ij q_i
// where dS_ij = P_ij (dO_i . v_j - Dvec_i).
// ------------------------------------------------------------------------------------------
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 3)
flash_bwd_dkdv_naive(const float* __restrict__ q, const float* __restrict__ k,
                     const float* __restrict__ v, const float* __restrict__ dout,
                     const float* __restrict__ lse, const float* __restrict__ dvec,
                     float* __restrict__ dk, float* __restrict__ dv,
                     const int* __restrict__ lengths, const unsigned char* __restrict__ kmask,
                     int H, int Hkv, int Nq, int Nk, float scale) {
    using namespace minitx_flash;
    const int j = blockIdx.x * blockDim.x + threadIdx.x;          // this thread's key row
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    if (j >= Nk) return;
    const float* kj = k + (((long long)b * Hkv + hk) * Nk + j) * D;
    const float* vj = v + (((long long)b * Hkv + hk) * Nk + j) * D;
    const float* qb = q + (long long)bh * Nq * D;
    const float* dob = dout + (long long)bh * Nq * D;
    const int kv_len = key_end<false>(b, 0, Nq, Nq, Nk, lengths);
    const int first = CAUSAL && j - (Nk - Nq) > 0 ? j - (Nk - Nq) : 0;   // first i seeing j

    float acc[D];
#pragma unroll
    for (int d = 0; d < D; ++d) acc[d] = 0.0f;
    for (int i = first; i < Nq; ++i) {                            // pass 1: dV_j
        const float* qi = qb + (long long)i * D;
        const float* doi = dob + (long long)i * D;
        const float p = naive_prob<D, CAUSAL>(qi, kj, lse[(long long)bh * Nq + i], scale, b, i,
                                              j, kv_len, Nq, Nk, kmask);
        if (p == 0.0f) continue;                                  // nothing to add
#pragma unroll
        for (int d = 0; d < D; ++d) acc[d] = fmaf(p, doi[d], acc[d]);
    }
    float* dvj = dv + ((long long)bh * Nk + j) * D;
#pragma unroll
    for (int d = 0; d < D; ++d) { dvj[d] = acc[d]; acc[d] = 0.0f; }

    for (int i = first; i < Nq; ++i) {                            // pass 2: dK_j
        const float* qi = qb + (long long)i * D;
        const float* doi = dob + (long long)i * D;
        const float p = naive_prob<D, CAUSAL>(qi, kj, lse[(long long)bh * Nq + i], scale, b, i,
                                              j, kv_len, Nq, Nk, kmask);
        if (p == 0.0f) continue;                                  // dS_ij = 0
        const float ds = p * (naive_dot<D>(doi, vj) - dvec[(long long)bh * Nq + i]);
#pragma unroll
        for (int d = 0; d < D; ++d) acc[d] = fmaf(ds, qi[d], acc[d]);
    }
    float* dkj = dk + ((long long)bh * Nk + j) * D;
#pragma unroll
    for (int d = 0; d < D; ++d) dkj[d] = scale * acc[d];
}

// ------------------------------------------------------------------------------------------
// Backward, dQ: thread = query row i;  dQ_i = scale sum_j dS_ij k_j over the keys it saw.
// ------------------------------------------------------------------------------------------
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 3)
flash_bwd_dq_naive(const float* __restrict__ q, const float* __restrict__ k,
                   const float* __restrict__ v, const float* __restrict__ dout,
                   const float* __restrict__ lse, const float* __restrict__ dvec,
                   float* __restrict__ dq, const int* __restrict__ lengths,
                   const unsigned char* __restrict__ kmask, int H, int Hkv, int Nq, int Nk,
                   float scale) {
    using namespace minitx_flash;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;          // this thread's query row
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    if (i >= Nq) return;
    const float* qi = q + ((long long)bh * Nq + i) * D;
    const float* doi = dout + ((long long)bh * Nq + i) * D;
    const float* kb = k + ((long long)b * Hkv + hk) * Nk * D;
    const float* vb = v + ((long long)b * Hkv + hk) * Nk * D;
    const float lse_i = lse[(long long)bh * Nq + i], dvec_i = dvec[(long long)bh * Nq + i];
    const int kv_len = key_end<false>(b, i, 1, Nq, Nk, lengths);
    const int end = key_end<CAUSAL>(b, i, 1, Nq, Nk, lengths);

    float acc[D];
#pragma unroll
    for (int d = 0; d < D; ++d) acc[d] = 0.0f;
    for (int j = 0; j < end; ++j) {
        const float* kj = kb + (long long)j * D;
        const float p = naive_prob<D, CAUSAL>(qi, kj, lse_i, scale, b, i, j, kv_len, Nq, Nk,
                                              kmask);
        if (p == 0.0f) continue;                                  // dS_ij = 0
        const float ds = p * (naive_dot<D>(doi, vb + (long long)j * D) - dvec_i);
#pragma unroll
        for (int d = 0; d < D; ++d) acc[d] = fmaf(ds, kj[d], acc[d]);
    }
    float* dqi = dq + ((long long)bh * Nq + i) * D;
#pragma unroll
    for (int d = 0; d < D; ++d) dqi[d] = scale * acc[d];
}
