// minitx flash attention, fp32 on tensor cores with the 3xTF32 split (sm_80+): mma.sync.m16n8k8
// (tf32 x tf32 -> fp32), K/V/Q/dO tiles streamed into shared memory as fp32 with cp.async.
//
// Why a split. A tensor core multiplies tf32 numbers: fp32 with its mantissa cut to 10 bits, a
// relative rounding of 2^-11 per operand, which a float32 caller would see as ~1e-3 errors. Each
// fp32 operand x is therefore written as two tf32 numbers,
//     x = big + small,   big = tf32(x),   small = tf32(x - big),
// whose sum carries about 22 of x's 24 mantissa bits (|x - big - small| <= 2^-22 |x|), and a
// product takes three tensor-core multiplies:
//     a b ~= a_small b_big + a_big b_small + a_big b_big
// (a_small b_small, about 2^-22 a b, is dropped).
// The small terms are added first, so they are not lost against the large one. This is the
// split PyTorch's fp32 memory-efficient attention uses on sm_80+ (CUTLASS's
// OpMultiplyAddFastF32); its error is that of fp32 arithmetic, a few units of 2^-22 per product.
//
// The loop order, tiles and online softmax are those of the fp16 kernels (flash_tc.cuh): a block
// owns 64 rows, each of its 4 warps 16 of them, and the other operand's tiles stream through
// shared memory. What differs is the instruction, m16n8k8 with 32-bit operands, and so the
// fragments (PTX ISA, "Matrix Fragments for mma.m16n8k8" with .tf32; g = lane / 4, t = lane % 4):
//   A (16 x 8):  a0 (row g, k t)        a1 (row g + 8, k t)
//                a2 (row g, k t + 4)    a3 (row g + 8, k t + 4)
//   B (8 x 8):   b0 (k t, col g)        b1 (k t + 4, col g)
//   C (16 x 8):  c0, c1 (row g, cols 2t and 2t + 1)
//                c2, c3 (row g + 8, the same cols)
// Fragments are loaded from shared memory with plain 32-bit loads (ldmatrix moves 16-bit
// elements). Rows are D + 4 floats apart, so the 8 rows x 4 columns a fragment load touches fall
// into 32 distinct banks (row g starts 4 g banks further on).
//
// P (or dS) as the A operand of P V without moving data. A C fragment holds keys 2t and 2t + 1
// of an 8-key tile; the A fragment wants keys t and t + 4. A product sums over its k index, so
// the k order may be permuted as long as A and B agree: within every 8 keys, A's k = t is taken
// as key 2t and k = t + 4 as key 2t + 1. Then a = (c0, c2, c1, c3), and B's b0, b1 are rows 2t
// and 2t + 1 of the [key][column] tile (see warp_gemm_acc_kn_tf32).
//
// Kernels (D = 32, 64, 128; CAUSAL = bottom-right aligned causal mask):
//   flash_fwd_tf32<D, CAUSAL>      grid (ceil(Nq / 64), B * H)   O, lse
//   flash_bwd_dq_tf32<D, CAUSAL>   grid (ceil(Nq / 64), B * H)   dQ   (deterministic, no atomics)
//   flash_bwd_dkdv_tf32<D, CAUSAL> grid (ceil(Nk / 64), B * H)   dK, dV per q head, fp32
// Shared memory is dynamic; tf32_smem_bytes<D>(kind) gives its size (the launcher mirrors it).
#pragma once

// flash_tc.cuh: the per-element steps on C fragments (masking, the online softmax, dS), which
// the fp16 kernels and these share
#include "flash_common.cuh"
#include "flash_tc.cuh"

