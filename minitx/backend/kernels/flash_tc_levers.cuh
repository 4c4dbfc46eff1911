// minitx flash attention, fp16 on tensor cores: three levers on the tc kernels (flash_tc.cuh),
// each a kernel of its own behind a MINITX_FLASH_KERNEL value, so that a GPU run times each
// change against the kernel it replaces (the other passes of a lever's family are tc's):
//
//   tc_bm128    flash_fwd_tc_bm128<D, CAUSAL>      grid (ceil(Nq / 128), B * H)   O, lse
//       Two 16-row m-tiles per warp, 128 query rows a block. In flash_fwd_tc every K fragment of
//       S = Q K^T and every V fragment of O += P V is read from shared memory (ldmatrix) for one
//       mma; here each feeds two, so the loop's shared-memory reads per mma halve.
//   tc_kvreg    flash_bwd_dkdv_tc_kvreg<D, CAUSAL> grid (ceil(Nk / 64), B * H)    dK, dV fp32
//       The block's K and V rows stay in registers as mma A fragments for the whole query loop
//       (flash_bwd_dkdv_tc reads them from shared memory again for every query tile).
//   tc_onepass  flash_bwd_dkdv_tc_onepass<D, CAUSAL> grid (ceil(Nk / 64), B * H)  dK, dV, dQ fp32
//       FlashAttention-2's single pass: the dK/dV kernel, which has dS for its keys anyway, also
//       adds dS K into a float32 dQ with atomicAdd, so the dQ kernel (which recomputes S and dP:
//       two of the backward's seven matmuls) is not run. The additions of different key blocks
//       into one dQ element come in whatever order the blocks run, so dQ's last bits vary from
//       run to run: the one family here that is not deterministic.
//
// Fragment layouts, masks and the online softmax are flash_tc.cuh's (its header comment).
#pragma once

#include "flash_common.cuh"
#include "flash_tc.cuh"

namespace minitx_flash {

// ------------------------------------------------------------------------------ tile shapes
template <int D>
struct TcBm128Cfg {
    static constexpr int kRows = 128;                  // 4 warps x 2 m-tiles x 16 rows
    static constexpr int kStride = D + 8;
    static constexpr int kFwdBN = D == 128 ? 32 : 64;  // keys per K/V tile
    static constexpr bool kQInRegs = D <= 64;          // D = 128: two m-tiles of fp32 O
                                                       // accumulators are 128 registers alone
};

template <int D>
struct TcKvregCfg {
    static constexpr int kRows = 64;                   // keys a block owns
    static constexpr int kStride = D + 8;
    // queries per tile (double buffered); at D = 128 the K and V fragments take 64 registers,
    // paid for with a tile of 16 queries (S^T and dP^T fragments: 16 registers, not 32)
    static constexpr int kBQ = D == 128 ? 16 : TcCfg<D>::kDkdvBQ;
};

// Bytes of dynamic shared memory of each lever's kernel.
template <int D>
__host__ __device__ constexpr int tc_bm128_smem_bytes() {
    return 2 * (TcBm128Cfg<D>::kRows + 2 * TcBm128Cfg<D>::kFwdBN) * TcBm128Cfg<D>::kStride;
}
// tc's dK/dV layout with the lever's query tile
template <int D>
__host__ __device__ constexpr int tc_kvreg_smem_bytes() {
    return dkdv_tc_smem_bytes<D, TcKvregCfg<D>::kBQ>();
}
// tc's dK/dV layout, then the block's dS^T (64 keys x BQ queries, rows padded by 8 halves)
template <int D>
__host__ __device__ constexpr int tc_onepass_smem_bytes() {
    return tc_smem_bytes<D>(1) + 2 * TcCfg<D>::kRows * (TcCfg<D>::kDkdvBQ + 8);
}

// ------------------------------------------------------------------------------ warp GEMMs
// Two m-tiles (MT = 2) sharing every B fragment: acc[m][NT] (16 x 8NT fp32) += A_m * B^T with
// the A_m as register fragments and B rows b[n * sb + k] in shared memory ("[n][k]").
template <int KS, int NT>
__device__ __forceinline__ void warp_gemm_reg_nt_x2(float (&acc)[2][NT][4],
                                                    const unsigned (&a)[2][KS][4],
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
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                mma_16816(acc[m][2 * np], a[m][ks], bf);
                mma_16816(acc[m][2 * np + 1], a[m][ks], bf + 2);
            }
        }
    }
}

