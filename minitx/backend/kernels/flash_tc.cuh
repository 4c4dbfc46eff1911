// minitx flash attention, fp16 on tensor cores (sm_80+): mma.sync.m16n8k16 (fp16 x fp16 -> fp32),
// fragments loaded with ldmatrix, K/V/Q/dO tiles streamed into shared memory with cp.async.
//
// FlashAttention-2 loop order: a block owns a tile of 64 rows (queries for the forward and dQ,
// keys for dK/dV), each of its 4 warps owns 16 of those rows (one mma "M"), and the other
// operand's tiles stream through shared memory. Scores, probabilities and accumulators never
// leave registers: the online softmax runs on the mma accumulator fragments, and the fp32
// accumulator fragment of S = Q K^T becomes, after rounding to fp16, the A fragment of P V
// without any data movement (see docs/cuda_kernel.md, "Fragments").
//
// Who owns what inside a warp (PTX ISA fragment layouts; g = lane / 4, t = lane % 4):
//   accumulator C (16 x 8 fp32, 4 registers): c0, c1 -> row g,     cols 2t, 2t + 1
//                                             c2, c3 -> row g + 8, cols 2t, 2t + 1
//   so a thread holds 2 rows (g and g + 8) of every 8-column tile, and the 4 lanes of a "quad"
//   (same g) together hold a whole row: row max / row sum = 2 shuffles (xor 1, xor 2).
//
// Kernels (D = 32, 64, 128; CAUSAL = bottom-right aligned causal mask):
//   flash_fwd_tc<D, CAUSAL>      grid (ceil(Nq / 64), B * H)   O, lse
//   flash_bwd_dq_tc<D, CAUSAL>   grid (ceil(Nq / 64), B * H)   dQ   (deterministic, no atomics)
//   flash_bwd_dkdv_tc<D, CAUSAL> grid (ceil(Nk / 64), B * H)   dK, dV per q head, fp32
// Shared memory is dynamic; tc_smem_bytes<D>(kind) gives its size (the launcher mirrors it).
#pragma once

#include "flash_common.cuh"

namespace minitx_flash {

// ------------------------------------------------------------------------------ tile shapes
template <int D>
struct TcCfg {
    static constexpr int kRows = 64;                   // rows a block owns (16 per warp)
    static constexpr int kStride = D + 8;              // smem row stride in halves: rows are
                                                       // 16 B apart mod 128 B -> ldmatrix reads
                                                       // 8 rows from 8 distinct bank groups
    static constexpr int kFwdBN = 64;                  // forward: keys per K/V tile
    static constexpr int kDqBN = D == 128 ? 32 : 64;   // dQ: keys per tile (double buffered)
    static constexpr int kDkdvBQ = D == 128 ? 32 : 64; // dK/dV: queries per tile (double buffered)
};

// Dynamic shared memory in bytes; kind 0 = fwd, 1 = dkdv, 2 = dq.
template <int D>
__host__ __device__ constexpr int tc_smem_bytes(int kind) {
    return kind == 0 ? 2 * (TcCfg<D>::kRows + 2 * TcCfg<D>::kFwdBN) * TcCfg<D>::kStride   // Q | K | V
         : kind == 1 ? 2 * (2 * TcCfg<D>::kRows + 4 * TcCfg<D>::kDkdvBQ) * TcCfg<D>::kStride
                           + 4 * 4 * TcCfg<D>::kDkdvBQ           // K, V | 2 x (Q, dO) | 2 x (lse, Dvec)
                     : 2 * (2 * TcCfg<D>::kRows + 4 * TcCfg<D>::kDqBN) * TcCfg<D>::kStride;  // Q, dO | 2 x (K, V)
}

// ------------------------------------------------------------------------------ warp GEMMs
// acc[NT] (16 x 8NT, fp32 C fragments) += A * B^T, where
//   A: 16 x 16KS fp16, rows a[r * sa + k] in shared memory (r < 16),
//   B: 8NT x 16KS fp16, rows b[n * sb + k] in shared memory ("[n][k]": K for Q K^T).
// Per k-step: one ldmatrix.x4 gives the A fragment (lane l -> row l % 16, k-half l / 16), and
// one ldmatrix.x4 per pair of n-tiles gives two B fragments (lane l -> n row (l % 8) + 8 (l / 16),
// k-half (l / 8) % 2); matrix m of ldmatrix is register m, see flash_common.cuh.
template <int KS, int NT>
__device__ __forceinline__ void warp_gemm_smem_nt(float (&acc)[NT][4], const __half* a, int sa,
                                                  const __half* b, int sb) {
    static_assert(NT % 2 == 0, "n-tiles come in pairs");
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
        unsigned af[4];
        ldmatrix_x4(af, a + (lane % 16) * sa + ks * 16 + (lane / 16) * 8);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            unsigned bf[4];   // {b0b1, b2b3} of n-tile 2np, then of n-tile 2np + 1
            ldmatrix_x4(bf, b + (np * 16 + lane % 8 + (lane / 16) * 8) * sb + ks * 16 +
                                ((lane / 8) % 2) * 8);
            mma_16816(acc[2 * np], af, bf);
            mma_16816(acc[2 * np + 1], af, bf + 2);
        }
    }
}