namespace minitx_flash {

// ------------------------------------------------------------------------------ tile shapes
template <int D>
struct Tf32Cfg {
    static constexpr int kRows = 64;                     // rows a block owns
    static constexpr int kStride = D + 4;                // fp32 row stride
    static constexpr int kFwdBN = D == 128 ? 32 : 64;    // forward: keys per tile
    static constexpr int kDqBN = D == 128 ? 16 : 32;     // dQ: keys per tile (x 2)
    // dK/dV: queries per tile (x 2); D = 128: two D-wide accumulators and the partial sums of
    // warp_gemm_acc_kn_tf32 fit in 255 registers only with 8-query tiles
    static constexpr int kDkdvBQ = D == 128 ? 8 : 32;
};

// Dynamic shared memory in bytes; kind 0 = fwd, 1 = dkdv, 2 = dq. Everything is fp32 (4 bytes).
template <int D>
__host__ __device__ constexpr int tf32_smem_bytes(int kind) {
    using C = Tf32Cfg<D>;
    return kind == 0 ? 4 * (C::kRows + 2 * C::kFwdBN) * C::kStride                 // Q | K | V
         : kind == 1 ? 4 * (2 * C::kRows + 4 * C::kDkdvBQ) * C::kStride + 4 * 4 * C::kDkdvBQ
                                                     // K, V | 2 x (Q, dO) | 2 x (lse, Dvec)
                     : 4 * (2 * C::kRows + 4 * C::kDqBN) * C::kStride;   // Q, dO | 2 x (K, V)
}

// ------------------------------------------------------------------------------ the split
// x = big + small with both parts tf32 (see the top of the file).
__device__ __forceinline__ void split_tf32(float x, unsigned& big, unsigned& small) {
    big = to_tf32(x);
    small = to_tf32(x - __int_as_float(int(big)));
}

// acc += x, rounded to nearest, issued in place among the mma (asm volatile keeps their order):
// a group's partial sums are done with before the next group's chains begin.
__device__ __forceinline__ void add_in_order(float& acc, float x) {
#ifdef MINITX_EMULATION
    acc += x;
#else
    asm volatile("add.rn.f32 %0, %0, %1;\n" : "+f"(acc) : "f"(x));
#endif
}

// acc += A B in 3xTF32: three tensor-core products, the small ones first.
__device__ __forceinline__ void mma_3xtf32(float acc[4], const unsigned a_big[4],
                                           const unsigned a_small[4], const unsigned b_big[2],
                                           const unsigned b_small[2]) {
    mma_1688(acc, a_small, b_big);
    mma_1688(acc, a_big, b_small);
    mma_1688(acc, a_big, b_big);
}

// ------------------------------------------------------------------------------ warp GEMMs
// acc[NT] (16 x 8NT fp32 C fragments) += A B^T, where
//   A: 16 x 8KS fp32, rows a[r * sa + k] in shared memory (r < 16),
//   B: 8NT x 8KS fp32, rows b[n * sb + k] in shared memory ("[n][k]": K for Q K^T).
template <int KS, int NT>
__device__ __forceinline__ void warp_gemm_nt_tf32(float (&acc)[NT][4], const float* a, int sa,
                                                  const float* b, int sb) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    // two k-steps at a time: fully unrolled, the compiler hoists every k-step's loads and the
    // dK/dV kernel runs out of registers (acc's index depends on nt only, so this stays in them)
#pragma unroll 2
    for (int ks = 0; ks < KS; ++ks) {
        const float* ap = a + g * sa + ks * 8 + t;
        unsigned ab[4], as[4];
        split_tf32(ap[0], ab[0], as[0]);             // row g,     k t
        split_tf32(ap[8 * sa], ab[1], as[1]);        // row g + 8, k t
        split_tf32(ap[4], ab[2], as[2]);             // row g,     k t + 4
        split_tf32(ap[8 * sa + 4], ab[3], as[3]);    // row g + 8, k t + 4
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const float* bp = b + (nt * 8 + g) * sb + ks * 8 + t;
            unsigned bb[2], bs[2];
            split_tf32(bp[0], bb[0], bs[0]);         // k t,     col g
            split_tf32(bp[4], bb[1], bs[1]);         // k t + 4, col g
            mma_3xtf32(acc[nt], ab, as, bb, bs);
        }
    }
}