// The same with both A operands in shared memory (rows a[r * sa + k], m-tile m at a + 16 m sa):
// per k-step their two fragments are loaded, then every B fragment feeds both.
template <int KS, int NT>
__device__ __forceinline__ void warp_gemm_smem_nt_x2(float (&acc)[2][NT][4], const __half* a,
                                                     int sa, const __half* b, int sb) {
    static_assert(NT % 2 == 0, "n-tiles come in pairs");
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
        unsigned af[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m)
            ldmatrix_x4(af[m], a + (16 * m + lane % 16) * sa + ks * 16 + (lane / 16) * 8);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            unsigned bf[4];
            ldmatrix_x4(bf, b + (np * 16 + lane % 8 + (lane / 16) * 8) * sb + ks * 16 +
                                ((lane / 8) % 2) * 8);
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                mma_16816(acc[m][2 * np], af[m], bf);
                mma_16816(acc[m][2 * np + 1], af[m], bf + 2);
            }
        }
    }
}

// acc[m][NT] += A_m * B with B rows b[k * sb + n] in shared memory ("[k][n]": V for P V), each
// B fragment (ldmatrix.trans) feeding both m-tiles.
template <int KS, int NT>
__device__ __forceinline__ void warp_gemm_reg_t_x2(float (&acc)[2][NT][4],
                                                   const unsigned (&a)[2][KS][4],
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
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                mma_16816(acc[m][2 * np], a[m][ks], bf);
                mma_16816(acc[m][2 * np + 1], a[m][ks], bf + 2);
            }
        }
    }
}

// A fragments of a 16 x 16KS fp16 A operand stored transposed ("[k][m]": a[k * sa + m], the dS^T
// tile read as dS): ldmatrix.trans, lane l -> k row (l % 8) + 8 (l / 16), m-half (l / 8) % 2, so
// that register r is A's (rows 8 (r % 2) .., k 8 (r / 2) ..) 8 x 8 block, as ldmatrix gives
// it from an "[m][k]" layout.
template <int KS>
__device__ __forceinline__ void load_a_frags_trans(unsigned (&af)[KS][4], const __half* a,
                                                   int sa) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
        ldmatrix_x4_trans(af[ks], a + (ks * 16 + lane % 8 + (lane / 16) * 8) * sa +
                                      ((lane / 8) % 2) * 8);
}

}  // namespace minitx_flash

