// Emulation driver: compiles minitx/backend/kernels/flash_attn.cu for the CPU (cuda_emu.h) and
// exposes extern "C" launchers for ctypes. Build (see tests/cuda/conftest.py):
//   g++ -std=c++20 -O1 -pthread -shared -fPIC -DMINITX_EMULATION -I<emu> -I<kernels> driver.cpp
// -DEMU_SMALL instantiates only float, D=32 (for the ThreadSanitizer / broken-kernel builds);
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
#define EMU_CONFIGS(X)                                   \
    X(float, "float", 32, false, "false")                \
    X(float, "float", 32, true, "true")
#define EMU_TYPES(X) X(float, "float")
#else
#define EMU_CONFIGS_T(X, T, TN)                          \
    X(T, TN, 32, false, "false") X(T, TN, 32, true, "true") \
    X(T, TN, 64, false, "false") X(T, TN, 64, true, "true") \
    X(T, TN, 128, false, "false") X(T, TN, 128, true, "true")
#define EMU_CONFIGS(X) EMU_CONFIGS_T(X, float, "float") EMU_CONFIGS_T(X, __half, "__half")
#define EMU_TYPES(X) X(float, "float") X(__half, "__half")
#endif

#define STR2(x) #x
#define STR(x) STR2(x)

namespace {
struct ArenaInit {
    ArenaInit() { emu::set_shared_arena(flash_smem, kArenaBytes); }
} arena_init;
}  // namespace

