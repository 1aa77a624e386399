// attention_bwd.cu: the host side of the CUDA attention backward: checks the params and runs the
// instance of their dtype and head dim (attention_bwd_instances.h: fp16 / bf16 x head dims 32, 64,
// 96, 128, 256; a caller's head dim runs on the smallest instance that holds it, its extra
// columns zero), each in two schedules: dQ in a pass of its own (deterministic), or added with
// atomics into AttnBwdParams::dq_accum during the dK/dV pass and converted after it (where
// dq_accum is set).
#include <cuda_runtime.h>

#include "attention_bwd_instances.h"
#include "attention_bwd_tile.cuh"
#include "attention_cuda.h"
#include "attention_device_info.h"

namespace attention {
namespace cuda {
namespace {

// The largest head dim whose tiles a block of smem_limit bytes holds (one stage): fp16 and bf16
// take the same bytes, and the atomic dK/dV pass the most of the three passes.
int64_t max_head_dim_within(int smem_limit) {
  using Dkdv = bwd::DkDvSmem<256, true, 1>;
  using Dq = bwd::DqSmem<256, 1>;
  return Dkdv::kBytes <= smem_limit && Dq::kBytes <= smem_limit ? 256 : 128;
}

template <typename T>
cudaError_t launch_for_dim(const AttnBwdParams& p, float* dsum, int64_t q_rows, int smem_limit,
                           cudaStream_t stream) {
  const int64_t d = p.fwd.head_dim;
  if (d <= 32) return launch_bwd_instance<T, 32>(p, dsum, q_rows, smem_limit, stream);
  if (d <= 64) return launch_bwd_instance<T, 64>(p, dsum, q_rows, smem_limit, stream);
  if (d <= 96) return launch_bwd_instance<T, 96>(p, dsum, q_rows, smem_limit, stream);
  if (d <= 128) return launch_bwd_instance<T, 128>(p, dsum, q_rows, smem_limit, stream);
  return launch_bwd_instance<T, 256>(p, dsum, q_rows, smem_limit, stream);
}

}  // namespace

int64_t attn_bwd_max_head_dim() {
  DeviceInfo dev{};
  return device_info(&dev) == cudaSuccess ? max_head_dim_within(dev.smem_optin) : 128;
}

cudaError_t attn_bwd(const AttnBwdParams& params, float* dsum, int64_t q_rows,
                     cudaStream_t stream) {
  const AttnFwdParams& f = params.fwd;
  DeviceInfo dev{};
  const cudaError_t queried = device_info(&dev);
  if (queried != cudaSuccess) return queried;
  const int smem_limit = dev.smem_optin;
  if (f.head_dim <= 0 || f.head_dim > max_head_dim_within(smem_limit) || f.head_dim % 8 != 0 ||
      f.heads_kv <= 0 || f.heads_q % f.heads_kv != 0 || f.lse == nullptr || dsum == nullptr ||
      f.batch > 65535 || f.heads_q > 65535 || f.block_table != nullptr || f.seqused_k != nullptr ||
      f.kv_batch_idx != nullptr || f.leftpad_k != nullptr) {
    return cudaErrorInvalidValue;
  }
  if (f.batch == 0 || f.heads_q == 0) return cudaSuccess;
  switch (f.dtype) {
    case DType::kFloat16:
      return launch_for_dim<__half>(params, dsum, q_rows, smem_limit, stream);
    case DType::kBFloat16:
      return launch_for_dim<__nv_bfloat16>(params, dsum, q_rows, smem_limit, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace cuda
}  // namespace attention
