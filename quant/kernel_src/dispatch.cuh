// dispatch.cuh: dtype dispatch for the CUDA launchers of kernel_src/ (torch-free).
//
// Source of truth: common/dispatch.cuh. Each kernel folder builds alone, so scripts/sync_common.py
// copies this file into <kernel>/kernel_src/ and tests/test_common_sync.py fails when a copy
// drifts. Edit it here, then run `python scripts/sync_common.py`.
//
// A launcher turns the DType enum of its params (rmsnorm_params.h, rope_params.h, ...) into C++
// element types once, at its public entry point: each function below calls f(TypeTag<T>{}...)
// with the element type(s) of one named type set and returns what f returns. Every switch ends
// in a failing default: a value outside the set returns cudaErrorInvalidValue, the launchers'
// error for arguments they do not support (torch-ext/ rejects such dtypes before, with a message
// naming the op, the argument and the dtype, so this is the last line of defence). The DType
// enum is the kernel's own; it needs the enumerators of the set used (kFloat32, kFloat16,
// kBFloat16, and kFloat64 for floats_and_double). Everything has internal linkage, so the
// copies in different kernel libraries never clash.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace {
namespace dispatch {

// An element type as a value: f(auto tag) gets it back as typename decltype(tag)::type.
template <typename T>
struct TypeTag {
  using type = T;
};

// The float set: kFloat32 -> float, kFloat16 -> __half, kBFloat16 -> __nv_bfloat16.
template <typename DType, typename F>
cudaError_t floats(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(TypeTag<float>{});
    case DType::kFloat16:
      return f(TypeTag<__half>{});
    case DType::kBFloat16:
      return f(TypeTag<__nv_bfloat16>{});
    default:
      return cudaErrorInvalidValue;
  }
}

// The float set and kFloat64 -> double.
template <typename DType, typename F>
cudaError_t floats_and_double(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(TypeTag<float>{});
    case DType::kFloat16:
      return f(TypeTag<__half>{});
    case DType::kBFloat16:
      return f(TypeTag<__nv_bfloat16>{});
    case DType::kFloat64:
      return f(TypeTag<double>{});
    default:
      return cudaErrorInvalidValue;
  }
}

// The set {the type of `ref`, float}, for a tensor that has either the dtype of a reference tensor
// or float32 (a float32 weight or table next to half-precision activations): dtype == ref_dtype
// -> f(ref) (checked first, so a float32 reference gives f(ref) too), kFloat32 -> f(float).
template <typename DType, typename T, typename F>
cudaError_t same_or_float(DType dtype, DType ref_dtype, TypeTag<T> ref, F&& f) {
  if (dtype == ref_dtype) return f(ref);
  switch (dtype) {
    case DType::kFloat32:
      return f(TypeTag<float>{});
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace dispatch
}  // namespace
