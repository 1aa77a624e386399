// torch_binding.h: Torch-facing launchers of the quantize ops (defined in quant_ops.cpp,
// registered in torch_binding.cpp), with vLLM's schemas and argument order.
//
// Every op writes caller-provided tensors and returns nothing. `input` is float32, float16 or
// bfloat16 of shape [..., hidden] (any number of leading dimensions, rows of unit stride; other
// layouts are read through a contiguous copy); `result` / `output_q` has the input's shape, dtype
// float8_e4m3fn (fp8 ops) or int8, unit stride along rows and leading dimensions that collapse
// into one row stride. Scales are float32, azp int32, all contiguous. M = input.numel() / hidden.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

// result = fp8(clamp(input * (1 / scale), -448, 448))
void static_scaled_fp8_quant(at::Tensor& result,        // [..., hidden] float8_e4m3fn
                             const at::Tensor& input,   // [..., hidden]
                             const at::Tensor& scale);  // [1]
// scale = max(amax(|input|) / 448, 1 / (448 * 512)), then as static_scaled_fp8_quant
void dynamic_scaled_fp8_quant(at::Tensor& result,       // [..., hidden] float8_e4m3fn
                              const at::Tensor& input,  // [..., hidden]
                              at::Tensor& scale);       // [1], written
// per row: scale = max(min(amax, scale_ub) / 448, 1 / (448 * 512)); result = fp8(clamp(x / scale))
void dynamic_per_token_scaled_fp8_quant(at::Tensor& result,       // [..., hidden] float8_e4m3fn
                                        const at::Tensor& input,  // [..., hidden]
                                        at::Tensor& scale,        // M elements, written
                                        const std::optional<at::Tensor>& scale_ub);  // [1]
// result = sat8(round_half_even(input / scale) [+ azp])
void static_scaled_int8_quant(at::Tensor& result,                     // [..., hidden] int8
                              const at::Tensor& input,                // [..., hidden]
                              const at::Tensor& scale,                // [1]
                              const std::optional<at::Tensor>& azp);  // [1] int32
// per row, symmetric when azp is None (quant_params.h, DynamicInt8Params)
void dynamic_scaled_int8_quant(at::Tensor& result,              // [..., hidden] int8
                               const at::Tensor& input,         // [..., hidden]
                               at::Tensor& scale,               // M elements, written
                               std::optional<at::Tensor> azp);  // M elements int32, written
// per group of group_size elements of each row (quant_params.h, GroupFp8Params)
void per_token_group_fp8_quant(const at::Tensor& input,  // [..., hidden]
                               at::Tensor& output_q,     // [..., hidden] float8_e4m3fn
                               at::Tensor& output_s,     // [..., hidden / group_size], any strides
                                                         // whose leading dimensions collapse
                               int64_t group_size, double eps, double fp8_min, double fp8_max,
                               bool scale_ue8m0);
