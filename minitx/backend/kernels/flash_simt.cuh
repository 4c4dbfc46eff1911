// minitx flash attention, fp32 on CUDA cores: register-tiled (every thread computes a small
// R x X tile of scores and an R x D/8 tile of the output, from 128-bit shared-memory loads), tiles
// copied into shared memory with cp.async (plain 16-byte copies below sm_80).
//
// Thread layout (all three kernels): 128 threads = 16 row groups x 8 lanes. Thread (rg, c),
// rg = tid / 8, c = tid % 8, owns
//   * rows R rg .. R rg + R - 1 of the block's row tile (R = rows / 16: 4 for 64 rows, 2 for 32),
//   * of the streamed tile, the X = cols / 8 rows c, c + 8, c + 16, ...  (strided: the 8 lanes of
//     a row group then read 8 different rows whose float4 chunks fall into 8 different bank
//     groups: row stride D + 4 floats = 4 banks apart),
//   * of the D output columns, the D / 32 float4 chunks 4 (c + 8u) .. 4 (c + 8u) + 3, u < D / 32
//     (the 8 lanes together read 128 contiguous bytes of a row: conflict free).
// The 8 lanes of a row group are consecutive lanes of one warp, so a row's max and sum are
// reduced with three __shfl_xor_sync (1, 2, 4), and a row group's P tile in shared memory is
// written and read by its own warp only.
//
// Kernels (D = 32, 64, 128; CAUSAL = bottom-right aligned causal mask):
//   flash_fwd_simt<D, CAUSAL>       grid (ceil(Nq / 64), B * H)          O, lse
//   flash_bwd_dq_simt<D, CAUSAL>    grid (ceil(Nq / BM), B * H)          dQ
//   flash_bwd_dkdv_simt<D, CAUSAL>  grid (ceil(Nk / BK), B * H)          dK, dV per q head
// Tile shapes are in SimtCfg<D> (D = 128 halves some tiles so that two blocks fit in an A100 SM);
// simt_smem_bytes<D>(kind) gives the dynamic shared memory (the launcher mirrors it).
#pragma once

#include "flash_common.cuh"

