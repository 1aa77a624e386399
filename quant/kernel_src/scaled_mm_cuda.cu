// scaled_mm_cuda.cu: the CUDA scaled GEMM entry points (scaled_mm_cuda.h). Hopper (capability
// 9.0) runs the wgmma kernels of scaled_mm_sm90.cu; every other GPU, or a caller that forces
// GemmPath::kTensorCoreSm80, the mma.sync kernels of scaled_mm_sm80.cu.
#include "scaled_mm_cuda.h"

#include "scaled_mm_sm80.h"
#include "scaled_mm_sm90.h"
#include "scaled_mm_support.h"

namespace quant {
namespace cuda {
namespace {

constexpr int kHopper = 90;

struct DeviceInfo {
  int capability;
  int sm_count;
};

// Queried once per device: these calls sit on every GEMM's host path.
DeviceInfo device_info(int device) {
  constexpr int kMaxDevices = 64;
  static DeviceInfo cache[kMaxDevices] = {};
  if (device >= 0 && device < kMaxDevices && cache[device].sm_count > 0) return cache[device];
  int major = 0, minor = 0, sms = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const DeviceInfo info{major * 10 + minor, sms};
  if (device >= 0 && device < kMaxDevices) cache[device] = info;  // same value from any thread
  return info;
}

bool use_hopper_kernels(const DeviceInfo& info, GemmPath path) {
  return info.capability == kHopper && path == GemmPath::kAuto;
}

// The forms only the Hopper kernels have: 16-bit operands (linear_act) and the gated MLP.
bool hopper_only(const ScaledMmParams& p) { return p.gated || is_sixteen_bit(p.operand); }

}  // namespace

bool scaled_mm_supported(int capability, GemmOperand operand) {
  return scaled_mm_capability_supports(capability, operand);
}

bool block_scaled_mm_supported(int capability) {
  return block_scaled_mm_capability_supports(capability);
}

size_t scaled_mm_workspace_size(const ScaledMmParams& p, int device, GemmPath path) {
  const DeviceInfo info = device_info(device);
  if (use_hopper_kernels(info, path)) return sm90::workspace_size(p, info.sm_count);
  return hopper_only(p) ? 0 : sm80::workspace_size(p, device);
}

cudaError_t scaled_mm(const ScaledMmParams& p, void* workspace, int device, GemmPath path,
                      cudaStream_t stream) {
  const DeviceInfo info = device_info(device);
  if (use_hopper_kernels(info, path)) return sm90::scaled_mm(p, workspace, info.sm_count, stream);
  if (hopper_only(p)) return cudaErrorNotSupported;  // torch-ext/ runs these unfused instead
  return sm80::scaled_mm(p, workspace, device, stream);
}

size_t block_scaled_mm_workspace_size(const BlockScaledMmParams& p, int device) {
  const DeviceInfo info = device_info(device);
  return block_scaled_mm_supported(info.capability) ? sm90::block_workspace_size(p, info.sm_count)
                                                    : 0;
}

cudaError_t block_scaled_mm(const BlockScaledMmParams& p, void* workspace, int device,
                            cudaStream_t stream) {
  const DeviceInfo info = device_info(device);
  if (!block_scaled_mm_supported(info.capability)) return cudaErrorNoKernelImageForDevice;
  return sm90::block_scaled_mm(p, workspace, info.sm_count, stream);
}

}  // namespace cuda
}  // namespace quant