// Load a warp's 16 x 16KS fp16 A operand (rows a[r * sa + k]) into register fragments: the forward
// keeps Q's fragments in registers for the whole key loop (Q K^T is the loop's shared-memory-bound
// part: without it every k-step reads A again next to the B fragments).
template <int KS>
__device__ __forceinline__ void load_a_frags(unsigned (&af)[KS][4], const __half* a, int sa) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) ldmatrix_x4(af[ks], a + (lane % 16) * sa + ks * 16 + (lane / 16) * 8);
}

// acc[NT] (16 x 8NT fp32) += A * B^T with A as register fragments a[KS][4] and B as in
// warp_gemm_smem_nt ("[n][k]" rows in shared memory).
template <int KS, int NT>
__device__ __forceinline__ void warp_gemm_reg_nt(float (&acc)[NT][4], const unsigned (&a)[KS][4],
                                                 const __half* b, int sb) {
    static_assert(NT % 2 == 0, "n-tiles come in pairs");
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            unsigned bf[4];
            ldmatrix_x4(bf, b + (np * 16 + lane % 8 + (lane / 16) * 8) * sb + ks * 16 +
                                ((lane / 8) % 2) * 8);
            mma_16816(acc[2 * np], a[ks], bf);
            mma_16816(acc[2 * np + 1], a[ks], bf + 2);
        }
    }
}

// acc[NT] (16 x 8NT fp32) += A * B, where
//   A: 16 x 16KS fp16 as register fragments a[KS][4] (P or dS, from acc_to_a_frags),
//   B: 16KS x 8NT fp16, rows b[k * sb + n] in shared memory ("[k][n]": V for P V) -> .trans.
// ldmatrix.trans lane l -> k row (l % 8) + 8 ((l / 8) % 2), n-half l / 16.
template <int KS, int NT>
__device__ __forceinline__ void warp_gemm_reg_t(float (&acc)[NT][4], const unsigned (&a)[KS][4],
                                                const __half* b, int sb) {
    static_assert(NT % 2 == 0, "n-tiles come in pairs");
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            unsigned bf[4];
            ldmatrix_x4_trans(bf, b + (ks * 16 + lane % 8 + ((lane / 8) % 2) * 8) * sb + np * 16 +
                                      (lane / 16) * 8);
            mma_16816(acc[2 * np], a[ks], bf);
            mma_16816(acc[2 * np + 1], a[ks], bf + 2);
        }
    }
}

// The C fragments of two neighbouring 8-column tiles are, element for element, the A fragment of
// one 16-column k-step (rows g / g + 8, cols 2t, 2t + 1 and 8 + 2t, 9 + 2t): round to fp16, pack.
template <int NT>
__device__ __forceinline__ void acc_to_a_frags(unsigned (&a)[NT / 2][4], const float (&c)[NT][4]) {
#pragma unroll
    for (int j = 0; j < NT / 2; ++j) {
        a[j][0] = pack_half2(c[2 * j][0], c[2 * j][1]);          // a0 a1: row g,     k 2t
        a[j][1] = pack_half2(c[2 * j][2], c[2 * j][3]);          // a2 a3: row g + 8, k 2t
        a[j][2] = pack_half2(c[2 * j + 1][0], c[2 * j + 1][1]);  // a4 a5: row g,     k 8 + 2t
        a[j][3] = pack_half2(c[2 * j + 1][2], c[2 * j + 1][3]);  // a6 a7: row g + 8, k 8 + 2t
    }
}

// Store a warp's 16 x D fp32 accumulator, times `mul`, as fp16 rows r0 + g and r0 + 8 + g of a
// (n_rows, D) matrix (rows >= n_rows are skipped): two halves (4 bytes) per store.
template <int DT>
__device__ __forceinline__ void store_rows_f16(__half* dst, int r0, int n_rows, const float (&acc)[DT][4],
                                               const float (&mul)[2]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = r0 + g + 8 * hh;
        if (r >= n_rows) continue;
        unsigned* row = reinterpret_cast<unsigned*>(dst + (long long)r * (DT * 8));
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
            row[dt * 4 + t] = pack_half2(acc[dt][2 * hh] * mul[hh], acc[dt][2 * hh + 1] * mul[hh]);
    }
}