extern "C" {

int emu_set_yield_permille(int p) { emu::set_yield_permille(p); return 0; }
int emu_set_seed(unsigned long long s) { emu::set_seed(s); return 0; }
long long emu_arena_bytes() { return (long long)kArenaBytes; }

// kind: 0 fwd, 1 dkdv, 2 dq -> floats of dynamic shared memory (constexpr in the kernel file)
int emu_smem_floats(int kind, int D) {
    using namespace minitx_flash;
#define SMEM_CASE(DD)                                                       \
    if (D == DD) {                                                          \
        if (kind == 0) return fwd_smem_floats<DD>();                        \
        if (kind == 1) return dkdv_smem_floats<DD>();                       \
        if (kind == 2) return dq_smem_floats<DD>();                         \
    }
    SMEM_CASE(32) SMEM_CASE(64) SMEM_CASE(128)
#undef SMEM_CASE
    return -1;
}

int flash_fwd_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                     unsigned by, unsigned bz, size_t smem, const void* q, const void* k,
                     const void* v, void* o, float* lse, const int* lengths,
                     const unsigned char* kmask, int H, int Hkv, int Nq, int Nk, float scale) {
    dim3 grid(gx, gy, gz), block(bx, by, bz);
#define FWD_CASE(T, TN, D, C, CN)                                                          \
    if (!std::strcmp(name, "flash_fwd<" TN ", " #D ", " CN ">"))                          \
        return emu::launch(grid, block, smem, [&] {                                       \
            flash_fwd<T, D, C>((const T*)q, (const T*)k, (const T*)v, (T*)o, lse, lengths, \
                               kmask, H, Hkv, Nq, Nk, scale);                             \
        });
    EMU_CONFIGS(FWD_CASE)
#undef FWD_CASE
    return -1;
}

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

int flash_bwd_dkdv_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned by, unsigned bz, size_t smem, const void* q, const void* k,
                          const void* v, const void* dout, const float* lse, const float* dvec,
                          float* dk, float* dv, const int* lengths, const unsigned char* kmask,
                          int H, int Hkv, int Nq, int Nk, float scale) {
    dim3 grid(gx, gy, gz), block(bx, by, bz);
#define DKDV_CASE(T, TN, D, C, CN)                                                         \
    if (!std::strcmp(name, "flash_bwd_dkdv<" TN ", " #D ", " CN ">"))                     \
        return emu::launch(grid, block, smem, [&] {                                       \
            flash_bwd_dkdv<T, D, C>((const T*)q, (const T*)k, (const T*)v, (const T*)dout, \
                                    lse, dvec, dk, dv, lengths, kmask, H, Hkv, Nq, Nk,    \
                                    scale);                                               \
        });
    EMU_CONFIGS(DKDV_CASE)
#undef DKDV_CASE
    return -1;
}

int flash_bwd_dq_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, size_t smem, const void* q, const void* k,
                        const void* v, const void* dout, const float* lse, const float* dvec,
                        void* dq, const int* lengths, const unsigned char* kmask, int H, int Hkv,
                        int Nq, int Nk, float scale) {
    dim3 grid(gx, gy, gz), block(bx, by, bz);
#define DQ_CASE(T, TN, D, C, CN)                                                           \
    if (!std::strcmp(name, "flash_bwd_dq<" TN ", " #D ", " CN ">"))                       \
        return emu::launch(grid, block, smem, [&] {                                       \
            flash_bwd_dq<T, D, C>((const T*)q, (const T*)k, (const T*)v, (const T*)dout,   \
                                  lse, dvec, (T*)dq, lengths, kmask, H, Hkv, Nq, Nk,      \
                                  scale);                                                 \
        });
    EMU_CONFIGS(DQ_CASE)
#undef DQ_CASE
    return -1;
}

}  // extern "C"

#ifdef EMU_MAIN
// Small forward + backward (float, D=32, causal, lengths, GQA) for the ThreadSanitizer run.
// Prints "EMU_MAIN OK" when every launch succeeded and every output is finite.
#include <cmath>
int main() {
    const int B = 1, H = 2, Hkv = 1, Nq = 33, Nk = 40, D = 32;
    const float scale = 0.17677669f;
    std::vector<float> q(B * H * Nq * D), k(B * Hkv * Nk * D), v(k.size()), dout(q.size());
    unsigned s = 1;
    auto rnd = [&] { s = s * 1664525u + 1013904223u; return float(s >> 8) / float(1 << 24) - 0.5f; };
    for (auto* a : {&q, &k, &v, &dout})
        for (auto& x : *a) x = rnd();
    std::vector<float> o(q.size()), lse(B * H * Nq), dvec(B * H * Nq), dq(q.size());
    std::vector<float> dk(B * H * Nk * D), dv(dk.size());
    int lengths[1] = {37};
    const char* cs = "true";
    char name[128];
    int rc = 0;
    const unsigned qt = (Nq + 31) / 32, kt = (Nk + 31) / 32;
    std::snprintf(name, sizeof name, "flash_fwd<float, 32, %s>", cs);
    rc |= flash_fwd_launch(name, qt, B * H, 1, 128, 1, 1, 4 * minitx_flash::fwd_smem_floats<32>(),
                           q.data(), k.data(), v.data(), o.data(), lse.data(), lengths, nullptr,
                           H, Hkv, Nq, Nk, scale);
    rc |= flash_bwd_dot_launch("flash_bwd_dot<float>", (B * H * Nq + 3) / 4, 1, 1, 128, 1, 1, 0,
                               o.data(), dout.data(), dvec.data(), B * H * Nq, D);
    std::snprintf(name, sizeof name, "flash_bwd_dkdv<float, 32, %s>", cs);
    rc |= flash_bwd_dkdv_launch(name, kt, B * H, 1, 128, 1, 1, 4 * minitx_flash::dkdv_smem_floats<32>(),
                                q.data(), k.data(), v.data(), dout.data(), lse.data(), dvec.data(),
                                dk.data(), dv.data(), lengths, nullptr, H, Hkv, Nq, Nk, scale);
    std::snprintf(name, sizeof name, "flash_bwd_dq<float, 32, %s>", cs);
    rc |= flash_bwd_dq_launch(name, qt, B * H, 1, 128, 1, 1, 4 * minitx_flash::dq_smem_floats<32>(),
                              q.data(), k.data(), v.data(), dout.data(), lse.data(), dvec.data(),
                              dq.data(), lengths, nullptr, H, Hkv, Nq, Nk, scale);
    if (rc != 0) { std::printf("EMU_MAIN launch error %d\n", rc); return 2; }
    for (auto* a : {&o, &dq, &dk, &dv})
        for (float x : *a)
            if (!std::isfinite(x)) { std::printf("EMU_MAIN non-finite output\n"); return 3; }
    std::printf("EMU_MAIN OK\n");
    return 0;
}
#endif
