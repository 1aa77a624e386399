// attention_bwd.cu: the host launcher of the CUDA attention backward (attention_bwd_kernel.cuh)
// and its instances: fp16 / bf16 x head dims 32, 64, 96, 128, 256 (a caller's head dim runs on the
// smallest instance that holds it, its extra columns zero), each in two schedules: dQ in a pass
// of its own (deterministic), or added with atomics into AttnBwdParams::dq_accum during the dK/dV
// pass and converted after it (where dq_accum is set).
#include <cuda_runtime.h>

#include "attention_bwd_kernel.cuh"
#include "attention_cuda.h"

namespace attention {
namespace cuda {
namespace {

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
  constexpr int threads = bwd::DkDvWarps<D>::kThreads;
  using Two = bwd::DkDvSmem<T, D, kAtomicDq, 2>;
  using One = bwd::DkDvSmem<T, D, kAtomicDq, 1>;
  switch (stages_within<D, Two::kBytes, One::kBytes>(smem_limit)) {
    case 2:
      return launch(bwd::attn_bwd_dkdv_kernel<T, D, kAtomicDq, 2>, threads, Two::kBytes, grid, p,
                    dsum, stream);
    case 1:
      if constexpr (D >= 128) {
        return launch(bwd::attn_bwd_dkdv_kernel<T, D, kAtomicDq, 1>, threads, One::kBytes, grid, p,
                      dsum, stream);
      }
      [[fallthrough]];
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename T, int D>
cudaError_t launch_dq(const AttnBwdParams& p, const float* dsum, dim3 grid, int smem_limit,
                      cudaStream_t stream) {
  using Two = bwd::DqSmem<T, D, 2>;
  using One = bwd::DqSmem<T, D, 1>;
  switch (stages_within<D, Two::kBytes, One::kBytes>(smem_limit)) {
    case 2:
      return launch(bwd::attn_bwd_dq_kernel<T, D, 2>, bwd::kThreads, Two::kBytes, grid, p, dsum,
                    stream);
    case 1:
      if constexpr (D >= 128) {
        return launch(bwd::attn_bwd_dq_kernel<T, D, 1>, bwd::kThreads, One::kBytes, grid, p, dsum,
                      stream);
      }
      [[fallthrough]];
    default:
      return cudaErrorInvalidValue;
  }
}

// The opt-in shared memory of a block on the current device (0 where the query fails).
int block_smem_limit() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    return 0;
  }
  return bytes;
}

template <typename T, int D>
cudaError_t launch_bwd(const AttnBwdParams& p, float* dsum, int64_t q_rows, cudaStream_t stream) {
  const int smem_limit = block_smem_limit();
  const AttnFwdParams& f = p.fwd;
  const int64_t dsum_items = q_rows * f.heads_q;
  if (dsum_items > 0) {
    const int64_t blocks = (dsum_items * 32 + 255) / 256;
    bwd::attn_bwd_dsum_kernel<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
        p, dsum, f.cu_seqlens_q != nullptr ? q_rows : f.seqlen_q, dsum_items);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const auto blocks_of = [](int64_t rows) {
    return static_cast<unsigned>((rows + bwd::kBlockRows - 1) / bwd::kBlockRows);
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
    bwd::attn_bwd_dq_convert_kernel<T>
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

template <typename T>
cudaError_t launch_bwd_for_dim(const AttnBwdParams& p, float* dsum, int64_t q_rows,
                               cudaStream_t stream) {
  const int64_t d = p.fwd.head_dim;
  if (d <= 32) return launch_bwd<T, 32>(p, dsum, q_rows, stream);
  if (d <= 64) return launch_bwd<T, 64>(p, dsum, q_rows, stream);
  if (d <= 96) return launch_bwd<T, 96>(p, dsum, q_rows, stream);
  if (d <= 128) return launch_bwd<T, 128>(p, dsum, q_rows, stream);
  return launch_bwd<T, 256>(p, dsum, q_rows, stream);
}

}  // namespace

int64_t attn_bwd_max_head_dim() {
  // fp16 and bf16 take the same bytes; the atomic dK/dV pass the most of the three.
  using Dkdv = bwd::DkDvSmem<__half, 256, true, 1>;
  using Dq = bwd::DqSmem<__half, 256, 1>;
  const int limit = block_smem_limit();
  return Dkdv::kBytes <= limit && Dq::kBytes <= limit ? 256 : 128;
}

cudaError_t attn_bwd(const AttnBwdParams& params, float* dsum, int64_t q_rows,
                     cudaStream_t stream) {
  const AttnFwdParams& f = params.fwd;
  if (f.head_dim <= 0 || f.head_dim > attn_bwd_max_head_dim() || f.head_dim % 8 != 0 ||
      f.heads_kv <= 0 || f.heads_q % f.heads_kv != 0 || f.lse == nullptr || dsum == nullptr ||
      f.batch > 65535 || f.heads_q > 65535 || f.block_table != nullptr || f.seqused_k != nullptr ||
      f.kv_batch_idx != nullptr || f.leftpad_k != nullptr) {
    return cudaErrorInvalidValue;
  }
  if (f.batch == 0 || f.heads_q == 0) return cudaSuccess;
  switch (f.dtype) {
    case DType::kFloat16:
      return launch_bwd_for_dim<__half>(params, dsum, q_rows, stream);
    case DType::kBFloat16:
      return launch_bwd_for_dim<__nv_bfloat16>(params, dsum, q_rows, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace cuda
}  // namespace attention
