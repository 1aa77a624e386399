// attention_cpu_types.h: the element types of the CPU kernels (attention_cpu.cpp,
// attention_cpu_bwd.cpp, cache_cpu.cpp): one dispatch from DType, and the arithmetic type of each.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <type_traits>

#include "attention_params.h"

namespace attention {
namespace cpu {

// The arithmetic type of T tensors: float32, and float64 for float64 (gradient checks).
template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Calls f(T()) with the element type T of `dtype`.
template <typename F>
void with_element_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      f(float());
      break;
    case DType::kFloat16:
      f(c10::Half());
      break;
    case DType::kBFloat16:
      f(c10::BFloat16());
      break;
    case DType::kFloat64:
      f(double());
      break;
  }
}

}  // namespace cpu
}  // namespace attention
