// Emulation driver: compiles minitx/backend/kernels/flash_attn.cu for the CPU (cuda_emu.h) and
// exposes extern "C" launchers for ctypes, one per kernel family and kind
// (flash_fwd_simt_launch, flash_fwd_tc_launch, flash_fwd_naive_launch, flash_fwd_tf32_launch,
// ..., flash_bwd_dot_launch),
// plus tests of the emulation itself (emu_mma_m16n8k16, emu_mma_m16n8k8_tf32, emu_to_tf32,
// emu_ldmatrix_x4, emu_cp_async_probe).
// Build (see tests/gpu/cuda/conftest.py):
//   g++ -std=c++20 -O1 -pthread -shared -fPIC -DMINITX_EMULATION -I<emu> -I<kernels> driver.cpp
// -DEMU_SMALL instantiates only D=32 (for the ThreadSanitizer / broken-kernel builds);
// -DEMU_MAIN adds a main() running a small forward + backward (the TSan executable);
// -DKERNEL_FILE="path" compiles another copy of the kernel (the deliberately broken one).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda_emu.h"

// The dynamic shared-memory arena (the kernels declare `extern __shared__ float flash_smem[]`).
constexpr std::size_t kArenaBytes = 256 * 1024;
alignas(128) float flash_smem[kArenaBytes / sizeof(float)];

#ifdef KERNEL_FILE
#include KERNEL_FILE
#else
#include "flash_attn.cu"
#endif

#ifdef EMU_SMALL
#define EMU_DIMS(X, FAM) X(FAM, 32, false, "false") X(FAM, 32, true, "true")
#define EMU_TYPES(X) X(float, "float") X(__half, "__half")
#else
#define EMU_DIMS(X, FAM)                                              \
    X(FAM, 32, false, "false") X(FAM, 32, true, "true")              \
    X(FAM, 64, false, "false") X(FAM, 64, true, "true")              \
    X(FAM, 128, false, "false") X(FAM, 128, true, "true")
#define EMU_TYPES(X) X(float, "float") X(__half, "__half")
#endif

#define STR2(x) #x
#define STR(x) STR2(x)

namespace {
struct ArenaInit {
    ArenaInit() { emu::set_shared_arena(flash_smem, kArenaBytes); }
} arena_init;

// element type of each family's q/k/v/o/dq
template <int FAM> struct FamT;
template <> struct FamT<0> { using T = float; };    // simt
template <> struct FamT<1> { using T = __half; };   // tc
template <> struct FamT<2> { using T = float; };    // naive
template <> struct FamT<3> { using T = float; };    // tf32 (fp32 on tensor cores, 3xTF32)
template <> struct FamT<4> { using T = __half; };   // tc_bm128 (the fp16 levers)
template <> struct FamT<5> { using T = __half; };   // tc_kvreg
template <> struct FamT<6> { using T = __half; };   // tc_onepass
}  // namespace

#define FAM_simt 0
#define FAM_tc 1
#define FAM_naive 2
#define FAM_tf32 3
#define FAM_tc_bm128 4
#define FAM_tc_kvreg 5
#define FAM_tc_onepass 6

