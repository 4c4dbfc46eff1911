// minitx flash attention: forward and backward CUDA kernels (hand written, tiled, fp32 accumulation).
//
// Compiled at run time with NVRTC (CuPy RawModule + name expressions such as
// "flash_fwd<float, 64, true>"), checked offline with nvcc/ptxas, and executed on the CPU by the
// emulation harness in tests/cuda (g++ with -DMINITX_EMULATION, one std::thread per CUDA thread).
// See docs/cuda_kernel.md for the tiling, register/shared-memory budget and occupancy.
//
// Layout (all contiguous, row major):
//   q  (B, H,   Nq, D)   k, v (B, Hkv, Nk, D)   Hkv divides H; q head h reads kv head h / (H / Hkv)
//   o  (B, H, Nq, D) same type as q            lse (B, H, Nq) float32, natural-log logsumexp of
//                                               the scaled, masked scores of each query row
// Masking: key j of batch b is kept iff j < lengths[b] (lengths may be null) and
//   kmask[b * Nk + j] != 0 (kmask may be null), and, when CAUSAL, j <= i + (Nk - Nq)
//   (bottom-right alignment: the last query row sees every key).
// A query row with no kept key gets o = 0 and lse = -inf (never NaN).
//
// Tiling: a block has kThreads = 128 threads; a query (or key) tile has 32 rows and each row is
// owned by a group of kTPR = 4 consecutive threads (same warp). Thread `g` of a group owns the
// output columns c = g + 4u (u < D/4) and the keys/queries j = g + 4t (t < 8) of the other tile.
// All tiles live in dynamic shared memory (extern __shared__), sized by *_smem_floats<D>().

#ifdef MINITX_EMULATION
#include "cuda_emu.h"
#else
#include <cuda_fp16.h>
#endif

namespace minitx_flash {

constexpr int kThreads = 128;        // threads per block, all kernels
constexpr int kBM = 32;              // query rows per tile
constexpr int kBN = 32;              // key rows per tile
constexpr int kTPR = 4;              // threads cooperating on one row
constexpr int kPerThread = 8;        // kBN / kTPR (== kBM / kTPR): other-tile rows per thread
static_assert(kBM * kTPR == kThreads, "one row per thread group");
static_assert(kBN * kTPR == kThreads, "one row per thread group");
static_assert(kBN / kTPR == kPerThread && kBM / kTPR == kPerThread, "per-thread share");

// Shared-memory footprint in floats (the launcher mirrors these formulas in Python).
// Rows of tiles that are read "by row" get one float of padding (stride D + 1) so the
// 8 rows touched by one warp fall into distinct banks.
template <int D>
__host__ __device__ constexpr int fwd_smem_floats() {
    return (kBM + kBN) * (D + 1) + kBN * D + kBM * (kBN + 1);  // Q, K | V | P
}
template <int D>
__host__ __device__ constexpr int dkdv_smem_floats() {
    return 2 * kBN * (D + 1) + 2 * kBM * (D + 1) + 2 * kBN * (kBM + 1) + 2 * kBM;  // K,V | Q,dO | P,dS | lse,Dvec
}
template <int D>
__host__ __device__ constexpr int dq_smem_floats() {
    return 2 * kBM * (D + 1) + 2 * kBN * (D + 1) + kBM * (kBN + 1);  // Q,dO | K,V | dS
}

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// Number of keys a block has to visit: keys >= kv_end are masked for every row of the block.
template <bool CAUSAL>
__device__ __forceinline__ int key_end(int b, int q0, int Nq, int Nk, const int* lengths) {
    int end = Nk;
    if (lengths != nullptr) {
        int len = lengths[b];
        len = len < 0 ? 0 : len;
        end = len < end ? len : end;
    }
    if (CAUSAL) {
        int last_row = (q0 + kBM < Nq ? q0 + kBM : Nq) - 1;
        int lim = last_row + (Nk - Nq) + 1;          // keys < lim may be seen by the tile
        lim = lim < 0 ? 0 : lim;
        end = lim < end ? lim : end;
    }
    return end;
}

// Load `rows` rows of a (N, D) matrix starting at row r0 into shared memory with row stride
// `stride`; rows >= n_valid are zero filled (never left as garbage: P = 0 times garbage = NaN).
template <typename T, int D>
__device__ __forceinline__ void load_tile(float* dst, int stride, const T* __restrict__ src,
                                          int r0, int n_valid, int rows) {
    for (int e = threadIdx.x; e < rows * D; e += kThreads) {
        int r = e / D, c = e - r * D;
        int gr = r0 + r;
        dst[r * stride + c] = gr < n_valid ? to_f(src[(long long)gr * D + c]) : 0.0f;
    }
}

template <int D>
__device__ __forceinline__ float dot_rows(const float* a, const float* b) {
    float acc = 0.0f;
#pragma unroll 8
    for (int d = 0; d < D; ++d) acc = fmaf(a[d], b[d], acc);
    return acc;
}

__device__ __forceinline__ bool key_kept(int b, int j, int kv_end, int Nk,
                                         const unsigned char* kmask) {
    return j < kv_end && (kmask == nullptr || kmask[(long long)b * Nk + j] != 0);
}

}  // namespace minitx_flash

