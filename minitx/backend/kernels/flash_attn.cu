// minitx flash attention: the CUDA kernels (hand written; forward and backward).
//
// Compiled at run time with NVRTC (CuPy RawModule + name expressions such as
// "flash_fwd_tc<64, true>", with -I<this directory>), checked offline with nvcc/ptxas for sm_80
// and sm_90, and executed on the CPU by the emulation harness in tests/gpu/cuda (g++ with
// -DMINITX_EMULATION, one std::thread per CUDA thread). See docs/cuda_kernel.md.
//
// Read flash_naive.cuh first: one thread per row, fp32, the online softmax in its plainest form
// (chosen with MINITX_FLASH_KERNEL=naive). The tiled families are the same loop made fast:
//   flash_naive.cuh fp32, one thread per query (or key) row, everything from global memory
//                   flash_fwd_naive<D, CAUSAL>, flash_bwd_dq_naive<D, CAUSAL>,
//                   flash_bwd_dkdv_naive<D, CAUSAL>
// and the two tiled families, picked by the launcher (minitx/backend/flash_cuda.py) by dtype:
//   flash_tc.cuh    fp16 on tensor cores (mma.sync m16n8k16, ldmatrix, cp.async; sm_80+)
//                   flash_fwd_tc<D, CAUSAL>, flash_bwd_dq_tc<D, CAUSAL>,
//                   flash_bwd_dkdv_tc<D, CAUSAL>
//   flash_simt.cuh  fp32 on CUDA cores (register tiles, 128-bit shared loads, cp.async on sm_80+)
//                   flash_fwd_simt<D, CAUSAL>, flash_bwd_dq_simt<D, CAUSAL>,
//                   flash_bwd_dkdv_simt<D, CAUSAL>
// and, chosen with MINITX_FLASH_KERNEL=tf32, fp32 on tensor cores:
//   flash_tf32.cuh  fp32 as 3xTF32 (mma.sync m16n8k8: each operand split into two tf32 parts,
//                   three products; sm_80+), the fp16 kernels' loop with fp32 tiles
//                   flash_fwd_tf32<D, CAUSAL>, flash_bwd_dq_tf32<D, CAUSAL>,
//                   flash_bwd_dkdv_tf32<D, CAUSAL>
// and, chosen with MINITX_FLASH_KERNEL=tc_bm128 | tc_kvreg | tc_onepass, three fp16 levers,
// each one tc kernel replaced (the family's other passes are tc's):
//   flash_tc_levers.cuh  flash_fwd_tc_bm128<D, CAUSAL> (two m-tiles per warp),
//                   flash_bwd_dkdv_tc_kvreg<D, CAUSAL> (K and V fragments in registers),
//                   flash_bwd_dkdv_tc_onepass<D, CAUSAL> (dQ added with atomics: no dQ pass)
// and flash_bwd_dot<T> (T = float | __half, flash_common.cuh), the backward's pre-pass.
// D = 32 | 64 | 128 (the launcher zero pads other head dims), CAUSAL = bottom-right aligned.
#include "flash_common.cuh"
#include "flash_naive.cuh"
#include "flash_simt.cuh"
#include "flash_tc.cuh"
#include "flash_tf32.cuh"
#include "flash_tc_levers.cuh"