extern "C" {

int emu_set_yield_permille(int p) { emu::set_yield_permille(p); return 0; }
int emu_set_seed(unsigned long long s) { emu::set_seed(s); return 0; }
int emu_set_mma_truncates(int on) { emu::set_mma_truncates(on); return 0; }
long long emu_arena_bytes() { return (long long)kArenaBytes; }

// family: 0 simt, 1 tc, 3 tf32, 4 tc_bm128 (fwd only), 5 tc_kvreg and 6 tc_onepass (dkdv only);
// kind: 0 fwd, 1 dkdv, 2 dq -> bytes of dynamic shared memory (constexpr functions of the
// kernel headers)
int emu_smem_bytes(int family, int kind, int D) {
    using namespace minitx_flash;
#define SMEM_CASE(DD)                                                            \
    if (D == DD) return family == 0 ? simt_smem_bytes<DD>(kind)                  \
                      : family == 3 ? tf32_smem_bytes<DD>(kind)                  \
                      : family == 4 ? tc_bm128_smem_bytes<DD>()                  \
                      : family == 5 ? tc_kvreg_smem_bytes<DD>()                  \
                      : family == 6 ? tc_onepass_smem_bytes<DD>() : tc_smem_bytes<DD>(kind);
    SMEM_CASE(32) SMEM_CASE(64) SMEM_CASE(128)
#undef SMEM_CASE
    return -1;
}

#define DEFINE_FWD(FAM)                                                                      \
    int flash_fwd_##FAM##_launch(const char* name, unsigned gx, unsigned gy, unsigned gz,     \
                                 unsigned bx, unsigned by, unsigned bz, size_t smem,          \
                                 const void* q, const void* k, const void* v, void* o,        \
                                 float* lse, const int* lengths, const unsigned char* kmask,  \
                                 int H, int Hkv, int Nq, int Nk, float scale) {               \
        dim3 grid(gx, gy, gz), block(bx, by, bz);                                            \
        using T = FamT<FAM_##FAM>::T;                                                        \
        EMU_DIMS(FWD_CASE, FAM)                                                              \
        return -1;                                                                           \
    }
#define FWD_CASE(FAM, D, C, CN)                                                              \
    if (!std::strcmp(name, "flash_fwd_" #FAM "<" #D ", " CN ">"))                           \
        return emu::launch(grid, block, smem, [&] {                                         \
            flash_fwd_##FAM<D, C>((const T*)q, (const T*)k, (const T*)v, (T*)o, lse,         \
                                  lengths, kmask, H, Hkv, Nq, Nk, scale);                    \
        });
DEFINE_FWD(simt)
DEFINE_FWD(tc)
DEFINE_FWD(naive)
DEFINE_FWD(tf32)
DEFINE_FWD(tc_bm128)

#define DEFINE_DKDV(FAM)                                                                     \
    int flash_bwd_dkdv_##FAM##_launch(const char* name, unsigned gx, unsigned gy,             \
                                      unsigned gz, unsigned bx, unsigned by, unsigned bz,     \
                                      size_t smem, const void* q, const void* k,              \
                                      const void* v, const void* dout, const float* lse,      \
                                      const float* dvec, float* dk, float* dv,                \
                                      const int* lengths, const unsigned char* kmask, int H,  \
                                      int Hkv, int Nq, int Nk, float scale) {                 \
        dim3 grid(gx, gy, gz), block(bx, by, bz);                                            \
        using T = FamT<FAM_##FAM>::T;                                                        \
        EMU_DIMS(DKDV_CASE, FAM)                                                             \
        return -1;                                                                           \
    }