// acc[NT] (16 x 8NT) += P B, where
//   P: 16 x 8KT as C fragments p[KT][4] (the scores' accumulators after the softmax, or dS),
//   B: 8KT x 8NT fp32, rows b[k * sb + n] in shared memory ("[k][n]": V for P V).
// The k order within each 8 keys is permuted (k t = key 2t, k t + 4 = key 2t + 1; top of file).
//
// Why the products are not simply chained through acc. A tensor core adds an mma's products to
// its C operand and rounds the sum toward zero (Fasi, Higham, Mikaitis and Pranesh, "Numerical
// behavior of NVIDIA tensor cores", 2021), so each mma shaves up to an ulp of acc off it, always
// the same way. acc lives across the whole key (or query) loop, 3 N / 8 mmas at length N: a
// bias of ~N ulps (dK, dV at N = 2048, D = 128, causal: 10-60x an fp32 sum's error, which grows
// like sqrt(N)). So each call sums its 8KT keys into a fresh `part` and adds that to acc in one
// fp32 add, rounded to nearest: the bias stays within one tile.
// The n-tiles go in groups of G (at most): a group's independent mma chains keep the tensor
// pipe busy, and only its partial sums are live at a time.
template <int KT, int NT, int G = 4>
__device__ __forceinline__ void warp_gemm_acc_kn_tf32(float (&acc)[NT][4], const float (&p)[KT][4],
                                                      const float* b, int sb) {
    constexpr int NG = NT < G ? NT : G;
    static_assert(NT % NG == 0, "whole groups of n-tiles");
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const float* bp = b + 2 * t * sb + g;
#pragma unroll
    for (int n0 = 0; n0 < NT; n0 += NG) {
        float part[NG][4];
        zero(part);
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
            unsigned ab[4], as[4];
            split_tf32(p[kt][0], ab[0], as[0]);   // row g,     key 2t
            split_tf32(p[kt][2], ab[1], as[1]);   // row g + 8, key 2t
            split_tf32(p[kt][1], ab[2], as[2]);   // row g,     key 2t + 1
            split_tf32(p[kt][3], ab[3], as[3]);   // row g + 8, key 2t + 1
#pragma unroll
            for (int j = 0; j < NG; ++j) {
                const int col = (n0 + j) * 8;
                unsigned bb[2], bs[2];
                split_tf32(bp[kt * 8 * sb + col], bb[0], bs[0]);        // key 2t,     col g
                split_tf32(bp[(kt * 8 + 1) * sb + col], bb[1], bs[1]);  // key 2t + 1, col g
                mma_3xtf32(part[j], ab, as, bb, bs);
            }
        }
#pragma unroll
        for (int j = 0; j < NG; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) add_in_order(acc[n0 + j][i], part[j][i]);
    }
}

// Store a warp's 16 x D fp32 accumulator, times `mul`, as rows r0 + g and r0 + 8 + g of a
// (n_rows, D) fp32 matrix (rows >= n_rows are skipped): two floats (8 bytes) per store.
template <int DT>
__device__ __forceinline__ void store_rows_f32(float* dst, int r0, int n_rows,
                                               const float (&acc)[DT][4], const float (&mul)[2]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = r0 + g + 8 * hh;
        if (r >= n_rows) continue;
        float* row = dst + (long long)r * (DT * 8);
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            row[dt * 8 + 2 * t] = acc[dt][2 * hh] * mul[hh];
            row[dt * 8 + 2 * t + 1] = acc[dt][2 * hh + 1] * mul[hh];
        }
    }
}

}  // namespace minitx_flash

