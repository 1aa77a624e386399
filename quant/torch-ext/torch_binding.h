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

#include <cstdint>
#include <optional>
#include <string>

#include "scaled_mm_params.h"

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

// ---- scaled GEMMs (scaled_mm_ops.cpp; formulas: kernel_src/scaled_mm_params.h) ----
//
// out = a @ b with float32 scales, vLLM's cutlass_scaled_mm family. a [M, K] row-major and b
// [K, N] column-major (the .t() of a row-major [N, K] weight), both float8_e4m3fn or both int8;
// K and N multiples of 16. Scales select the mode: a_scales with 1 or M elements (per tensor /
// per token) and b_scales with 1 or N (per tensor / per channel), or blockwise fp8, a_scales
// [M, K / 128] and b_scales [K / 128, ceil(N / 128)].

// out = scale_a * scale_b * (a @ b) + bias
void cutlass_scaled_mm(at::Tensor& out,                         // [M, N] float16 / bfloat16
                       const at::Tensor& a,                     // [M, K]
                       const at::Tensor& b,                     // [K, N], column-major
                       const at::Tensor& a_scales,              // 1, M or [M, K / 128]
                       const at::Tensor& b_scales,              // 1, N or [K / 128, ceil(N / 128)]
                       const std::optional<at::Tensor>& bias);  // [N] of out's dtype
// out = act(scale_a * scale_b * (a @ b) + bias), activation "none", "gelu", "gelu_tanh", "silu"
void cutlass_scaled_mm_act(at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                           const at::Tensor& a_scales, const at::Tensor& b_scales,
                           const std::optional<at::Tensor>& bias, const std::string& activation);
// int8 with asymmetric activations: out = scale_a * scale_b * (a @ b - zp) + bias, zp[m, n] =
// azp[m] * azp_adj[n] (per-token zero points) or azp_adj[n] (per-tensor, folded into azp_adj)
void cutlass_scaled_mm_azp(at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                           const at::Tensor& a_scales,              // 1 or M
                           const at::Tensor& b_scales,              // 1 or N
                           const at::Tensor& azp_adj,               // [N] int32
                           const std::optional<at::Tensor>& azp,    // [M] int32
                           const std::optional<at::Tensor>& bias);  // [N] of out's dtype
// out = act(x @ weight.t() + bias) for unquantized bfloat16 / float16 x [M, K] and weight [N, K]
// row-major (out and bias of their dtype). CUDA: capability 9.0 on the "auto" path only.
void linear_act(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                const std::optional<at::Tensor>& bias, const std::string& activation);
// Gated MLP: out[m, n] = act(g[m, n]) * u[m, n], g and u the scaled, biased products of a with
// the gate and up columns of b, the packed weight [K, 2N] (blocks of 64 columns, gate then up;
// scales and bias in that packed order). fp8 / int8 with scales (1 or M, 1 or 2N), or
// bfloat16 / float16 without. CUDA: capability 9.0 on the "auto" path only.
void scaled_mm_gated(at::Tensor& out,                            // [M, N]
                     const at::Tensor& a,                        // [M, K]
                     const at::Tensor& b,                        // [K, 2N], column-major
                     const std::optional<at::Tensor>& a_scales,  // 1 or M
                     const std::optional<at::Tensor>& b_scales,  // 1 or 2N
                     const std::optional<at::Tensor>& bias,      // [2N] of out's dtype
                     const std::string& activation);
// "none", "gelu", "gelu_tanh" or "silu" as the epilogue's Activation; anything else raises
// naming `op` (scaled_mm_ops.cpp).
quant::Activation parse_activation(const char* op, const std::string& name);
// Whether a CUDA build of this kernel has fp8 (blockwise fp8) GEMMs for a GPU of capability
// major * 10 + minor (the CPU build answers for a CUDA build: kernel_src/scaled_mm_support.h).
bool cutlass_scaled_mm_supports_fp8(int64_t cuda_device_capability);
bool cutlass_scaled_mm_supports_block_fp8(int64_t cuda_device_capability);
// Process-wide choice of CUDA GEMM family: "auto" or "sm80" (the mma.sync kernels on any GPU
// that runs them). Accepted and ignored by the CPU build.
void _set_scaled_mm_path(const std::string& path);

// ---- int4 weight-only (w4a16_ops.cpp; layout: kernel_src/w4a16_layout.h, formula:
// kernel_src/w4a16_params.h). CUDA: capability 8.0 or newer. ----

// packed = our layout of codes (uint8 [K, N], values 0..15, higher bits ignored); K a multiple
// of 16, N of 64
void int4_pack(at::Tensor& packed,        // int32 [K / 16, 2 N], written
               const at::Tensor& codes);  // uint8 [K, N]
// codes = the 4-bit codes of packed (the inverse of int4_pack)
void int4_unpack(at::Tensor& codes,          // uint8 [K, N], written
                 const at::Tensor& packed);  // int32 [K / 16, 2 N]
// out = act(a[:, perm] @ w + bias), w[k, n] = (q[k, n] - z) * s with z, s per group of
// K / groups rows (z = 8 without zeros)
void w4a16_gemm(at::Tensor& out,                         // [M, N] of a's dtype
                const at::Tensor& a,                     // [M, K] float16 / bfloat16
                const at::Tensor& b,                     // int32 [K / 16, 2 N], packed
                const at::Tensor& scales,                // [groups, N] of a's dtype
                const std::optional<at::Tensor>& zeros,  // [groups, N] of a's dtype
                const std::optional<at::Tensor>& perm,   // int32 [K]
                const std::optional<at::Tensor>& bias,   // [N] of a's dtype
                const std::string& activation);
// Gated: b holds gate and up in alternating blocks of 64 columns (pack_gate_up's order, N of
// them in all; scales, zeros, bias the same); out = act(gate product) * up product, [M, N / 2]
void w4a16_gemm_gated(at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                      const at::Tensor& scales, const std::optional<at::Tensor>& zeros,
                      const std::optional<at::Tensor>& perm, const std::optional<at::Tensor>& bias,
                      const std::string& activation);