namespace minitx_flash {

template <int D>
struct SimtCfg {
    static constexpr int kStride = D + 4;                // fp32 row stride (16-byte rows)
    static constexpr int kFwdBM = 64;                    // forward: query rows per block
    static constexpr int kFwdBN = D == 128 ? 32 : 64;    //          keys per tile
    static constexpr int kDqBM = D == 128 ? 32 : 64;     // dQ: query rows per block
    static constexpr int kDqBN = 32;                     //     keys per tile
    static constexpr int kDkdvBK = D == 128 ? 32 : 64;   // dK/dV: keys per block
    static constexpr int kDkdvBQ = 32;                   //        queries per tile
};

// Dynamic shared memory in bytes; kind 0 = fwd, 1 = dkdv, 2 = dq.
template <int D>
__host__ __device__ constexpr int simt_smem_bytes(int kind) {
    using C = SimtCfg<D>;
    return 4 * (kind == 0 ? (C::kFwdBM + 2 * C::kFwdBN) * C::kStride + C::kFwdBM * (C::kFwdBN + 4)
              : kind == 1 ? 2 * (C::kDkdvBK + C::kDkdvBQ) * C::kStride
                                + C::kDkdvBK * (C::kDkdvBQ + 4) + 2 * C::kDkdvBQ
                          : 2 * (C::kDqBM + C::kDqBN) * C::kStride + C::kDqBM * (C::kDqBN + 4));
}

// acc[i][x] += dot(A row i, B row c + 8x) over D: A = the thread's R rows (a, stride D + 4),
// B = the streamed tile (b = its row c). Per 4 columns: R + X float4 loads for 4 R X FMAs.
template <int D, int R, int X>
__device__ __forceinline__ void simt_dot_tile(float (&acc)[R][X], const float* a, const float* b) {
    constexpr int S = D + 4;
#pragma unroll 2
    for (int d = 0; d < D; d += 4) {
        float4 av[R];
#pragma unroll
        for (int i = 0; i < R; ++i) av[i] = *reinterpret_cast<const float4*>(a + i * S + d);
#pragma unroll
        for (int x = 0; x < X; ++x) {
            const float4 bv = *reinterpret_cast<const float4*>(b + 8 * x * S + d);
#pragma unroll
            for (int i = 0; i < R; ++i) {
                acc[i][x] = fmaf(av[i].x, bv.x, acc[i][x]);
                acc[i][x] = fmaf(av[i].y, bv.y, acc[i][x]);
                acc[i][x] = fmaf(av[i].z, bv.z, acc[i][x]);
                acc[i][x] = fmaf(av[i].w, bv.w, acc[i][x]);
            }
        }
    }
}

// acc[i][u][.] += sum_{j < J} P[row i][j] * V[j][4 (c + 8u) ..]: P = the thread's R rows of a
// probability-like tile (p, stride ps), V = (J, D) rows in shared memory (stride D + 4), and
// `c` = the thread's lane in its row group. Per 4 keys: R + 4 D/32 float4 loads for 16 R D/32 FMAs.
template <int D, int R, int J>
__device__ __forceinline__ void simt_pv(float (&acc)[R][D / 32][4], const float* p, int ps,
                                        const float* v, int c) {
    constexpr int S = D + 4, U = D / 32;
#pragma unroll 2
    for (int j = 0; j < J; j += 4) {
        float pv[R][4];
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const float4 x = *reinterpret_cast<const float4*>(p + i * ps + j);
            pv[i][0] = x.x; pv[i][1] = x.y; pv[i][2] = x.z; pv[i][3] = x.w;
        }
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const float4 vv = *reinterpret_cast<const float4*>(v + (j + jj) * S + 4 * (c + 8 * u));
#pragma unroll
                for (int i = 0; i < R; ++i) {
                    acc[i][u][0] = fmaf(pv[i][jj], vv.x, acc[i][u][0]);
                    acc[i][u][1] = fmaf(pv[i][jj], vv.y, acc[i][u][1]);
                    acc[i][u][2] = fmaf(pv[i][jj], vv.z, acc[i][u][2]);
                    acc[i][u][3] = fmaf(pv[i][jj], vv.w, acc[i][u][3]);
                }
            }
    }
}

// Reduce over the 8 lanes of a row group (consecutive lanes).
__device__ __forceinline__ float group8_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
}
__device__ __forceinline__ float group8_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x + __shfl_xor_sync(0xffffffffu, x, 4);
}

// Store R rows x (D/32 float4 chunks) of an accumulator, times `mul`, into rows r0 + i of a
// (n_rows, D) fp32 matrix (rows >= n_rows skipped).
template <int D, int R>
__device__ __forceinline__ void simt_store_rows(float* dst, int r0, int n_rows,
                                                const float (&acc)[R][D / 32][4], float mul, int c) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
        if (r0 + i >= n_rows) continue;
        float* row = dst + (long long)(r0 + i) * D;
#pragma unroll
        for (int u = 0; u < D / 32; ++u)
            *reinterpret_cast<float4*>(row + 4 * (c + 8 * u)) =
                make_float4(acc[i][u][0] * mul, acc[i][u][1] * mul, acc[i][u][2] * mul,
                            acc[i][u][3] * mul);
    }
}

template <int R, int U>
__device__ __forceinline__ void zero(float (&acc)[R][U][4]) {
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int u = 0; u < U; ++u) acc[i][u][0] = acc[i][u][1] = acc[i][u][2] = acc[i][u][3] = 0.0f;
}

}  // namespace minitx_flash