// ------------------------------------------------------------------------------------------
// Forward: flash_fwd_tc's loop with fp32 tiles. Block: 64 query rows, warp w owns rows
// q0 + 16w .. q0 + 16w + 15; per thread an S tile s[BN/8][4], the O accumulator o[D/8][4], the
// running max m[2] and partial row sums l[2]. Shared: Q (64 x D) once, K and V one tile each,
// overlapped as
//     top:    wait K(t); barrier; start V(t)           V(t) lands while S = Q K(t)^T is computed
//     middle: wait V(t); barrier; start K(t + 1)       K(t+1) lands while O += P V(t)
// ------------------------------------------------------------------------------------------
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 2)
flash_fwd_tf32(const float* __restrict__ q, const float* __restrict__ k,
               const float* __restrict__ v, float* __restrict__ o, float* __restrict__ lse,
               const int* __restrict__ lengths, const unsigned char* __restrict__ kmask,
               int H, int Hkv, int Nq, int Nk, float scale) {
    using namespace minitx_flash;
    using Cfg = Tf32Cfg<D>;
    constexpr int BM = Cfg::kRows, BN = Cfg::kFwdBN, S = Cfg::kStride;
    constexpr int KS = D / 8;    // k-steps of Q K^T
    constexpr int NT = BN / 8;   // 8-key tiles of S per warp
    constexpr int DT = D / 8;    // 8-column tiles of O per warp
    extern __shared__ float flash_smem[];
    float* Qs = flash_smem;   // BM x S
    float* Ks = Qs + BM * S;  // BN x S
    float* Vs = Ks + BN * S;  // BN x S

    const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    const int q0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM;
    const int row[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};
    const float* qb = q + (long long)bh * Nq * D;
    const float* kb = k + ((long long)b * Hkv + hk) * Nk * D;
    const float* vb = v + ((long long)b * Hkv + hk) * Nk * D;
    const int kv_len = key_end<false>(b, q0, BM, Nq, Nk, lengths);
    const int n_tiles = (key_end<CAUSAL>(b, q0, BM, Nq, Nk, lengths) + BN - 1) / BN;
    const float sl2 = scale * kLog2e;   // scores in log2 units: exp(x) = exp2(x log2 e)

    float oacc[DT][4];
    zero(oacc);
    float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.0f, 0.0f};

    if (n_tiles > 0) {
        load_tile_async<float, D>(Qs, S, qb, q0, Nq, BM);
        load_tile_async<float, D>(Ks, S, kb, 0, Nk, BN);
        cp_async_commit();
    }
    for (int it = 0; it < n_tiles; ++it) {
        const int k0 = it * BN;
        cp_async_wait<0>();
        __syncthreads();  // [tf32_fwd:k-landed] K(it) (and Q) visible; V(it-1) no longer read
        load_tile_async<float, D>(Vs, S, vb, k0, Nk, BN);
        cp_async_commit();

        float s[NT][4];   // S = Q K^T for this warp's 16 rows x BN keys
        zero(s);
        warp_gemm_nt_tf32<KS, NT>(s, Qs + 16 * warp * S, S, Ks, S);

        // scale to log2 units and mask; the online softmax turns S into P and rescales O
        // (flash_tc.cuh, "on C fragments")
        const bool need = tile_needs_mask<CAUSAL>(q0, k0, BN, kv_len, Nq, Nk, kmask);
        scale_and_mask<CAUSAL, NT>(s, sl2, need, b, row, k0, kv_len, Nq, Nk, kmask);
        online_softmax<NT, DT>(s, m, l, oacc);

        cp_async_wait<0>();
        __syncthreads();  // [tf32_fwd:v-landed] V(it) visible; every warp is done with K(it)
        if (it + 1 < n_tiles) {
            load_tile_async<float, D>(Ks, S, kb, k0 + BN, Nk, BN);
            cp_async_commit();
        }
        warp_gemm_acc_kn_tf32<NT, DT>(oacc, s, Vs, S);   // O += P V
    }

    // O = acc / l; rows that kept no key: O = 0, lse = -inf
    float inv[2];
    finish_rows(l, m, row, Nq, lse + (long long)bh * Nq, inv);
    store_rows_f32<DT>(o + (long long)bh * Nq * D, q0 + 16 * warp, Nq, oacc, inv);
}