// ------------------------------------------------------------------------------------------
// Forward. grid = (ceil(Nq / 32), B * H), block = 128, dynamic smem = fwd_smem_floats<D>() * 4.
// ------------------------------------------------------------------------------------------
template <typename T, int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 4)
flash_fwd(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
          T* __restrict__ o, float* __restrict__ lse,
          const int* __restrict__ lengths, const unsigned char* __restrict__ kmask,
          int H, int Hkv, int Nq, int Nk, float scale) {
    using namespace minitx_flash;
    static_assert(D % kTPR == 0, "D must be a multiple of 4");
    constexpr int QS = D + 1;        // row stride of Q and K tiles
    constexpr int PS = kBN + 1;      // row stride of P
    constexpr int NC = D / kTPR;     // output columns per thread
    extern __shared__ float flash_smem[];
    float* Qs = flash_smem;                 // kBM x QS
    float* Ks = Qs + kBM * QS;              // kBN x QS
    float* Vs = Ks + kBN * QS;              // kBN x D
    float* Ps = Vs + kBN * D;               // kBM x PS

    const int tid = threadIdx.x;
    const int r = tid / kTPR, g = tid % kTPR;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int hk = h / (H / Hkv);
    const int q0 = blockIdx.x * kBM;
    const int qi = q0 + r;
    const int diag = Nk - Nq;

    const T* qb = q + (long long)bh * Nq * D;
    const T* kb = k + ((long long)b * Hkv + hk) * Nk * D;
    const T* vb = v + ((long long)b * Hkv + hk) * Nk * D;

    const int kv_end = key_end<CAUSAL>(b, q0, Nq, Nk, lengths);
    const int n_tiles = (kv_end + kBN - 1) / kBN;

    load_tile<T, D>(Qs, QS, qb, q0, Nq, kBM);

    float acc[NC];
#pragma unroll
    for (int u = 0; u < NC; ++u) acc[u] = 0.0f;
    float m = neg_inf(), l = 0.0f;

    for (int t = 0; t < n_tiles; ++t) {
        const int k0 = t * kBN;
        load_tile<T, D>(Ks, QS, kb, k0, Nk, kBN);
        load_tile<T, D>(Vs, D, vb, k0, Nk, kBN);
        __syncthreads();  // [fwd:kv-loaded]

        float s[kPerThread];
        float mt = neg_inf();
#pragma unroll
        for (int x = 0; x < kPerThread; ++x) {
            const int j = g + kTPR * x, kj = k0 + j;
            float sc = dot_rows<D>(Qs + r * QS, Ks + j * QS) * scale;
            bool ok = key_kept(b, kj, kv_end, Nk, kmask) && (!CAUSAL || kj <= qi + diag);
            s[x] = ok ? sc : neg_inf();
            mt = fmaxf(mt, s[x]);
        }
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
        const float m_new = fmaxf(m, mt);
        const bool empty = m_new == neg_inf();            // nothing kept in this row so far
        const float alpha = empty ? 1.0f : expf(m - m_new);
        float ls = 0.0f;
#pragma unroll
        for (int x = 0; x < kPerThread; ++x) {
            const float p = (s[x] == neg_inf()) ? 0.0f : expf(s[x] - m_new);
            Ps[r * PS + g + kTPR * x] = p;
            ls += p;
        }
        ls += __shfl_xor_sync(0xffffffffu, ls, 1);
        ls += __shfl_xor_sync(0xffffffffu, ls, 2);
        l = l * alpha + ls;
        m = m_new;
        __syncwarp();  // the row's P is written by the 4 threads of its group (one warp)

#pragma unroll
        for (int u = 0; u < NC; ++u) acc[u] *= alpha;
        for (int j = 0; j < kBN; ++j) {
            const float p = Ps[r * PS + j];
            const float* vr = Vs + j * D + g;
#pragma unroll
            for (int u = 0; u < NC; ++u) acc[u] = fmaf(p, vr[kTPR * u], acc[u]);
        }
        __syncthreads();  // before the next tile overwrites K, V and P
    }

    if (qi < Nq) {
        T* orow = o + ((long long)bh * Nq + qi) * D;
        const bool any = l > 0.0f;
        const float inv = any ? 1.0f / l : 0.0f;
#pragma unroll
        for (int u = 0; u < NC; ++u) orow[g + kTPR * u] = from_f<T>(acc[u] * inv);
        if (g == 0) lse[(long long)bh * Nq + qi] = any ? m + logf(l) : neg_inf();
    }
}