// ------------------------------------------------------------------------------ on C fragments
// A warp's 16 rows x 8NT columns of scores live in mma C fragments s[NT][4]: element e of tile
// nt is in row hh = e / 2 of the thread's two rows (g and g + 8) and column 8 nt + 2t + (e & 1).
// The steps below work element by element on that layout; the fp16 kernels here and the 3xTF32
// kernels (flash_tf32.cuh) share them, and differ only in their GEMMs.

// Forward: scores to log2 units (exp(x) = exp2(x log2 e)), -inf where the row may not see the
// key (checked only when the tile `need`s it: tiles on the causal diagonal, at the length cut,
// or under a key mask).
template <bool CAUSAL, int NT>
__device__ __forceinline__ void scale_and_mask(float (&s)[NT][4], float sl2, bool need, int b,
                                               const int (&row)[2], int k0, int kv_len, int Nq,
                                               int Nk, const unsigned char* kmask) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float x = s[nt][e] * sl2;
            if (need && !kept<CAUSAL>(b, row[e / 2], k0 + nt * 8 + 2 * t + (e & 1), kv_len, Nq,
                                      Nk, kmask))
                x = neg_inf();
            s[nt][e] = x;
        }
}

// Forward: one step of the online softmax, row by row (hh): m_new = max(m, rowmax),
// alpha = 2^(m - m_new), P = 2^(S - m_new) (in place of S), l = alpha l + rowsum(P) (this
// thread's columns only: the quad's sum is taken once, in finish_rows), O = alpha O.
template <int NT, int DT>
__device__ __forceinline__ void online_softmax(float (&s)[NT][4], float (&m)[2], float (&l)[2],
                                               float (&oacc)[DT][4]) {
    float alpha[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        float mx = m[hh];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * hh], s[nt][2 * hh + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));   // the quad holds the row
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float base = mx == neg_inf() ? 0.0f : mx;   // no key yet: every P is 2^-inf = 0
        alpha[hh] = exp2f(m[hh] - base);
        m[hh] = mx;
        float rs = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 2 * hh; e < 2 * hh + 2; ++e) {
                s[nt][e] = exp2f(s[nt][e] - base);
                rs += s[nt][e];
            }
        l[hh] = l[hh] * alpha[hh] + rs;
    }
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
        oacc[dt][0] *= alpha[0]; oacc[dt][1] *= alpha[0];
        oacc[dt][2] *= alpha[1]; oacc[dt][3] *= alpha[1];
    }
}

// Forward, after the last tile: l summed over the quad, lse = m ln 2 + ln l written for the
// thread's rows below Nq (lse_bh: this (batch, head)'s row of lse); returns 1 / l, and 0 with
// lse = -inf for a row that kept no key.
__device__ __forceinline__ void finish_rows(float (&l)[2], const float (&m)[2], const int (&row)[2],
                                            int Nq, float* lse_bh, float (&inv)[2]) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 1);
        l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 2);
        inv[hh] = l[hh] > 0.0f ? 1.0f / l[hh] : 0.0f;
        if (t == 0 && row[hh] < Nq)
            lse_bh[row[hh]] = l[hh] > 0.0f ? m[hh] * kLn2 + logf(l[hh]) : neg_inf();
    }
}

// dQ: the lse (log2 units; +inf for a row past Nq or one that kept no key, so its P is 0) and
// Dvec of the thread's two rows.
__device__ __forceinline__ void load_row_stats(const float* lse_bh, const float* dvec_bh,
                                               const int (&row)[2], int Nq, float (&lse2)[2],
                                               float (&dv_row)[2]) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const bool in = row[hh] < Nq;
        const float x = in ? lse_bh[row[hh]] : neg_inf();
        lse2[hh] = x == neg_inf() ? pos_inf() : x * kLog2e;
        dv_row[hh] = in ? dvec_bh[row[hh]] : 0.0f;
    }
}