// ------------------------------------------------------------------------------------------
// Forward, two m-tiles per warp. Block: 128 query rows q0 .. q0 + 127; warp w owns rows
// q0 + 32w + 16m .. + 15 for m = 0, 1 (thread (g, t): rows + g and + g + 8 of each). The loop
// and its overlap of copies with compute are flash_fwd_tc's; each per-row step (mask, online
// softmax, finish) runs once per m-tile on that m-tile's fragments.
// ------------------------------------------------------------------------------------------
// __launch_bounds__: two m-tiles of S and O accumulators need ~170-230 registers (2 blocks)
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 2)
flash_fwd_tc_bm128(const __half* __restrict__ q, const __half* __restrict__ k,
                   const __half* __restrict__ v, __half* __restrict__ o, float* __restrict__ lse,
                   const int* __restrict__ lengths, const unsigned char* __restrict__ kmask,
                   int H, int Hkv, int Nq, int Nk, float scale) {
    using namespace minitx_flash;
    using Cfg = TcBm128Cfg<D>;
    constexpr int BM = Cfg::kRows, BN = Cfg::kFwdBN, S = Cfg::kStride;
    constexpr int KS = D / 16, NT = BN / 8, DT = D / 8;
    constexpr int QKS = Cfg::kQInRegs ? KS : 1;   // Q fragments kept (a placeholder at D = 128)
    extern __shared__ float flash_smem[];
    __half* Qs = reinterpret_cast<__half*>(flash_smem);   // BM x S
    __half* Ks = Qs + BM * S;                              // BN x S
    __half* Vs = Ks + BN * S;                              // BN x S

    const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    const int q0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM;
    const int r0 = q0 + 32 * warp;                       // the warp's first row
    const int row[2][2] = {{r0 + g, r0 + g + 8}, {r0 + 16 + g, r0 + 24 + g}};
    const __half* qb = q + (long long)bh * Nq * D;
    const __half* kb = k + ((long long)b * Hkv + hk) * Nk * D;
    const __half* vb = v + ((long long)b * Hkv + hk) * Nk * D;
    const int kv_len = key_end<false>(b, q0, BM, Nq, Nk, lengths);
    const int n_tiles = (key_end<CAUSAL>(b, q0, BM, Nq, Nk, lengths) + BN - 1) / BN;
    const float sl2 = scale * kLog2e;

    float oacc[2][DT][4];
    zero(oacc[0]);
    zero(oacc[1]);
    float m[2][2] = {{neg_inf(), neg_inf()}, {neg_inf(), neg_inf()}};
    float l[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    unsigned qf[2][QKS][4];

    if (n_tiles > 0) {
        load_tile_async<__half, D>(Qs, S, qb, q0, Nq, BM);
        load_tile_async<__half, D>(Ks, S, kb, 0, Nk, BN);
        cp_async_commit();
    }
    for (int it = 0; it < n_tiles; ++it) {
        const int k0 = it * BN;
        cp_async_wait<0>();
        __syncthreads();  // [tc_bm128_fwd:k-landed] K(it) (and Q) visible; V(it-1) is done with
        load_tile_async<__half, D>(Vs, S, vb, k0, Nk, BN);
        cp_async_commit();

        // S = Q K^T for the warp's 32 rows x BN keys
        float s[2][NT][4];
        zero(s[0]);
        zero(s[1]);
        if constexpr (Cfg::kQInRegs) {
            if (it == 0) {
                load_a_frags<KS>(qf[0], Qs + 32 * warp * S, S);
                load_a_frags<KS>(qf[1], Qs + (32 * warp + 16) * S, S);
            }
            warp_gemm_reg_nt_x2<KS, NT>(s, qf, Ks, S);
        } else {
            warp_gemm_smem_nt_x2<KS, NT>(s, Qs + 32 * warp * S, S, Ks, S);
        }

        const bool need = tile_needs_mask<CAUSAL>(q0, k0, BN, kv_len, Nq, Nk, kmask);
        unsigned pf[2][NT / 2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            scale_and_mask<CAUSAL, NT>(s[mt], sl2, need, b, row[mt], k0, kv_len, Nq, Nk, kmask);
            online_softmax<NT, DT>(s[mt], m[mt], l[mt], oacc[mt]);
            acc_to_a_frags<NT>(pf[mt], s[mt]);
        }

        cp_async_wait<0>();
        __syncthreads();  // [tc_bm128_fwd:v-landed] V(it) visible; every warp is done with K(it)
        if (it + 1 < n_tiles) {
            load_tile_async<__half, D>(Ks, S, kb, k0 + BN, Nk, BN);
            cp_async_commit();
        }
        warp_gemm_reg_t_x2<NT / 2, DT>(oacc, pf, Vs, S);
    }

#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
        float inv[2];
        finish_rows(l[mt], m[mt], row[mt], Nq, lse + (long long)bh * Nq, inv);
        store_rows_f16<DT>(o + (long long)bh * Nq * D, r0 + 16 * mt, Nq, oacc[mt], inv);
    }
}

// ------------------------------------------------------------------------------------------
// Backward, dK and dV with K and V in registers: flash_bwd_dkdv_tc's loop (dkdv_tc_loop,
// flash_tc.cuh) with S^T = K Q^T and dP^T = V dO^T taken from fragments loaded once.
// ------------------------------------------------------------------------------------------
// __launch_bounds__: 2 blocks per SM at every D (K, V fragments add D / 2 registers each)
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 2)
flash_bwd_dkdv_tc_kvreg(const __half* __restrict__ q, const __half* __restrict__ k,
                        const __half* __restrict__ v, const __half* __restrict__ dout,
                        const float* __restrict__ lse, const float* __restrict__ dvec,
                        float* __restrict__ dk, float* __restrict__ dv,
                        const int* __restrict__ lengths, const unsigned char* __restrict__ kmask,
                        int H, int Hkv, int Nq, int Nk, float scale) {
    using namespace minitx_flash;
    dkdv_tc_loop<D, CAUSAL, TcKvregCfg<D>::kBQ, true>(q, k, v, dout, lse, dvec, dk, dv, lengths,
                                                      kmask, H, Hkv, Nq, Nk, scale, NoTileStep{});
}