// ------------------------------------------------------------------------------------------
// Backward 1: Dvec[row] = sum_d dO[row, d] * O[row, d]  (rows = B * H * Nq), one warp per row.
// grid = (ceil(rows / 4)), block = 128, no shared memory.
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

// ------------------------------------------------------------------------------------------
// Backward 2: dK, dV. One block per (key tile, b * H + h); loops over the query tiles.
// Writes per-q-head float32 dk, dv of shape (B, H, Nk, D) (the launcher sums GQA groups).
// grid = (ceil(Nk / 32), B * H), block = 128, dynamic smem = dkdv_smem_floats<D>() * 4.
// ------------------------------------------------------------------------------------------
template <typename T, int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 4)
flash_bwd_dkdv(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
               const T* __restrict__ dout, const float* __restrict__ lse,
               const float* __restrict__ dvec, float* __restrict__ dk, float* __restrict__ dv,
               const int* __restrict__ lengths, const unsigned char* __restrict__ kmask,
               int H, int Hkv, int Nq, int Nk, float scale) {
    using namespace minitx_flash;
    constexpr int QS = D + 1;
    constexpr int PS = kBM + 1;
    constexpr int NC = D / kTPR;
    extern __shared__ float flash_smem[];
    float* Ks = flash_smem;              // kBN x QS
    float* Vs = Ks + kBN * QS;           // kBN x QS
    float* Qs = Vs + kBN * QS;           // kBM x QS
    float* dOs = Qs + kBM * QS;          // kBM x QS
    float* Ps = dOs + kBM * QS;          // kBN x PS   (key row, query column)
    float* dSs = Ps + kBN * PS;          // kBN x PS
    float* Ls = dSs + kBN * PS;          // kBM
    float* Dv = Ls + kBM;                // kBM

    const int tid = threadIdx.x;
    const int jr = tid / kTPR, g = tid % kTPR;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int hk = h / (H / Hkv);
    const int k0 = blockIdx.x * kBN;
    const int kj = k0 + jr;
    const int diag = Nk - Nq;

    const T* qb = q + (long long)bh * Nq * D;
    const T* dob = dout + (long long)bh * Nq * D;
    const float* lseb = lse + (long long)bh * Nq;
    const float* dvb = dvec + (long long)bh * Nq;
    const T* kb = k + ((long long)b * Hkv + hk) * Nk * D;
    const T* vb = v + ((long long)b * Hkv + hk) * Nk * D;

    // Keys of this tile that are kept by lengths/kmask (the causal part depends on the query).
    const int kv_end = key_end<false>(b, 0, Nq, Nk, lengths);
    const bool kept = key_kept(b, kj, kv_end, Nk, kmask);
    // First query that can see a key of this tile (causal): i >= k0 - diag.
    int q_first = CAUSAL ? k0 - diag : 0;
    q_first = q_first < 0 ? 0 : q_first;
    const int qt_begin = q_first / kBM;
    const int qt_end = (k0 < kv_end) ? (Nq + kBM - 1) / kBM : 0;  // whole tile masked: nothing

    float accK[NC], accV[NC];
#pragma unroll
    for (int u = 0; u < NC; ++u) { accK[u] = 0.0f; accV[u] = 0.0f; }

    if (qt_begin < qt_end) {
        load_tile<T, D>(Ks, QS, kb, k0, Nk, kBN);
        load_tile<T, D>(Vs, QS, vb, k0, Nk, kBN);
    }
    for (int qt = qt_begin; qt < qt_end; ++qt) {
        const int q0 = qt * kBM;
        load_tile<T, D>(Qs, QS, qb, q0, Nq, kBM);
        load_tile<T, D>(dOs, QS, dob, q0, Nq, kBM);
        for (int e = tid; e < kBM; e += kThreads) {
            const bool in = q0 + e < Nq;
            Ls[e] = in ? lseb[q0 + e] : neg_inf();
            Dv[e] = in ? dvb[q0 + e] : 0.0f;
        }
        __syncthreads();

#pragma unroll
        for (int x = 0; x < kPerThread; ++x) {
            const int i = g + kTPR * x, qi = q0 + i;
            const float li = Ls[i];
            float p = 0.0f, ds = 0.0f;
            const bool ok = kept && qi < Nq && li != neg_inf() && (!CAUSAL || kj <= qi + diag);
            if (ok) {
                const float sc = dot_rows<D>(Qs + i * QS, Ks + jr * QS) * scale;
                const float dp = dot_rows<D>(dOs + i * QS, Vs + jr * QS);
                p = expf(sc - li);
                ds = p * (dp - Dv[i]);
            }
            Ps[jr * PS + i] = p;
            dSs[jr * PS + i] = ds;
        }
        __syncwarp();  // a key row's P/dS is written by the 4 threads of its group

        for (int i = 0; i < kBM; ++i) {
            const float p = Ps[jr * PS + i], ds = dSs[jr * PS + i];
            const float* dor = dOs + i * QS + g;
            const float* qr = Qs + i * QS + g;
#pragma unroll
            for (int u = 0; u < NC; ++u) {
                accV[u] = fmaf(p, dor[kTPR * u], accV[u]);
                accK[u] = fmaf(ds, qr[kTPR * u], accK[u]);
            }
        }
        __syncthreads();  // before the next query tile overwrites Q, dO, P, dS
    }

    if (kj < Nk) {
        float* dkr = dk + ((long long)bh * Nk + kj) * D;
        float* dvr = dv + ((long long)bh * Nk + kj) * D;
#pragma unroll
        for (int u = 0; u < NC; ++u) {
            dkr[g + kTPR * u] = accK[u] * scale;
            dvr[g + kTPR * u] = accV[u];
        }
    }
}