#define DKDV_CASE(FAM, D, C, CN)                                                             \
    if (!std::strcmp(name, "flash_bwd_dkdv_" #FAM "<" #D ", " CN ">"))                      \
        return emu::launch(grid, block, smem, [&] {                                         \
            flash_bwd_dkdv_##FAM<D, C>((const T*)q, (const T*)k, (const T*)v,                \
                                       (const T*)dout, lse, dvec, dk, dv, lengths, kmask,    \
                                       H, Hkv, Nq, Nk, scale);                               \
        });
DEFINE_DKDV(simt)
DEFINE_DKDV(tc)
DEFINE_DKDV(naive)
DEFINE_DKDV(tf32)
DEFINE_DKDV(tc_kvreg)

// The single-pass backward's dK/dV kernel: the dK/dV arguments plus the float32 dQ it adds to.
int flash_bwd_dkdv_tc_onepass_launch(const char* name, unsigned gx, unsigned gy, unsigned gz,
                                     unsigned bx, unsigned by, unsigned bz, size_t smem,
                                     const void* q, const void* k, const void* v,
                                     const void* dout, const float* lse, const float* dvec,
                                     float* dk, float* dv, float* dq32, const int* lengths,
                                     const unsigned char* kmask, int H, int Hkv, int Nq, int Nk,
                                     float scale) {
    dim3 grid(gx, gy, gz), block(bx, by, bz);
    using T = __half;
#define ONEPASS_CASE(FAM, D, C, CN)                                                          \
    if (!std::strcmp(name, "flash_bwd_dkdv_" #FAM "<" #D ", " CN ">"))                      \
        return emu::launch(grid, block, smem, [&] {                                         \
            flash_bwd_dkdv_##FAM<D, C>((const T*)q, (const T*)k, (const T*)v,                \
                                       (const T*)dout, lse, dvec, dk, dv, dq32, lengths,     \
                                       kmask, H, Hkv, Nq, Nk, scale);                        \
        });
    EMU_DIMS(ONEPASS_CASE, tc_onepass)
#undef ONEPASS_CASE
    return -1;
}

#define DEFINE_DQ(FAM)                                                                       \
    int flash_bwd_dq_##FAM##_launch(const char* name, unsigned gx, unsigned gy, unsigned gz,  \
                                    unsigned bx, unsigned by, unsigned bz, size_t smem,       \
                                    const void* q, const void* k, const void* v,              \
                                    const void* dout, const float* lse, const float* dvec,    \
                                    void* dq, const int* lengths, const unsigned char* kmask, \
                                    int H, int Hkv, int Nq, int Nk, float scale) {            \
        dim3 grid(gx, gy, gz), block(bx, by, bz);                                            \
        using T = FamT<FAM_##FAM>::T;                                                        \
        EMU_DIMS(DQ_CASE, FAM)                                                               \
        return -1;                                                                           \
    }
#define DQ_CASE(FAM, D, C, CN)                                                               \
    if (!std::strcmp(name, "flash_bwd_dq_" #FAM "<" #D ", " CN ">"))                        \
        return emu::launch(grid, block, smem, [&] {                                         \
            flash_bwd_dq_##FAM<D, C>((const T*)q, (const T*)k, (const T*)v, (const T*)dout,  \
                                     lse, dvec, (T*)dq, lengths, kmask, H, Hkv, Nq, Nk,      \
                                     scale);                                                 \
        });
DEFINE_DQ(simt)
DEFINE_DQ(tc)
DEFINE_DQ(naive)
DEFINE_DQ(tf32)

int flash_bwd_dot_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, size_t smem, const void* o, const void* dout,
                         float* dvec, int rows, int D) {
    dim3 grid(gx, gy, gz), block(bx, by, bz);
#define DOT_CASE(T, TN)                                                                   \
    if (!std::strcmp(name, "flash_bwd_dot<" TN ">"))                                     \
        return emu::launch(grid, block, smem, [&] {                                      \
            flash_bwd_dot<T>((const T*)o, (const T*)dout, dvec, rows, D);                \
        });
    EMU_TYPES(DOT_CASE)
#undef DOT_CASE
    return -1;
}

// ---------------------------------------------------------------- tests of the emulation itself
// One warp (32 threads) executes one mma.m16n8k16 on register fragments given per lane:
// a[lane][4], b[lane][2] (fp16 pairs as uint32), c[lane][4] -> d[lane][4].
int emu_mma_m16n8k16(const unsigned* a, const unsigned* b, const float* c, float* d) {
    return emu::launch(dim3(1), dim3(32), 0, [&] {
        const int l = int(threadIdx.x);
        float acc[4] = {c[4 * l], c[4 * l + 1], c[4 * l + 2], c[4 * l + 3]};
        minitx_flash::mma_16816(acc, a + 4 * l, b + 2 * l);
        for (int i = 0; i < 4; ++i) d[4 * l + i] = acc[i];
    });
}

// One warp executes one mma.m16n8k8 with .tf32 operands: a[lane][4], b[lane][2] (fp32 bit
// patterns, used as given: no cvt), c[lane][4] -> d[lane][4]; and cvt.rna.tf32.f32 of n floats.
int emu_mma_m16n8k8_tf32(const unsigned* a, const unsigned* b, const float* c, float* d) {
    return emu::launch(dim3(1), dim3(32), 0, [&] {
        const int l = int(threadIdx.x);
        float acc[4] = {c[4 * l], c[4 * l + 1], c[4 * l + 2], c[4 * l + 3]};
        minitx_flash::mma_1688(acc, a + 4 * l, b + 2 * l);
        for (int i = 0; i < 4; ++i) d[4 * l + i] = acc[i];
    });
}
int emu_to_tf32(const float* x, unsigned* out, int n) {
    for (int i = 0; i < n; ++i) out[i] = minitx_flash::to_tf32(x[i]);
    return 0;
}

// One warp executes ldmatrix.x4 (trans = 0/1) on a shared-memory image `smem_in` (halves) with
// per-lane row offsets `row_off[lane]` (in halves); out[lane][4] receives the registers.
int emu_ldmatrix_x4(const unsigned short* smem_in, int n_halves, const int* row_off, int trans,
                    unsigned* out) {
    return emu::launch(dim3(1), dim3(32), std::size_t(n_halves) * 2, [&] {
        auto* sm = reinterpret_cast<__half*>(flash_smem);   // the dynamic shared-memory arena
        for (int i = int(threadIdx.x); i < n_halves; i += 32) sm[i] = __ushort_as_half(smem_in[i]);
        __syncthreads();
        unsigned r[4];
        if (trans) minitx_flash::ldmatrix_x4_trans(r, sm + row_off[threadIdx.x]);
        else minitx_flash::ldmatrix_x4(r, sm + row_off[threadIdx.x]);
        for (int i = 0; i < 4; ++i) out[4 * threadIdx.x + i] = r[i];
    });
}

// One warp, two cp.async groups of one 16-byte copy per lane (lane l copies src[l] into chunk l
// of buffer A, then src[32 + l] into buffer B; odd lanes give src-size 8 for B: the last 8 bytes
// must become zeros). out[l] = {B's first word read *before* any wait, A's 4 words after
// wait_group 1, B's 4 words after wait_group 0}: 9 words per lane.
int emu_cp_async_probe(const unsigned* src, unsigned* out) {
    return emu::launch(dim3(1), dim3(32), 2 * 32 * 16, [&] {
        const int l = int(threadIdx.x);
        auto* A = reinterpret_cast<unsigned*>(flash_smem);
        unsigned* B = A + 32 * 4;
        minitx_flash::cp_async_16(A + 4 * l, src + 4 * l, 16);
        minitx_flash::cp_async_commit();
        minitx_flash::cp_async_16(B + 4 * l, src + 4 * (32 + l), l % 2 ? 8 : 16);
        minitx_flash::cp_async_commit();
        unsigned* o = out + 9 * l;
        o[0] = B[4 * l];                       // landed at once, or still poison
        minitx_flash::cp_async_wait<1>();      // group A retired; B may still be in flight
        for (int i = 0; i < 4; ++i) o[1 + i] = A[4 * l + i];
        minitx_flash::cp_async_wait<0>();
        for (int i = 0; i < 4; ++i) o[5 + i] = B[4 * l + i];
    });
}

}  // extern "C"