// ------------------------------------------------------------------------------------------
// Backward in one pass: flash_bwd_dkdv_tc's loop, plus dQ += dS K for the block's 64 keys after
// each query tile (OnepassDqStep). Each warp writes its dS^T rows (fp16 A fragments, rows = the
// warp's 16 keys) to shared memory dSs (64 keys x BQ queries); after a barrier the block reads
// them back transposed as dS (BQ queries x 64 keys) and multiplies by the K tile it holds: the
// BQ x D result is split over the warps (BQ / 16 m-tiles, D / 8 columns shared among the warps
// of an m-tile) and added into dq32 (B, H, Nq, D) fp32 with atomicAdd; the launcher multiplies
// by scale and rounds to fp16 afterwards.
// ------------------------------------------------------------------------------------------
namespace minitx_flash {

template <int D, int BQ>
struct OnepassDqStep {
    float* dqb;     // this (batch, head)'s rows of dq32
    __half* dSs;    // 64 keys x (BQ + 8) halves of shared memory, after the loop's tiles
    int Nq;

    __device__ __forceinline__ void operator()(const unsigned (&dsf)[BQ / 16][4], int q0,
                                               const __half* Ks) const {
        constexpr int BK = TcCfg<D>::kRows, S = TcCfg<D>::kStride;
        constexpr int SD = BQ + 8;              // dSs row stride in halves (16-byte rows)
        constexpr int MT = BQ / 16;             // m-tiles of dQ's BQ rows
        constexpr int WPM = 4 / MT;             // warps per m-tile
        constexpr int DTW = D / 8 / WPM;        // 8-column tiles of dQ per warp
        constexpr int DTC = DTW < 4 ? DTW : 4;  // ... taken 4 at a time (16 accumulators)
        static_assert(MT * WPM == 4 && DTW % DTC == 0 && DTC % 2 == 0, "dQ's split over 4 warps");
        const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;

        // dS^T to shared memory: fragment dsf[j] holds (key row g, queries 16j + 2t, + 1),
        // (row g + 8, the same), (row g, 16j + 8 + 2t, + 1), (row g + 8, the same)
        unsigned* dsw = reinterpret_cast<unsigned*>(dSs + (16 * warp + g) * SD + 2 * t);
#pragma unroll
        for (int j = 0; j < BQ / 16; ++j) {
            dsw[8 * j] = dsf[j][0];
            dsw[8 * j + 4 * SD] = dsf[j][1];
            dsw[8 * j + 4] = dsf[j][2];
            dsw[8 * j + 4 * SD + 4] = dsf[j][3];
        }
        __syncthreads();  // [tc_onepass_dkdv:ds-written] dS^T visible to every warp

        // dQ[q0 + 16 mt ..] += dS K over the block's 64 keys, DTC column tiles at a time
        const int mt = warp / WPM, col0 = (warp % WPM) * DTW * 8;   // this warp's part of dQ
        unsigned af[BK / 16][4];
        load_a_frags_trans<BK / 16>(af, dSs + 16 * mt, SD);
#pragma unroll
        for (int c0 = 0; c0 < DTW; c0 += DTC) {
            float acc[DTC][4];
            zero(acc);
            warp_gemm_reg_t<BK / 16, DTC>(acc, af, Ks + col0 + 8 * c0, S);
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int r = q0 + 16 * mt + g + 8 * hh;
                if (r >= Nq) continue;
                float* dst = dqb + (long long)r * D + col0 + 8 * c0 + 2 * t;
#pragma unroll
                for (int n = 0; n < DTC; ++n) {
                    atomicAdd(dst + 8 * n, acc[n][2 * hh]);
                    atomicAdd(dst + 8 * n + 1, acc[n][2 * hh + 1]);
                }
            }
        }
    }   // the loop's barrier after this step frees dSs for the next tile
};

}  // namespace minitx_flash

template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 2)
flash_bwd_dkdv_tc_onepass(const __half* __restrict__ q, const __half* __restrict__ k,
                          const __half* __restrict__ v, const __half* __restrict__ dout,
                          const float* __restrict__ lse, const float* __restrict__ dvec,
                          float* __restrict__ dk, float* __restrict__ dv, float* __restrict__ dq32,
                          const int* __restrict__ lengths, const unsigned char* __restrict__ kmask,
                          int H, int Hkv, int Nq, int Nk, float scale) {
    using namespace minitx_flash;
    constexpr int BQ = TcCfg<D>::kDkdvBQ;
    extern __shared__ float flash_smem[];
    __half* dSs = reinterpret_cast<__half*>(flash_smem) + dkdv_tc_smem_bytes<D, BQ>() / 2;
    const OnepassDqStep<D, BQ> step{dq32 + (long long)blockIdx.y * Nq * D, dSs, Nq};
    dkdv_tc_loop<D, CAUSAL, BQ, false>(q, k, v, dout, lse, dvec, dk, dv, lengths, kmask, H, Hkv,
                                       Nq, Nk, scale, step);
}