// ------------------------------------------------------------------------------------------
// Backward 3: dQ. One block per (query tile, b * H + h); loops over the key tiles.
// grid = (ceil(Nq / 32), B * H), block = 128, dynamic smem = dq_smem_floats<D>() * 4.
// ------------------------------------------------------------------------------------------
template <typename T, int D, bool CAUSAL>
__global__ void __launch_bounds__(128, 4)
flash_bwd_dq(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
             const T* __restrict__ dout, const float* __restrict__ lse,
             const float* __restrict__ dvec, T* __restrict__ dq,
             const int* __restrict__ lengths, const unsigned char* __restrict__ kmask,
             int H, int Hkv, int Nq, int Nk, float scale) {
    using namespace minitx_flash;
    constexpr int QS = D + 1;
    constexpr int PS = kBN + 1;
    constexpr int NC = D / kTPR;
    extern __shared__ float flash_smem[];
    float* Qs = flash_smem;              // kBM x QS
    float* dOs = Qs + kBM * QS;          // kBM x QS
    float* Ks = dOs + kBM * QS;          // kBN x QS
    float* Vs = Ks + kBN * QS;           // kBN x QS
    float* dSs = Vs + kBN * QS;          // kBM x PS

    const int tid = threadIdx.x;
    const int r = tid / kTPR, g = tid % kTPR;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int hk = h / (H / Hkv);
    const int q0 = blockIdx.x * kBM;
    const int qi = q0 + r;
    const int diag = Nk - Nq;

    const T* qb = q + (long long)bh * Nq * D;
    const T* dob = dout + (long long)bh * Nq * D;
    const T* kb = k + ((long long)b * Hkv + hk) * Nk * D;
    const T* vb = v + ((long long)b * Hkv + hk) * Nk * D;
    const float li = qi < Nq ? lse[(long long)bh * Nq + qi] : neg_inf();
    const float di = qi < Nq ? dvec[(long long)bh * Nq + qi] : 0.0f;

    const int kv_end = key_end<CAUSAL>(b, q0, Nq, Nk, lengths);
    const int n_tiles = (kv_end + kBN - 1) / kBN;

    load_tile<T, D>(Qs, QS, qb, q0, Nq, kBM);
    load_tile<T, D>(dOs, QS, dob, q0, Nq, kBM);

    float acc[NC];
#pragma unroll
    for (int u = 0; u < NC; ++u) acc[u] = 0.0f;

    for (int t = 0; t < n_tiles; ++t) {
        const int k0 = t * kBN;
        load_tile<T, D>(Ks, QS, kb, k0, Nk, kBN);
        load_tile<T, D>(Vs, QS, vb, k0, Nk, kBN);
        __syncthreads();

#pragma unroll
        for (int x = 0; x < kPerThread; ++x) {
            const int j = g + kTPR * x, kj = k0 + j;
            float ds = 0.0f;
            const bool ok = qi < Nq && li != neg_inf() && key_kept(b, kj, kv_end, Nk, kmask) &&
                            (!CAUSAL || kj <= qi + diag);
            if (ok) {
                const float sc = dot_rows<D>(Qs + r * QS, Ks + j * QS) * scale;
                const float dp = dot_rows<D>(dOs + r * QS, Vs + j * QS);
                ds = expf(sc - li) * (dp - di);
            }
            dSs[r * PS + j] = ds;
        }
        __syncwarp();

        for (int j = 0; j < kBN; ++j) {
            const float ds = dSs[r * PS + j];
            const float* kr = Ks + j * QS + g;
#pragma unroll
            for (int u = 0; u < NC; ++u) acc[u] = fmaf(ds, kr[kTPR * u], acc[u]);
        }
        __syncthreads();
    }

    if (qi < Nq) {
        T* dqr = dq + ((long long)bh * Nq + qi) * D;
#pragma unroll
        for (int u = 0; u < NC; ++u) dqr[g + kTPR * u] = from_f<T>(acc[u] * scale);
    }
}