// dQ: P = 2^(S log2e scale - lse log2e) (0 where masked), then dS = P (dP - Dvec), in dp.
template <bool CAUSAL, int NT>
__device__ __forceinline__ void ds_of_rows(const float (&s)[NT][4], float (&dp)[NT][4], float sl2,
                                           const float (&lse2)[2], const float (&dv_row)[2],
                                           bool need, int b, const int (&row)[2], int k0,
                                           int kv_len, int Nq, int Nk,
                                           const unsigned char* kmask) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int hh = e / 2;
            float p = exp2f(s[nt][e] * sl2 - lse2[hh]);
            if (need && !kept<CAUSAL>(b, row[hh], k0 + nt * 8 + 2 * t + (e & 1), kv_len, Nq, Nk,
                                      kmask))
                p = 0.0f;
            dp[nt][e] = p * (dp[nt][e] - dv_row[hh]);
        }
}

// dK/dV, transposed (rows are keys, columns queries q0 + c): P^T in s and dS^T = P^T (dP^T -
// Dvec) in dp, with each query's lse (log2 units) and Dvec read from shared memory (Ls, Dvs).
template <bool CAUSAL, int NT>
__device__ __forceinline__ void ds_of_cols(float (&s)[NT][4], float (&dp)[NT][4], float sl2,
                                           const float* Ls, const float* Dvs, bool need, int b,
                                           int q0, const int (&krow)[2], int kv_len, int Nq,
                                           int Nk, const unsigned char* kmask) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int c = nt * 8 + 2 * t + (e & 1);   // query column within the tile
            float p = exp2f(s[nt][e] * sl2 - Ls[c]);
            if (need && !kept<CAUSAL>(b, q0 + c, krow[e / 2], kv_len, Nq, Nk, kmask)) p = 0.0f;
            s[nt][e] = p;                             // P^T
            dp[nt][e] = p * (dp[nt][e] - Dvs[c]);      // dS^T
        }
}

// dK/dV: one query tile's lse (log2 units; +inf past Nq or for rows that kept no key, so P = 0)
// and Dvec into shared memory L[0 .. BQ) and L[BQ .. 2 BQ) (plain stores: visible after the
// next barrier).
template <int BQ>
__device__ __forceinline__ void stage_query_rows(float* L, int qt, int Nq, const float* lse_bh,
                                                 const float* dvec_bh) {
    for (int e = threadIdx.x; e < BQ; e += kThreads) {
        const int i = qt * BQ + e;
        const float x = i < Nq ? lse_bh[i] : neg_inf();
        L[e] = x == neg_inf() ? pos_inf() : x * kLog2e;
        L[BQ + e] = i < Nq ? dvec_bh[i] : 0.0f;
    }
}

// dK/dV: the warp's 16 keys of the fp32 accumulators into the per-q-head (B, H, Nk, D) buffers,
// dK times scale (keys >= Nk are skipped).
template <int DT>
__device__ __forceinline__ void store_dkdv(float* dk, float* dv, int bh, int Nk,
                                           const int (&krow)[2], const float (&dkacc)[DT][4],
                                           const float (&dvacc)[DT][4], float scale) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int j = krow[hh];
        if (j >= Nk) continue;
        float* dkr = dk + ((long long)bh * Nk + j) * (DT * 8);
        float* dvr = dv + ((long long)bh * Nk + j) * (DT * 8);
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            const int c = dt * 8 + 2 * t;
            dkr[c] = dkacc[dt][2 * hh] * scale;
            dkr[c + 1] = dkacc[dt][2 * hh + 1] * scale;
            dvr[c] = dvacc[dt][2 * hh];
            dvr[c + 1] = dvacc[dt][2 * hh + 1];
        }
    }
}

}  // namespace minitx_flash

