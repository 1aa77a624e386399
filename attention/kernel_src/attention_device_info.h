// attention_device_info.h: the device properties the host sides of the CUDA attention decide by
// (the forward's tiles and splits in attention_cuda.cu, the backward's stages and largest head dim
// in attention_bwd.cu), queried once per device and cached. Defined in attention_cuda.cu.
#pragma once

#include <cuda_runtime_api.h>

namespace attention {
namespace cuda {

struct DeviceInfo {
  int sms;
  int smem_optin;  // bytes of shared memory one CTA may opt into
  int l2_bytes;
  int cc_major;
  int smem_per_sm;  // shared memory of an SM (all its CTAs together)
};

// The current device's properties (attribute queries on the first call per device only).
cudaError_t device_info(DeviceInfo* info);

}  // namespace cuda
}  // namespace attention