// ------------------------------------------------------------------------------------------
// Forward. Block: 64 query rows; thread (rg, c): rows q0 + 4 rg .. + 3, keys c + 8x of each tile,
// output chunks c + 8u. Shared: Q (64 x D), K, V (BN x D) one tile each, P (64 x BN). Overlap:
//     top:    wait K(t); barrier; start V(t)        S = Q K^T, softmax, P -> shared, while V lands
//     middle: wait V(t); barrier; start K(t + 1)    O = alpha O + P V, while K(t+1) lands
// ------------------------------------------------------------------------------------------
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 3)
flash_fwd_simt(const float* __restrict__ q, const float* __restrict__ k,
               const float* __restrict__ v, float* __restrict__ o, float* __restrict__ lse,
               const int* __restrict__ lengths, const unsigned char* __restrict__ kmask,
               int H, int Hkv, int Nq, int Nk, float scale) {
    using namespace minitx_flash;
    using Cfg = SimtCfg<D>;
    constexpr int BM = Cfg::kFwdBM, BN = Cfg::kFwdBN, S = Cfg::kStride, PS = BN + 4;
    constexpr int R = BM / 16, X = BN / 8, U = D / 32;
    extern __shared__ float flash_smem[];
    float* Qs = flash_smem;          // BM x S
    float* Ks = Qs + BM * S;         // BN x S
    float* Vs = Ks + BN * S;         // BN x S
    float* Ps = Vs + BN * S;         // BM x PS

    const int rg = threadIdx.x / 8, c = threadIdx.x % 8;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    const int q0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM;
    const int r0 = q0 + R * rg;      // this thread's first row
    const float* qb = q + (long long)bh * Nq * D;
    const float* kb = k + ((long long)b * Hkv + hk) * Nk * D;
    const float* vb = v + ((long long)b * Hkv + hk) * Nk * D;
    const int kv_len = key_end<false>(b, q0, BM, Nq, Nk, lengths);
    const int n_tiles = (key_end<CAUSAL>(b, q0, BM, Nq, Nk, lengths) + BN - 1) / BN;
    const float sl2 = scale * kLog2e;

    float oacc[R][U][4];
    zero(oacc);
    float m[R], l[R];
#pragma unroll
    for (int i = 0; i < R; ++i) { m[i] = neg_inf(); l[i] = 0.0f; }

    if (n_tiles > 0) {
        load_tile_async<float, D>(Qs, S, qb, q0, Nq, BM);
        load_tile_async<float, D>(Ks, S, kb, 0, Nk, BN);
        cp_async_commit();
    }
    for (int it = 0; it < n_tiles; ++it) {
        const int k0 = it * BN;
        cp_async_wait<0>();
        __syncthreads();  // [simt_fwd:k-landed] K(it) (and Q) visible; everyone done with V, P
        load_tile_async<float, D>(Vs, S, vb, k0, Nk, BN);
        cp_async_commit();

        float s[R][X];
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
            for (int x = 0; x < X; ++x) s[i][x] = 0.0f;
        simt_dot_tile<D, R, X>(s, Qs + R * rg * S, Ks + c * S);

        const bool need = tile_needs_mask<CAUSAL>(q0, k0, BN, kv_len, Nq, Nk, kmask);
#pragma unroll
        for (int i = 0; i < R; ++i) {
            float mx = m[i];
#pragma unroll
            for (int x = 0; x < X; ++x) {
                float y = s[i][x] * sl2;
                if (need && !kept<CAUSAL>(b, r0 + i, k0 + c + 8 * x, kv_len, Nq, Nk, kmask))
                    y = neg_inf();
                s[i][x] = y;
                mx = fmaxf(mx, y);
            }
            mx = group8_max(mx);
            const float base = mx == neg_inf() ? 0.0f : mx;
            const float alpha = exp2f(m[i] - base);
            m[i] = mx;
            float rs = 0.0f;
#pragma unroll
            for (int x = 0; x < X; ++x) {
                const float p = exp2f(s[i][x] - base);
                Ps[(R * rg + i) * PS + c + 8 * x] = p;
                rs += p;
            }
            l[i] = l[i] * alpha + rs;   // this lane's partial row sum; summed over the group at the end
#pragma unroll
            for (int u = 0; u < U; ++u) {
                oacc[i][u][0] *= alpha; oacc[i][u][1] *= alpha;
                oacc[i][u][2] *= alpha; oacc[i][u][3] *= alpha;
            }
        }

        cp_async_wait<0>();
        __syncthreads();  // [simt_fwd:v-landed] V(it) and P visible; everyone done with K(it)
        if (it + 1 < n_tiles) {
            load_tile_async<float, D>(Ks, S, kb, k0 + BN, Nk, BN);
            cp_async_commit();
        }
        simt_pv<D, R, BN>(oacc, Ps + R * rg * PS, PS, Vs, c);
    }

#pragma unroll
    for (int i = 0; i < R; ++i) {
        const float lt = group8_sum(l[i]);
        const bool any = lt > 0.0f;
        if (r0 + i < Nq) {
            float* orow = o + ((long long)bh * Nq + r0 + i) * D;
            const float inv = any ? 1.0f / lt : 0.0f;
#pragma unroll
            for (int u = 0; u < U; ++u)
                *reinterpret_cast<float4*>(orow + 4 * (c + 8 * u)) =
                    make_float4(oacc[i][u][0] * inv, oacc[i][u][1] * inv, oacc[i][u][2] * inv,
                                oacc[i][u][3] * inv);
            if (c == 0) lse[(long long)bh * Nq + r0 + i] = any ? m[i] * kLn2 + logf(lt) : neg_inf();
        }
    }
}