// ------------------------------------------------------------------------------------------
// Forward. Block: 64 query rows q0 .. q0 + 63, warp w owns rows q0 + 16w .. q0 + 16w + 15, thread
// (g, t) owns rows q0 + 16w + g and + 8 (index hh = 0, 1) and, of every 8-key / 8-column tile,
// the columns 2t and 2t + 1. Per thread: Q fragments qf[D/16][4] (loaded once), S tile s[8][4]
// (64 keys), O accumulator o[D/8][4], running max m[2] and partial row sums l[2] (its own 16
// columns; the quad sum is taken once at the end). Shared: Q (64 x D) once, K and V (64 x D) one
// tile each, overlapped as
//     top:    wait K(t); barrier; start V(t)           V(t) lands while S = Q K(t)^T is computed
//     middle: wait V(t); barrier; start K(t + 1)       K(t+1) lands while O += P V(t)
// ------------------------------------------------------------------------------------------
// __launch_bounds__: D <= 64 fits in 128 registers (4 blocks = 16 warps per SM), D = 128 needs ~190
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, D <= 64 ? 4 : 2)
flash_fwd_tc(const __half* __restrict__ q, const __half* __restrict__ k,
             const __half* __restrict__ v, __half* __restrict__ o, float* __restrict__ lse,
             const int* __restrict__ lengths, const unsigned char* __restrict__ kmask,
             int H, int Hkv, int Nq, int Nk, float scale) {
    using namespace minitx_flash;
    using Cfg = TcCfg<D>;
    constexpr int BM = Cfg::kRows, BN = Cfg::kFwdBN, S = Cfg::kStride;
    constexpr int KS = D / 16;   // k-steps of Q K^T
    constexpr int NT = BN / 8;   // 8-key tiles of S per warp
    constexpr int DT = D / 8;    // 8-column tiles of O per warp
    extern __shared__ float flash_smem[];
    __half* Qs = reinterpret_cast<__half*>(flash_smem);   // BM x S
    __half* Ks = Qs + BM * S;                              // BN x S
    __half* Vs = Ks + BN * S;                              // BN x S

    const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    // causal: the last query tiles see the most keys; launch them first (better tail balance)
    const int q0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM;
    const int row[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};
    const __half* qb = q + (long long)bh * Nq * D;
    const __half* kb = k + ((long long)b * Hkv + hk) * Nk * D;
    const __half* vb = v + ((long long)b * Hkv + hk) * Nk * D;
    const int kv_len = key_end<false>(b, q0, BM, Nq, Nk, lengths);
    const int n_tiles = (key_end<CAUSAL>(b, q0, BM, Nq, Nk, lengths) + BN - 1) / BN;
    const float sl2 = scale * kLog2e;   // scores are kept in log2 units: exp(x) = exp2(x log2 e)

    float oacc[DT][4];
    zero(oacc);
    float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.0f, 0.0f};
    unsigned qf[KS][4];   // this warp's 16 Q rows as mma A fragments, loaded once

    if (n_tiles > 0) {
        load_tile_async<__half, D>(Qs, S, qb, q0, Nq, BM);
        load_tile_async<__half, D>(Ks, S, kb, 0, Nk, BN);
        cp_async_commit();
    }
    for (int it = 0; it < n_tiles; ++it) {
        const int k0 = it * BN;
        cp_async_wait<0>();
        __syncthreads();  // [tc_fwd:k-landed] K(it) (and Q) visible; every warp is done with V(it-1)
        load_tile_async<__half, D>(Vs, S, vb, k0, Nk, BN);
        cp_async_commit();
        if (it == 0) load_a_frags<KS>(qf, Qs + 16 * warp * S, S);

        // S = Q K^T for this warp's 16 rows x 64 keys
        float s[NT][4];
        zero(s);
        warp_gemm_reg_nt<KS, NT>(s, qf, Ks, S);

        // scale to log2 units and mask; the online softmax turns S into P and rescales O
        const bool need = tile_needs_mask<CAUSAL>(q0, k0, BN, kv_len, Nq, Nk, kmask);
        scale_and_mask<CAUSAL, NT>(s, sl2, need, b, row, k0, kv_len, Nq, Nk, kmask);
        online_softmax<NT, DT>(s, m, l, oacc);
        unsigned pf[NT / 2][4];   // P (fp16) as the A operand of P V: no shared memory needed
        acc_to_a_frags<NT>(pf, s);

        cp_async_wait<0>();
        __syncthreads();  // [tc_fwd:v-landed] V(it) visible; every warp is done with K(it)
        if (it + 1 < n_tiles) {
            load_tile_async<__half, D>(Ks, S, kb, k0 + BN, Nk, BN);
            cp_async_commit();
        }
        warp_gemm_reg_t<NT / 2, DT>(oacc, pf, Vs, S);
    }

    // O = acc / l; rows that kept no key: O = 0, lse = -inf
    float inv[2];
    finish_rows(l, m, row, Nq, lse + (long long)bh * Nq, inv);
    store_rows_f16<DT>(o + (long long)bh * Nq * D, q0 + 16 * warp, Nq, oacc, inv);
}