// ------------------------------------------------------------------------------------------
// Backward, dQ: flash_bwd_dq_tc's loop with fp32 tiles. Block: 64 query rows, key tiles of BN
// keys double buffered. Per tile
//     S = Q K^T, P = 2^(S log2e scale - lse log2e), dP = dO V^T, dS = P (dP - Dvec),  dQ += dS K
// ------------------------------------------------------------------------------------------
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 2)
flash_bwd_dq_tf32(const float* __restrict__ q, const float* __restrict__ k,
                  const float* __restrict__ v, const float* __restrict__ dout,
                  const float* __restrict__ lse, const float* __restrict__ dvec,
                  float* __restrict__ dq, const int* __restrict__ lengths,
                  const unsigned char* __restrict__ kmask, int H, int Hkv, int Nq, int Nk,
                  float scale) {
    using namespace minitx_flash;
    using Cfg = Tf32Cfg<D>;
    constexpr int BM = Cfg::kRows, BN = Cfg::kDqBN, S = Cfg::kStride;
    constexpr int KS = D / 8, NT = BN / 8, DT = D / 8;
    extern __shared__ float flash_smem[];
    float* Qs = flash_smem;     // BM x S
    float* dOs = Qs + BM * S;   // BM x S
    float* KV = dOs + BM * S;   // 2 stages of [K (BN x S) | V (BN x S)]

    const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    const int q0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM;
    const int row[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};
    const float* qb = q + (long long)bh * Nq * D;
    const float* dob = dout + (long long)bh * Nq * D;
    const float* kb = k + ((long long)b * Hkv + hk) * Nk * D;
    const float* vb = v + ((long long)b * Hkv + hk) * Nk * D;
    const int kv_len = key_end<false>(b, q0, BM, Nq, Nk, lengths);
    const int n_tiles = (key_end<CAUSAL>(b, q0, BM, Nq, Nk, lengths) + BN - 1) / BN;
    const float sl2 = scale * kLog2e;
    float lse2[2], dv_row[2];
    load_row_stats(lse + (long long)bh * Nq, dvec + (long long)bh * Nq, row, Nq, lse2, dv_row);

    float dqacc[DT][4];
    zero(dqacc);
    if (n_tiles > 0) {
        load_tile_async<float, D>(Qs, S, qb, q0, Nq, BM);
        load_tile_async<float, D>(dOs, S, dob, q0, Nq, BM);
        load_tile_async<float, D>(KV, S, kb, 0, Nk, BN);
        load_tile_async<float, D>(KV + BN * S, S, vb, 0, Nk, BN);
        cp_async_commit();
    }
    for (int it = 0; it < n_tiles; ++it) {
        const int k0 = it * BN, st = it & 1;
        const float* Ks = KV + st * 2 * BN * S;
        const float* Vs = Ks + BN * S;
        if (it + 1 < n_tiles) {   // prefetch the next tile into the other stage
            float* Kn = KV + (st ^ 1) * 2 * BN * S;
            load_tile_async<float, D>(Kn, S, kb, k0 + BN, Nk, BN);
            load_tile_async<float, D>(Kn + BN * S, S, vb, k0 + BN, Nk, BN);
            cp_async_commit();
            cp_async_wait<1>();   // everything but the newest group (tile it + 1) has landed
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // [tf32_dq:tile-landed]

        float s[NT][4], dp[NT][4];
        zero(s);
        zero(dp);
        warp_gemm_nt_tf32<KS, NT>(s, Qs + 16 * warp * S, S, Ks, S);     // S  = Q  K^T
        warp_gemm_nt_tf32<KS, NT>(dp, dOs + 16 * warp * S, S, Vs, S);   // dP = dO V^T
        const bool need = tile_needs_mask<CAUSAL>(q0, k0, BN, kv_len, Nq, Nk, kmask);
        ds_of_rows<CAUSAL, NT>(s, dp, sl2, lse2, dv_row, need, b, row, k0, kv_len, Nq, Nk, kmask);
        warp_gemm_acc_kn_tf32<NT, DT>(dqacc, dp, Ks, S);   // dQ += dS K
        __syncthreads();  // every warp is done with stage st before it is refilled
    }
    const float mul[2] = {scale, scale};
    store_rows_f32<DT>(dq + (long long)bh * Nq * D, q0 + 16 * warp, Nq, dqacc, mul);
}

// ------------------------------------------------------------------------------------------
// Backward, dK and dV: flash_bwd_dkdv_tc's loop with fp32 tiles. Block: 64 keys (warp w: keys
// k0 + 16w ..), K and V resident; query tiles of BQ queries double buffered with their lse and
// Dvec, from the first tile that can see a key of the block (causal). Per tile
//     S^T = K Q^T, P^T = 2^(S^T log2e scale - lse[query] log2e), dP^T = V dO^T,
//     dS^T = P^T (dP^T - Dvec[query]),  dV += P^T dO,  dK += dS^T Q
// Writes per-q-head fp32 dk, dv (B, H, Nk, D); the launcher sums GQA groups (deterministic).
// ------------------------------------------------------------------------------------------
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 2)
flash_bwd_dkdv_tf32(const float* __restrict__ q, const float* __restrict__ k,
                    const float* __restrict__ v, const float* __restrict__ dout,
                    const float* __restrict__ lse, const float* __restrict__ dvec,
                    float* __restrict__ dk, float* __restrict__ dv,
                    const int* __restrict__ lengths, const unsigned char* __restrict__ kmask,
                    int H, int Hkv, int Nq, int Nk, float scale) {
    using namespace minitx_flash;
    using Cfg = Tf32Cfg<D>;
    constexpr int BK = Cfg::kRows, BQ = Cfg::kDkdvBQ, S = Cfg::kStride;
    constexpr int KS = D / 8, NT = BQ / 8, DT = D / 8;
    extern __shared__ float flash_smem[];
    float* Ks = flash_smem;          // BK x S
    float* Vs = Ks + BK * S;         // BK x S
    float* QdO = Vs + BK * S;        // 2 stages of [Q (BQ x S) | dO (BQ x S)]
    float* LD = QdO + 4 * BQ * S;    // 2 stages of [lse log2e | Dvec] (BQ each)

    const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    const int k0 = blockIdx.x * BK;
    const int krow[2] = {k0 + 16 * warp + g, k0 + 16 * warp + g + 8};
    const int diag = Nk - Nq;
    const float* qb = q + (long long)bh * Nq * D;
    const float* dob = dout + (long long)bh * Nq * D;
    const float* lseb = lse + (long long)bh * Nq;
    const float* dvb = dvec + (long long)bh * Nq;
    const float* kb = k + ((long long)b * Hkv + hk) * Nk * D;
    const float* vb = v + ((long long)b * Hkv + hk) * Nk * D;
    const int kv_len = key_end<false>(b, 0, Nq, Nq, Nk, lengths);
    int q_first = CAUSAL ? k0 - diag : 0;   // the first query that sees key k0
    q_first = q_first < 0 ? 0 : q_first;
    const int qt_begin = q_first / BQ;
    const int qt_end = k0 < kv_len ? (Nq + BQ - 1) / BQ : 0;   // keys all cut by lengths: none
    const float sl2 = scale * kLog2e;

    float dkacc[DT][4], dvacc[DT][4];
    zero(dkacc);
    zero(dvacc);
    if (qt_begin < qt_end) {
        load_tile_async<float, D>(Ks, S, kb, k0, Nk, BK);
        load_tile_async<float, D>(Vs, S, vb, k0, Nk, BK);
        load_tile_async<float, D>(QdO, S, qb, qt_begin * BQ, Nq, BQ);
        load_tile_async<float, D>(QdO + BQ * S, S, dob, qt_begin * BQ, Nq, BQ);
        cp_async_commit();
        stage_query_rows<BQ>(LD, qt_begin, Nq, lseb, dvb);
    }
    for (int qt = qt_begin; qt < qt_end; ++qt) {
        const int q0 = qt * BQ, st = (qt - qt_begin) & 1;
        const float* Qs = QdO + st * 2 * BQ * S;
        const float* dOs = Qs + BQ * S;
        const float* Ls = LD + st * 2 * BQ;
        const float* Dvs = Ls + BQ;
        if (qt + 1 < qt_end) {
            float* Qn = QdO + (st ^ 1) * 2 * BQ * S;
            load_tile_async<float, D>(Qn, S, qb, q0 + BQ, Nq, BQ);
            load_tile_async<float, D>(Qn + BQ * S, S, dob, q0 + BQ, Nq, BQ);
            cp_async_commit();
            stage_query_rows<BQ>(LD + (st ^ 1) * 2 * BQ, qt + 1, Nq, lseb, dvb);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // [tf32_dkdv:tile-landed]

        float s[NT][4], dp[NT][4];   // 16 keys x BQ queries (transposed scores)
        zero(s);
        zero(dp);
        warp_gemm_nt_tf32<KS, NT>(s, Ks + 16 * warp * S, S, Qs, S);     // S^T  = K Q^T
        warp_gemm_nt_tf32<KS, NT>(dp, Vs + 16 * warp * S, S, dOs, S);   // dP^T = V dO^T
        const bool need = tile_needs_mask<CAUSAL>(q0, k0, BK, kv_len, Nq, Nk, kmask);
        ds_of_cols<CAUSAL, NT>(s, dp, sl2, Ls, Dvs, need, b, q0, krow, kv_len, Nq, Nk, kmask);
        warp_gemm_acc_kn_tf32<NT, DT>(dvacc, s, dOs, S);   // dV += P^T dO
        warp_gemm_acc_kn_tf32<NT, DT>(dkacc, dp, Qs, S);   // dK += dS^T Q
        __syncthreads();  // every warp is done with stage st before it is refilled
    }
    store_dkdv<DT>(dk, dv, bh, Nk, krow, dkacc, dvacc, scale);
}
