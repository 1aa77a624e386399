// torch_binding.h: Torch-facing launchers of the newkernel ops (defined in newkernel_ops.cpp,
// registered in torch_binding.cpp).
//
// Every op writes into a caller-provided tensor and returns nothing. Tensors share one dtype
// (float32, float16, bfloat16 or float64) and one device. `...` is any number of leading
// dimensions (none included); the written tensor needs a unit last-dimension stride and leading
// dimensions that collapse into one row stride, the read tensor may have any strides.
#pragma once

#include <ATen/core/Tensor.h>

// out = alpha * input; alpha is rounded to float32.
void scale(at::Tensor& out,          // [...]
           const at::Tensor& input,  // [...]
           double alpha);