// ------------------------------------------------------------------------------------------
// Backward, dQ. Block: 64 query rows (warp w: rows q0 + 16w ..), loops over key tiles of BN keys
// (double buffered: tile t + 1 is copied while tile t is used). Recomputes, per tile,
//     S = Q K^T, P = 2^(S log2e scale - lse log2e), dP = dO V^T, dS = P (dP - Dvec),  dQ += dS K
// with Q and dO resident in shared memory, lse and Dvec of the thread's 2 rows in registers.
// ------------------------------------------------------------------------------------------
// __launch_bounds__: D <= 64 fits in 168 registers (3 blocks per SM), D = 128 needs ~180
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, D <= 64 ? 3 : 2)
flash_bwd_dq_tc(const __half* __restrict__ q, const __half* __restrict__ k,
                const __half* __restrict__ v, const __half* __restrict__ dout,
                const float* __restrict__ lse, const float* __restrict__ dvec,
                __half* __restrict__ dq, const int* __restrict__ lengths,
                const unsigned char* __restrict__ kmask, int H, int Hkv, int Nq, int Nk,
                float scale) {
    using namespace minitx_flash;
    using Cfg = TcCfg<D>;
    constexpr int BM = Cfg::kRows, BN = Cfg::kDqBN, S = Cfg::kStride;
    constexpr int KS = D / 16, NT = BN / 8, DT = D / 8;
    extern __shared__ float flash_smem[];
    __half* Qs = reinterpret_cast<__half*>(flash_smem);   // BM x S
    __half* dOs = Qs + BM * S;                             // BM x S
    __half* KV = dOs + BM * S;   // 2 stages of [K (BN x S) | V (BN x S)]
    // stage st: K at KV + st * 2 BN S, V right after it (pointer arithmetic, not a pointer array
    // indexed by st: that would live in local memory)

    const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    const int q0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM;
    const int row[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};
    const __half* qb = q + (long long)bh * Nq * D;
    const __half* dob = dout + (long long)bh * Nq * D;
    const __half* kb = k + ((long long)b * Hkv + hk) * Nk * D;
    const __half* vb = v + ((long long)b * Hkv + hk) * Nk * D;
    const int kv_len = key_end<false>(b, q0, BM, Nq, Nk, lengths);
    const int n_tiles = (key_end<CAUSAL>(b, q0, BM, Nq, Nk, lengths) + BN - 1) / BN;
    const float sl2 = scale * kLog2e;
    float lse2[2], dv_row[2];
    load_row_stats(lse + (long long)bh * Nq, dvec + (long long)bh * Nq, row, Nq, lse2, dv_row);

    float dqacc[DT][4];
    zero(dqacc);
    if (n_tiles > 0) {
        load_tile_async<__half, D>(Qs, S, qb, q0, Nq, BM);
        load_tile_async<__half, D>(dOs, S, dob, q0, Nq, BM);
        load_tile_async<__half, D>(KV, S, kb, 0, Nk, BN);
        load_tile_async<__half, D>(KV + BN * S, S, vb, 0, Nk, BN);
        cp_async_commit();
    }
    for (int it = 0; it < n_tiles; ++it) {
        const int k0 = it * BN, st = it & 1;
        const __half* Ks = KV + st * 2 * BN * S;
        const __half* Vs = Ks + BN * S;
        if (it + 1 < n_tiles) {   // prefetch the next tile into the other stage
            __half* Kn = KV + (st ^ 1) * 2 * BN * S;
            load_tile_async<__half, D>(Kn, S, kb, k0 + BN, Nk, BN);
            load_tile_async<__half, D>(Kn + BN * S, S, vb, k0 + BN, Nk, BN);
            cp_async_commit();
            cp_async_wait<1>();   // everything but the newest group (tile it + 1) has landed
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // [tc_dq:tile-landed]

        float s[NT][4], dp[NT][4];
        zero(s);
        zero(dp);
        warp_gemm_smem_nt<KS, NT>(s, Qs + 16 * warp * S, S, Ks, S);     // S  = Q  K^T
        warp_gemm_smem_nt<KS, NT>(dp, dOs + 16 * warp * S, S, Vs, S);   // dP = dO V^T
        const bool need = tile_needs_mask<CAUSAL>(q0, k0, BN, kv_len, Nq, Nk, kmask);
        ds_of_rows<CAUSAL, NT>(s, dp, sl2, lse2, dv_row, need, b, row, k0, kv_len, Nq, Nk, kmask);
        unsigned dsf[NT / 2][4];
        acc_to_a_frags<NT>(dsf, dp);
        warp_gemm_reg_t<NT / 2, DT>(dqacc, dsf, Ks, S);   // dQ += dS K
        __syncthreads();  // every warp is done with stage st before it is refilled
    }
    const float mul[2] = {scale, scale};
    store_rows_f16<DT>(dq + (long long)bh * Nq * D, q0 + 16 * warp, Nq, dqacc, mul);
}

// ------------------------------------------------------------------------------------------
// Backward, dK and dV. Block: 64 keys k0 .. k0 + 63 (warp w: keys k0 + 16w ..), K and V resident;
// loops over query tiles of BQ queries (double buffered, with their lse and Dvec), starting at
// the first tile that can see a key of the block (causal). Transposed recomputation, per tile:
//     S^T = K Q^T, P^T = 2^(S^T log2e scale - lse[query] log2e), dP^T = V dO^T,
//     dS^T = P^T (dP^T - Dvec[query]),  dV += P^T dO,  dK += dS^T Q
// Writes per-q-head fp32 dk, dv (B, H, Nk, D); the launcher sums GQA groups (deterministic).
// ------------------------------------------------------------------------------------------
namespace minitx_flash {

// Bytes of the dK/dV loop's shared memory with BQ-query tiles: K, V | 2 x (Q, dO) | 2 x (lse,
// Dvec). (flash_bwd_dkdv_tc's is tc_smem_bytes<D>(1); the levers of flash_tc_levers.cuh that
// share the loop lay out the same, with their own BQ, and tc_onepass adds its dS^T after it.)
template <int D, int BQ>
__host__ __device__ constexpr int dkdv_tc_smem_bytes() {
    return 2 * (2 * TcCfg<D>::kRows + 4 * BQ) * TcCfg<D>::kStride + 4 * 4 * BQ;
}

// What flash_bwd_dkdv_tc does after each query tile: nothing (the single-pass lever adds dS K
// to dQ there, flash_tc_levers.cuh).
struct NoTileStep {
    template <class Frags>
    __device__ __forceinline__ void operator()(const Frags&, int, const __half*) const {}
};

}  // namespace minitx_flash

// The dK/dV loop, one block. Shared by flash_bwd_dkdv_tc (BQ = TcCfg's, K and V read from shared
// memory at every tile, no tile step) and two levers: KV_IN_REGS keeps the warp's K and V rows
// as mma A fragments for the whole loop (tc_kvreg), and tile_step(dsf, q0, Ks) runs after each
// tile's dV and dK updates, before the barrier that frees the tile (tc_onepass adds dS K to dQ
// there; dsf is the warp's dS^T as fp16 A fragments).
// (Outside the namespace: its `extern __shared__` declaration must name the same array as the
// kernels' in the CPU emulation, where it is an ordinary global.)
template <int D, bool CAUSAL, int BQ, bool KV_IN_REGS, class TileStep>
__device__ __forceinline__ void dkdv_tc_loop(const __half* __restrict__ q,
                                             const __half* __restrict__ k,
                                             const __half* __restrict__ v,
                                             const __half* __restrict__ dout,
                                             const float* __restrict__ lse,
                                             const float* __restrict__ dvec,
                                             float* __restrict__ dk, float* __restrict__ dv,
                                             const int* __restrict__ lengths,
                                             const unsigned char* __restrict__ kmask, int H,
                                             int Hkv, int Nq, int Nk, float scale,
                                             TileStep tile_step) {
    using namespace minitx_flash;
    using Cfg = TcCfg<D>;
    constexpr int BK = Cfg::kRows, S = Cfg::kStride;
    constexpr int KS = D / 16, NT = BQ / 8, DT = D / 8;
    extern __shared__ float flash_smem[];
    __half* Ks = reinterpret_cast<__half*>(flash_smem);    // BK x S
    __half* Vs = Ks + BK * S;                              // BK x S
    __half* QdO = Vs + BK * S;   // 2 stages of [Q (BQ x S) | dO (BQ x S)]
    float* LD = reinterpret_cast<float*>(QdO + 4 * BQ * S);   // 2 stages of [lse log2e | Dvec] (BQ each)

    const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    const int k0 = blockIdx.x * BK;
    const int krow[2] = {k0 + 16 * warp + g, k0 + 16 * warp + g + 8};
    const int diag = Nk - Nq;
    const __half* qb = q + (long long)bh * Nq * D;
    const __half* dob = dout + (long long)bh * Nq * D;
    const float* lseb = lse + (long long)bh * Nq;
    const float* dvb = dvec + (long long)bh * Nq;
    const __half* kb = k + ((long long)b * Hkv + hk) * Nk * D;
    const __half* vb = v + ((long long)b * Hkv + hk) * Nk * D;
    const int kv_len = key_end<false>(b, 0, Nq, Nq, Nk, lengths);
    int q_first = CAUSAL ? k0 - diag : 0;   // the first query that sees key k0
    q_first = q_first < 0 ? 0 : q_first;
    const int qt_begin = q_first / BQ;
    const int qt_end = k0 < kv_len ? (Nq + BQ - 1) / BQ : 0;   // keys all cut by lengths: none
    const float sl2 = scale * kLog2e;

    float dkacc[DT][4], dvacc[DT][4];
    zero(dkacc);
    zero(dvacc);
    unsigned kf[KV_IN_REGS ? KS : 1][4], vf[KV_IN_REGS ? KS : 1][4];   // KV_IN_REGS: K, V rows
    if (qt_begin < qt_end) {
        load_tile_async<__half, D>(Ks, S, kb, k0, Nk, BK);
        load_tile_async<__half, D>(Vs, S, vb, k0, Nk, BK);
        load_tile_async<__half, D>(QdO, S, qb, qt_begin * BQ, Nq, BQ);
        load_tile_async<__half, D>(QdO + BQ * S, S, dob, qt_begin * BQ, Nq, BQ);
        cp_async_commit();
        stage_query_rows<BQ>(LD, qt_begin, Nq, lseb, dvb);
    }
    for (int qt = qt_begin; qt < qt_end; ++qt) {
        const int q0 = qt * BQ, st = (qt - qt_begin) & 1;
        const __half* Qs = QdO + st * 2 * BQ * S;
        const __half* dOs = Qs + BQ * S;
        const float* Ls = LD + st * 2 * BQ;
        const float* Dvs = Ls + BQ;
        if (qt + 1 < qt_end) {
            __half* Qn = QdO + (st ^ 1) * 2 * BQ * S;
            load_tile_async<__half, D>(Qn, S, qb, q0 + BQ, Nq, BQ);
            load_tile_async<__half, D>(Qn + BQ * S, S, dob, q0 + BQ, Nq, BQ);
            cp_async_commit();
            stage_query_rows<BQ>(LD + (st ^ 1) * 2 * BQ, qt + 1, Nq, lseb, dvb);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // [tc_dkdv:tile-landed]

        float s[NT][4], dp[NT][4];   // 16 keys x BQ queries (transposed scores)
        zero(s);
        zero(dp);
        if constexpr (KV_IN_REGS) {
            if (qt == qt_begin) {   // K and V have landed with the first tile
                load_a_frags<KS>(kf, Ks + 16 * warp * S, S);
                load_a_frags<KS>(vf, Vs + 16 * warp * S, S);
            }
            warp_gemm_reg_nt<KS, NT>(s, kf, Qs, S);     // S^T  = K Q^T
            warp_gemm_reg_nt<KS, NT>(dp, vf, dOs, S);   // dP^T = V dO^T
        } else {
            warp_gemm_smem_nt<KS, NT>(s, Ks + 16 * warp * S, S, Qs, S);     // S^T  = K Q^T
            warp_gemm_smem_nt<KS, NT>(dp, Vs + 16 * warp * S, S, dOs, S);   // dP^T = V dO^T
        }
        const bool need = tile_needs_mask<CAUSAL>(q0, k0, BK, kv_len, Nq, Nk, kmask);
        ds_of_cols<CAUSAL, NT>(s, dp, sl2, Ls, Dvs, need, b, q0, krow, kv_len, Nq, Nk, kmask);
        unsigned pf[NT / 2][4], dsf[NT / 2][4];
        acc_to_a_frags<NT>(pf, s);
        acc_to_a_frags<NT>(dsf, dp);
        warp_gemm_reg_t<NT / 2, DT>(dvacc, pf, dOs, S);   // dV += P^T dO
        warp_gemm_reg_t<NT / 2, DT>(dkacc, dsf, Qs, S);   // dK += dS^T Q
        tile_step(dsf, q0, Ks);
        __syncthreads();  // every warp is done with stage st before it is refilled
    }
    store_dkdv<DT>(dk, dv, bh, Nk, krow, dkacc, dvacc, scale);
}

// __launch_bounds__: two fp32 D-wide accumulators per thread; D = 32 fits in 168 registers
// (3 blocks per SM), D = 64 / 128 need ~220-240 (2 blocks)
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, D <= 32 ? 3 : 2)
flash_bwd_dkdv_tc(const __half* __restrict__ q, const __half* __restrict__ k,
                  const __half* __restrict__ v, const __half* __restrict__ dout,
                  const float* __restrict__ lse, const float* __restrict__ dvec,
                  float* __restrict__ dk, float* __restrict__ dv,
                  const int* __restrict__ lengths, const unsigned char* __restrict__ kmask,
                  int H, int Hkv, int Nq, int Nk, float scale) {
    using namespace minitx_flash;
    dkdv_tc_loop<D, CAUSAL, TcCfg<D>::kDkdvBQ, false>(q, k, v, dout, lse, dvec, dk, dv, lengths,
                                                      kmask, H, Hkv, Nq, Nk, scale, NoTileStep{});
}
