// scaled_mm_sm80.cu: entry points of the mma.sync scaled GEMMs (scaled_mm_sm80.h). This file
// holds no kernels: it checks what the CUTLASS instances need beyond the torch-ext checks
// (alignment of every vector that the epilogue reads 16 bytes at a time, 32-bit sizes, the
// operand's architecture) and hands over to the per-operand translation units.
#include "scaled_mm_sm80.h"

#include <climits>
#include <cstdint>

#include "scaled_mm_sm80_operands.h"

namespace quant {
namespace cuda {
namespace sm80 {
namespace {

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// The layout requirements of the kernels: 16-byte aligned A, B and D rows (so the operand and
// output tiles load and store as 16-byte vectors), 16-byte aligned per-column vectors (the
// epilogue reads scale_b, azp_adj and bias in 16-byte pieces), sizes that fit CUTLASS 2.x's
// int problem shape, and the terms the contract allows for the operand.
bool implementable(const ScaledMmParams& p) {
  const int64_t out_bytes = 2;  // bf16 and fp16
  if (p.out_dtype != DType::kBFloat16 && p.out_dtype != DType::kFloat16) return false;
  if (p.m < 0 || p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX) return false;
  if (p.n <= 0 || p.k <= 0 || p.n % 16 != 0 || p.k % 16 != 0) return false;
  if (p.lda < p.k || p.ldb < p.k || p.ldd < p.n) return false;
  if (p.lda % 16 != 0 || p.ldb % 16 != 0 || (p.ldd * out_bytes) % 16 != 0) return false;
  if (!aligned16(p.a) || !aligned16(p.b) || !aligned16(p.d)) return false;
  if (p.scale_a == nullptr || p.scale_b == nullptr) return false;
  if (p.scale_b_per_col && !aligned16(p.scale_b)) return false;
  if (p.bias != nullptr && !aligned16(p.bias)) return false;
  if (p.azp != nullptr && p.azp_adj == nullptr) return false;
  if (p.operand == GemmOperand::kFp8E4m3) return p.azp_adj == nullptr;
  return p.azp_adj == nullptr || aligned16(p.azp_adj);
}

}  // namespace

bool supported(int capability, GemmOperand operand) {
  switch (operand) {
    case GemmOperand::kInt8:
      return capability >= 80;
    case GemmOperand::kFp8E4m3:
      return capability >= 89;
  }
  return false;
}

// The kernels are data parallel (no split-K or stream-K), so they need no scratch memory.
size_t workspace_size(const ScaledMmParams&, int) { return 0; }

cudaError_t scaled_mm(const ScaledMmParams& p, void*, int device, cudaStream_t stream) {
  int major = 0, minor = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  }
  if (err != cudaSuccess) return err;
  if (!supported(major * 10 + minor, p.operand) || !implementable(p)) {
    return cudaErrorInvalidValue;
  }
  if (p.m == 0) return cudaSuccess;
  return p.operand == GemmOperand::kInt8 ? run_operand<GemmOperand::kInt8>(p, device, stream)
                                         : run_operand<GemmOperand::kFp8E4m3>(p, device, stream);
}

}  // namespace sm80
}  // namespace cuda
}  // namespace quant