// ------------------------------------------------------------------------------------------
// Backward, dQ. Block: BM query rows (thread: R rows); loops over key tiles of 32 keys. Per tile:
// S = Q K^T, dP = dO V^T (register tiles), P = 2^(S scale log2e - lse log2e), dS = P (dP - Dvec)
// -> shared (the row group's rows), dQ += dS K. Overlap: V(t + 1) is copied during dQ += dS K(t),
// K(t + 1) during the next tile's wait.
// ------------------------------------------------------------------------------------------
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 3)
flash_bwd_dq_simt(const float* __restrict__ q, const float* __restrict__ k,
                  const float* __restrict__ v, const float* __restrict__ dout,
                  const float* __restrict__ lse, const float* __restrict__ dvec,
                  float* __restrict__ dq, const int* __restrict__ lengths,
                  const unsigned char* __restrict__ kmask, int H, int Hkv, int Nq, int Nk,
                  float scale) {
    using namespace minitx_flash;
    using Cfg = SimtCfg<D>;
    constexpr int BM = Cfg::kDqBM, BN = Cfg::kDqBN, S = Cfg::kStride, TS = BN + 4;
    constexpr int R = BM / 16, X = BN / 8, U = D / 32;
    extern __shared__ float flash_smem[];
    float* Qs = flash_smem;          // BM x S
    float* dOs = Qs + BM * S;        // BM x S
    float* Ks = dOs + BM * S;        // BN x S
    float* Vs = Ks + BN * S;         // BN x S
    float* Ts = Vs + BN * S;         // BM x TS   (dS)

    const int rg = threadIdx.x / 8, c = threadIdx.x % 8;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    const int q0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM;
    const int r0 = q0 + R * rg;
    const float* qb = q + (long long)bh * Nq * D;
    const float* dob = dout + (long long)bh * Nq * D;
    const float* kb = k + ((long long)b * Hkv + hk) * Nk * D;
    const float* vb = v + ((long long)b * Hkv + hk) * Nk * D;
    const int kv_len = key_end<false>(b, q0, BM, Nq, Nk, lengths);
    const int n_tiles = (key_end<CAUSAL>(b, q0, BM, Nq, Nk, lengths) + BN - 1) / BN;
    const float sl2 = scale * kLog2e;
    float lse2[R], dv_row[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const bool in = r0 + i < Nq;
        const float x = in ? lse[(long long)bh * Nq + r0 + i] : neg_inf();
        lse2[i] = x == neg_inf() ? pos_inf() : x * kLog2e;   // fully masked row: P = 0
        dv_row[i] = in ? dvec[(long long)bh * Nq + r0 + i] : 0.0f;
    }

    float dqacc[R][U][4];
    zero(dqacc);
    if (n_tiles > 0) {
        load_tile_async<float, D>(Qs, S, qb, q0, Nq, BM);
        load_tile_async<float, D>(dOs, S, dob, q0, Nq, BM);
        load_tile_async<float, D>(Ks, S, kb, 0, Nk, BN);
        load_tile_async<float, D>(Vs, S, vb, 0, Nk, BN);
        cp_async_commit();
    }
    for (int it = 0; it < n_tiles; ++it) {
        const int k0 = it * BN;
        cp_async_wait<0>();
        __syncthreads();  // [simt_dq:tile-landed] K(it), V(it) visible; everyone done with dS, K(it-1)

        float s[R][X], dp[R][X];
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
            for (int x = 0; x < X; ++x) s[i][x] = dp[i][x] = 0.0f;
        simt_dot_tile<D, R, X>(s, Qs + R * rg * S, Ks + c * S);     // S  = Q  K^T
        simt_dot_tile<D, R, X>(dp, dOs + R * rg * S, Vs + c * S);   // dP = dO V^T
        const bool need = tile_needs_mask<CAUSAL>(q0, k0, BN, kv_len, Nq, Nk, kmask);
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
            for (int x = 0; x < X; ++x) {
                float p = exp2f(s[i][x] * sl2 - lse2[i]);
                if (need && !kept<CAUSAL>(b, r0 + i, k0 + c + 8 * x, kv_len, Nq, Nk, kmask)) p = 0.0f;
                Ts[(R * rg + i) * TS + c + 8 * x] = p * (dp[i][x] - dv_row[i]);   // dS
            }
        __syncthreads();  // dS visible; everyone done with V(it)
        if (it + 1 < n_tiles) {
            load_tile_async<float, D>(Vs, S, vb, k0 + BN, Nk, BN);
        }
        simt_pv<D, R, BN>(dqacc, Ts + R * rg * TS, TS, Ks, c);       // dQ += dS K
        __syncthreads();  // everyone done with K(it)
        if (it + 1 < n_tiles) {
            load_tile_async<float, D>(Ks, S, kb, k0 + BN, Nk, BN);
            cp_async_commit();
        }
    }
    simt_store_rows<D, R>(dq + (long long)bh * Nq * D, r0, Nq, dqacc, scale, c);
}

