// attention_bwd_launch.cuh: the launches of the CUDA attention backward's passes at one head dim
// (attention_bwd_kernel.cuh), each with the shared-memory stages the device holds. Included by the
// generated instance units attention_bwd_hdim*.cu (generate_instances.py), one per (head dim,
// dtype), so that attention_bwd.cu dispatches without compiling a kernel.
#pragma once

#include <cuda_runtime.h>

#include "attention_bwd_kernel.cuh"
#include "attention_params.h"

namespace attention {
namespace cuda {
namespace bwd {

template <typename Kernel>
cudaError_t launch(Kernel kernel, int threads, int smem, dim3 grid, const AttnBwdParams& p,
                   const float* dsum, cudaStream_t stream) {
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  kernel<<<grid, threads, smem, stream>>>(p, dsum);
  return cudaGetLastError();
}

// The stages of a pass: two where they fit a block's shared memory on this device (smem_limit),
// else one; instances of one stage exist from head dim 128 on, the smaller ones fit everywhere
// (sm_80+: 99 KB or more). 0 where even one stage does not fit (see attn_bwd_max_head_dim).
template <int D, int kTwoStageBytes, int kOneStageBytes>
constexpr int stages_within(int smem_limit) {
  if (kTwoStageBytes <= smem_limit) return 2;
  if (D >= 128 && kOneStageBytes <= smem_limit) return 1;
  return 0;
}

template <typename T, int D, bool kAtomicDq>
cudaError_t launch_dkdv(const AttnBwdParams& p, const float* dsum, dim3 grid, int smem_limit,
                        cudaStream_t stream) {
  constexpr int threads = DkDvWarps<D>::kThreads;
  using Two = DkDvSmem<D, kAtomicDq, 2>;
  using One = DkDvSmem<D, kAtomicDq, 1>;
  switch (stages_within<D, Two::kBytes, One::kBytes>(smem_limit)) {
    case 2:
      return launch(attn_bwd_dkdv_kernel<T, D, kAtomicDq, 2>, threads, Two::kBytes, grid, p, dsum,
                    stream);
    case 1:
      if constexpr (D >= 128) {
        return launch(attn_bwd_dkdv_kernel<T, D, kAtomicDq, 1>, threads, One::kBytes, grid, p, dsum,
                      stream);
      }
      [[fallthrough]];
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename T, int D>
cudaError_t launch_dq(const AttnBwdParams& p, const float* dsum, dim3 grid, int smem_limit,
                      cudaStream_t stream) {
  using Two = DqSmem<D, 2>;
  using One = DqSmem<D, 1>;
  switch (stages_within<D, Two::kBytes, One::kBytes>(smem_limit)) {
    case 2:
      return launch(attn_bwd_dq_kernel<T, D, 2>, kThreads, Two::kBytes, grid, p, dsum, stream);
    case 1:
      if constexpr (D >= 128) {
        return launch(attn_bwd_dq_kernel<T, D, 1>, kThreads, One::kBytes, grid, p, dsum, stream);
      }
      [[fallthrough]];
    default:
      return cudaErrorInvalidValue;
  }
}

// Every pass of the backward at head dim D (attention_bwd_kernel.cuh's header says which).
template <typename T, int D>
cudaError_t launch_bwd(const AttnBwdParams& p, float* dsum, int64_t q_rows, int smem_limit,
                       cudaStream_t stream) {
  const AttnFwdParams& f = p.fwd;
  const int64_t dsum_items = q_rows * f.heads_q;
  if (dsum_items > 0) {
    const int64_t blocks = (dsum_items * 32 + 255) / 256;
    attn_bwd_dsum_kernel<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
        p, dsum, f.cu_seqlens_q != nullptr ? q_rows : f.seqlen_q, dsum_items);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const auto blocks_of = [](int64_t rows) {
    return static_cast<unsigned>((rows + kBlockRows - 1) / kBlockRows);
  };
  const bool atomic_dq = p.dq_accum != nullptr;
  if (f.seqlen_k > 0) {
    const dim3 grid(blocks_of(f.seqlen_k), static_cast<unsigned>(f.heads_kv),
                    static_cast<unsigned>(f.batch));
    const cudaError_t err = atomic_dq ? launch_dkdv<T, D, true>(p, dsum, grid, smem_limit, stream)
                                      : launch_dkdv<T, D, false>(p, dsum, grid, smem_limit, stream);
    if (err != cudaSuccess) return err;
  }
  // Without keys the workspace stays at its zeros, which the conversion writes into dq.
  if (atomic_dq) {
    const int64_t pairs = q_rows * f.heads_q * (f.head_dim / 2);
    if (pairs == 0) return cudaSuccess;
    const int64_t blocks = (pairs + 255) / 256;
    attn_bwd_dq_convert_kernel<T>
        <<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(
            p, f.cu_seqlens_q != nullptr ? q_rows : f.seqlen_q, pairs);
    return cudaGetLastError();
  }
  if (f.seqlen_q > 0) {
    const dim3 grid(blocks_of(f.seqlen_q), static_cast<unsigned>(f.heads_q),
                    static_cast<unsigned>(f.batch));
    const cudaError_t err = launch_dq<T, D>(p, dsum, grid, smem_limit, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace bwd
}  // namespace cuda
}  // namespace attention