#ifdef EMU_MAIN
// Small forward + backward of every family (simt fp32, tc fp16, naive fp32, tf32 fp32, and the fp16
// levers' own kernels; D=32, causal with
// Nq < Nk, lengths, GQA, several key tiles) for the ThreadSanitizer run. Prints "EMU_MAIN OK"
// when every launch succeeded and every output is finite.
#include <cmath>

template <int FAM>
static int run_family(const char* fam) {
    using T = typename FamT<FAM>::T;
    const int B = 1, H = 2, Hkv = 1, Nq = 33, Nk = 140, D = 32;
    const float scale = 0.17677669f;
    std::vector<T> q(B * H * Nq * D), k(B * Hkv * Nk * D), v(k.size()), dout(q.size());
    unsigned s = 1;
    auto rnd = [&] { s = s * 1664525u + 1013904223u; return float(s >> 8) / float(1 << 24) - 0.5f; };
    for (auto* a : {&q, &k, &v, &dout})
        for (auto& x : *a) x = minitx_flash::from_f<T>(rnd());
    std::vector<T> o(q.size()), dq(q.size());
    std::vector<float> lse(B * H * Nq), dvec(B * H * Nq), dk(B * H * Nk * D), dv(dk.size());
    int lengths[1] = {131};
    constexpr bool naive = FAM == 2;   // one row per thread, no shared memory
    const int rows_fwd = naive ? 128 : FAM == 0 ? minitx_flash::SimtCfg<32>::kFwdBM
                                                : minitx_flash::TcCfg<32>::kRows;
    const int rows_dq = naive ? 128 : FAM == 0 ? minitx_flash::SimtCfg<32>::kDqBM
                                               : minitx_flash::TcCfg<32>::kRows;
    const int rows_kv = naive ? 128 : FAM == 0 ? minitx_flash::SimtCfg<32>::kDkdvBK
                                               : minitx_flash::TcCfg<32>::kRows;
    auto smem = [&](int kind) {
        return std::size_t(naive ? 0 : FAM == 0 ? minitx_flash::simt_smem_bytes<32>(kind)
                                 : FAM == 3 ? minitx_flash::tf32_smem_bytes<32>(kind)
                                            : minitx_flash::tc_smem_bytes<32>(kind));
    };
    char name[128];
    int rc = 0;
    std::snprintf(name, sizeof name, "flash_fwd_%s<32, true>", fam);
    rc |= (FAM == 0 ? flash_fwd_simt_launch : FAM == 1 ? flash_fwd_tc_launch
           : FAM == 3 ? flash_fwd_tf32_launch : flash_fwd_naive_launch)(
        name, (Nq + rows_fwd - 1) / rows_fwd, B * H, 1, 128, 1, 1, smem(0), q.data(), k.data(),
        v.data(), o.data(), lse.data(), lengths, nullptr, H, Hkv, Nq, Nk, scale);
    rc |= flash_bwd_dot_launch(FAM == 1 ? "flash_bwd_dot<__half>" : "flash_bwd_dot<float>",
                               (B * H * Nq + 3) / 4, 1, 1, 128, 1, 1, 0, o.data(), dout.data(),
                               dvec.data(), B * H * Nq, D);
    std::snprintf(name, sizeof name, "flash_bwd_dkdv_%s<32, true>", fam);
    rc |= (FAM == 0 ? flash_bwd_dkdv_simt_launch : FAM == 1 ? flash_bwd_dkdv_tc_launch
           : FAM == 3 ? flash_bwd_dkdv_tf32_launch : flash_bwd_dkdv_naive_launch)(
        name, (Nk + rows_kv - 1) / rows_kv, B * H, 1, 128, 1, 1, smem(1), q.data(), k.data(),
        v.data(), dout.data(), lse.data(), dvec.data(), dk.data(), dv.data(), lengths, nullptr, H,
        Hkv, Nq, Nk, scale);
    std::snprintf(name, sizeof name, "flash_bwd_dq_%s<32, true>", fam);
    rc |= (FAM == 0 ? flash_bwd_dq_simt_launch : FAM == 1 ? flash_bwd_dq_tc_launch
           : FAM == 3 ? flash_bwd_dq_tf32_launch : flash_bwd_dq_naive_launch)(
        name, (Nq + rows_dq - 1) / rows_dq, B * H, 1, 128, 1, 1, smem(2), q.data(), k.data(),
        v.data(), dout.data(), lse.data(), dvec.data(), dq.data(), lengths, nullptr, H, Hkv, Nq,
        Nk, scale);
    if (rc != 0) { std::printf("EMU_MAIN %s launch error %d\n", fam, rc); return 2; }
    for (const auto* a : {&o, &dq})
        for (const T& x : *a)
            if (!std::isfinite(minitx_flash::to_f(x))) { std::printf("EMU_MAIN %s non-finite\n", fam); return 3; }
    for (const auto* a : {&lse, &dk, &dv})   // lse: every row sees keys here
        for (float x : *a)
            if (!std::isfinite(x)) { std::printf("EMU_MAIN %s non-finite\n", fam); return 3; }
    return 0;
}