// ------------------------------------------------------------------------------------------
// Backward, dK and dV. Block: BK keys (thread: R key rows), K and V resident; loops over query
// tiles of 32 (from the first that can see the block's keys). Per tile: S^T = K Q^T and
// dP^T = V dO^T (register tiles), P^T and dS^T = P^T (dP^T - Dvec) in registers; P^T -> shared,
// dV += P^T dO; dS^T -> the same shared rows, dK += dS^T Q. Overlap: dO(t + 1) is copied during
// dK += dS^T Q(t). Writes per-q-head fp32 dk, dv (B, H, Nk, D); the launcher sums GQA groups.
// ------------------------------------------------------------------------------------------
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 3)
flash_bwd_dkdv_simt(const float* __restrict__ q, const float* __restrict__ k,
                    const float* __restrict__ v, const float* __restrict__ dout,
                    const float* __restrict__ lse, const float* __restrict__ dvec,
                    float* __restrict__ dk, float* __restrict__ dv,
                    const int* __restrict__ lengths, const unsigned char* __restrict__ kmask,
                    int H, int Hkv, int Nq, int Nk, float scale) {
    using namespace minitx_flash;
    using Cfg = SimtCfg<D>;
    constexpr int BK = Cfg::kDkdvBK, BQ = Cfg::kDkdvBQ, S = Cfg::kStride, TS = BQ + 4;
    constexpr int R = BK / 16, X = BQ / 8, U = D / 32;
    extern __shared__ float flash_smem[];
    float* Ks = flash_smem;          // BK x S
    float* Vs = Ks + BK * S;         // BK x S
    float* Qs = Vs + BK * S;         // BQ x S
    float* dOs = Qs + BQ * S;        // BQ x S
    float* Ts = dOs + BQ * S;        // BK x TS   (P^T, then dS^T)
    float* Ls = Ts + BK * TS;        // BQ        lse log2e (+inf: row without keys / past Nq)
    float* Dvs = Ls + BQ;            // BQ        Dvec

    const int rg = threadIdx.x / 8, c = threadIdx.x % 8;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    const int k0 = blockIdx.x * BK;
    const int j0 = k0 + R * rg;      // this thread's first key row
    const int diag = Nk - Nq;
    const float* qb = q + (long long)bh * Nq * D;
    const float* dob = dout + (long long)bh * Nq * D;
    const float* lseb = lse + (long long)bh * Nq;
    const float* dvb = dvec + (long long)bh * Nq;
    const float* kb = k + ((long long)b * Hkv + hk) * Nk * D;
    const float* vb = v + ((long long)b * Hkv + hk) * Nk * D;
    const int kv_len = key_end<false>(b, 0, Nq, Nq, Nk, lengths);
    int q_first = CAUSAL ? k0 - diag : 0;
    q_first = q_first < 0 ? 0 : q_first;
    const int qt_begin = q_first / BQ;
    const int qt_end = k0 < kv_len ? (Nq + BQ - 1) / BQ : 0;
    const float sl2 = scale * kLog2e;

    auto stage_rows = [&](int qt) {   // plain loads; visible after the next barrier
        for (int e = threadIdx.x; e < BQ; e += kThreads) {
            const int i = qt * BQ + e;
            const float x = i < Nq ? lseb[i] : neg_inf();
            Ls[e] = x == neg_inf() ? pos_inf() : x * kLog2e;
            Dvs[e] = i < Nq ? dvb[i] : 0.0f;
        }
    };

    float dkacc[R][U][4], dvacc[R][U][4];
    zero(dkacc);
    zero(dvacc);
    if (qt_begin < qt_end) {
        load_tile_async<float, D>(Ks, S, kb, k0, Nk, BK);
        load_tile_async<float, D>(Vs, S, vb, k0, Nk, BK);
        load_tile_async<float, D>(Qs, S, qb, qt_begin * BQ, Nq, BQ);
        load_tile_async<float, D>(dOs, S, dob, qt_begin * BQ, Nq, BQ);
        cp_async_commit();
        stage_rows(qt_begin);
    }
    for (int qt = qt_begin; qt < qt_end; ++qt) {
        const int q0 = qt * BQ;
        cp_async_wait<0>();
        __syncthreads();  // [simt_dkdv:tile-landed] Q(qt), dO(qt), lse, Dvec visible

        float s[R][X], dp[R][X];
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
            for (int x = 0; x < X; ++x) s[i][x] = dp[i][x] = 0.0f;
        simt_dot_tile<D, R, X>(s, Ks + R * rg * S, Qs + c * S);     // S^T  = K Q^T
        simt_dot_tile<D, R, X>(dp, Vs + R * rg * S, dOs + c * S);   // dP^T = V dO^T
        const bool need = tile_needs_mask<CAUSAL>(q0, k0, BK, kv_len, Nq, Nk, kmask);
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
            for (int x = 0; x < X; ++x) {
                const int col = c + 8 * x;                       // query within the tile
                float p = exp2f(s[i][x] * sl2 - Ls[col]);
                if (need && !kept<CAUSAL>(b, q0 + col, j0 + i, kv_len, Nq, Nk, kmask)) p = 0.0f;
                s[i][x] = p;                                     // P^T
                dp[i][x] = p * (dp[i][x] - Dvs[col]);            // dS^T
                Ts[(R * rg + i) * TS + col] = p;
            }
        __syncwarp();     // the row group's P^T rows are written (the group is one warp's lanes)
        simt_pv<D, R, BQ>(dvacc, Ts + R * rg * TS, TS, dOs, c);     // dV += P^T dO
        __syncthreads();  // everyone done with dO(qt), lse, Dvec
        if (qt + 1 < qt_end) {
            load_tile_async<float, D>(dOs, S, dob, q0 + BQ, Nq, BQ);
            stage_rows(qt + 1);
        }
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
            for (int x = 0; x < X; ++x) Ts[(R * rg + i) * TS + c + 8 * x] = dp[i][x];
        __syncwarp();
        simt_pv<D, R, BQ>(dkacc, Ts + R * rg * TS, TS, Qs, c);      // dK += dS^T Q
        __syncthreads();  // everyone done with Q(qt) and their dS^T rows
        if (qt + 1 < qt_end) {
            load_tile_async<float, D>(Qs, S, qb, q0 + BQ, Nq, BQ);
            cp_async_commit();
        }
    }
    simt_store_rows<D, R>(dk + (long long)bh * Nk * D, j0, Nk, dkacc, scale, c);
    simt_store_rows<D, R>(dv + (long long)bh * Nk * D, j0, Nk, dvacc, 1.0f, c);
}