// The fp16 levers' own kernels on the same case: the two-m-tile forward, then the dK/dV
// kernels with K and V in registers and with dQ added by atomics (Dvec from the forward's o).
static int run_levers() {
    using T = __half;
    using namespace minitx_flash;
    const int B = 1, H = 2, Hkv = 1, Nq = 33, Nk = 140, D = 32;
    const float scale = 0.17677669f;
    std::vector<T> q(B * H * Nq * D), k(B * Hkv * Nk * D), v(k.size()), dout(q.size()), o(q.size());
    unsigned s = 7;
    auto rnd = [&] { s = s * 1664525u + 1013904223u; return float(s >> 8) / float(1 << 24) - 0.5f; };
    for (auto* a : {&q, &k, &v, &dout})
        for (auto& x : *a) x = from_f<T>(rnd());
    std::vector<float> lse(B * H * Nq), dvec(B * H * Nq), dk(B * H * Nk * D), dv(dk.size()),
        dq32(q.size(), 0.0f);
    int lengths[1] = {131};
    int rc = flash_fwd_tc_bm128_launch("flash_fwd_tc_bm128<32, true>", (Nq + 127) / 128, B * H,
                                       1, 128, 1, 1, tc_bm128_smem_bytes<32>(), q.data(),
                                       k.data(), v.data(), o.data(), lse.data(), lengths,
                                       nullptr, H, Hkv, Nq, Nk, scale);
    rc |= flash_bwd_dot_launch("flash_bwd_dot<__half>", (B * H * Nq + 3) / 4, 1, 1, 128, 1, 1,
                               0, o.data(), dout.data(), dvec.data(), B * H * Nq, D);
    rc |= flash_bwd_dkdv_tc_kvreg_launch("flash_bwd_dkdv_tc_kvreg<32, true>", (Nk + 63) / 64,
                                         B * H, 1, 128, 1, 1, tc_kvreg_smem_bytes<32>(),
                                         q.data(), k.data(), v.data(), dout.data(), lse.data(),
                                         dvec.data(), dk.data(), dv.data(), lengths, nullptr, H,
                                         Hkv, Nq, Nk, scale);
    rc |= flash_bwd_dkdv_tc_onepass_launch("flash_bwd_dkdv_tc_onepass<32, true>", (Nk + 63) / 64,
                                           B * H, 1, 128, 1, 1, tc_onepass_smem_bytes<32>(),
                                           q.data(), k.data(), v.data(), dout.data(), lse.data(),
                                           dvec.data(), dk.data(), dv.data(), dq32.data(),
                                           lengths, nullptr, H, Hkv, Nq, Nk, scale);
    if (rc != 0) { std::printf("EMU_MAIN levers launch error %d\n", rc); return 2; }
    for (const T& x : o)
        if (!std::isfinite(to_f(x))) { std::printf("EMU_MAIN levers non-finite\n"); return 3; }
    for (const auto* a : {&lse, &dk, &dv, &dq32})
        for (float x : *a)
            if (!std::isfinite(x)) { std::printf("EMU_MAIN levers non-finite\n"); return 3; }
    return 0;
}

int main(int argc, char** argv) {
    if (argc > 1 && !std::strcmp(argv[1], "levers")) {   // the levers' kernels alone
        const int rc = run_levers();
        if (rc == 0) std::printf("EMU_MAIN OK\n");
        return rc;
    }
    int rc = run_family<0>("simt");
    if (rc == 0) rc = run_family<1>("tc");
    if (rc == 0) rc = run_family<2>("naive");
    if (rc == 0) rc = run_family<3>("tf32");
    if (rc == 0) rc = run_levers();
    if (rc == 0) std::printf("EMU_MAIN OK\n");
    return rc;
}
#endif
