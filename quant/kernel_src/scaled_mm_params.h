// scaled_mm_params.h: the torch-free contract between the Torch-facing layer (torch-ext/) and the
// CPU and CUDA scaled GEMMs (cutlass_scaled_mm and its relatives). Plain pointers, sizes, strides.
//
// Shapes follow vLLM's cutlass_scaled_mm: A is [M, K] row-major (the quantized activations),
// B is [K, N] column-major (the weight [N, K] row-major, transposed by view), D is [M, N]
// row-major. Every stride is in elements. Scales are float32, zero-point terms int32.
#pragma once

#include <cstdint>

#include "quant_params.h"

namespace quant {

// Element type of A and B (both the same). The 16-bit ones serve unquantized weights (scales
// null, D of the operands' type): linear_act on the CPU, the gated form on the CPU and Hopper.
enum class GemmOperand : int { kFp8E4m3 = 0, kInt8 = 1, kBFloat16 = 2, kFloat16 = 3 };

constexpr bool is_sixteen_bit(GemmOperand operand) {
  return operand == GemmOperand::kBFloat16 || operand == GemmOperand::kFloat16;
}

// Applied to each output element after scaling and bias (quant_math.h spells them out):
// gelu is the erf form, gelu_tanh the tanh approximation, silu x * sigmoid(x).
enum class Activation : int { kNone = 0, kGelu = 1, kGeluTanh = 2, kSilu = 3 };

// D[m, n] = act(scale_a[m] * scale_b[n] * (sum_k A[m, k] * B[k, n] - zp[m, n]) + bias[n])
// computed with an exact int32 (int8) or float32 (fp8) accumulator, rounded once to out_dtype.
//   zp[m, n] = azp[m] * azp_adj[n]  when azp is given (per-token asymmetric int8),
//            = azp_adj[n]           when only azp_adj is given (per-tensor: azp folded in),
//            = 0                    otherwise.
struct ScaledMmParams {
  GemmOperand operand;
  DType out_dtype;  // kFloat16 or kBFloat16
  const void* a;    // A[m, k] at a[m * lda + k]
  const void* b;    // B[k, n] at b[n * ldb + k]
  void* d;          // D[m, n] at d[m * ldd + n]
  int64_t m, n, k;  // m >= 0; n, k multiples of 16 (checked by torch-ext/)
  int64_t lda, ldb, ldd;
  const float* scale_a;  // [M] when scale_a_per_row, else [1]; nullptr reads as 1
  const float* scale_b;  // [N] when scale_b_per_col, else [1]; nullptr reads as 1
  bool scale_a_per_row;
  bool scale_b_per_col;
  const void* bias;        // [N] of out_dtype, or nullptr
  const int32_t* azp_adj;  // [N] or nullptr (int8 only)
  const int32_t* azp;      // [M] or nullptr (needs azp_adj)
  Activation activation;
  // Gated MLP form: B holds the gate and up projections in alternating blocks of kGateBlock
  // columns (gate block j, then up block j: pack_gate_up), so B is [K, 2N] and scale_b / bias
  // follow that packed order. D[m, n] = act(g[m, n]) * u[m, n], with g and u the scaled and
  // biased products of the two halves; n < N (D has N columns).
  bool gated;
};

// Width of the gate / up blocks of a packed gated weight (one wgmma accumulator tile holds a gate
// block and its up block).
constexpr int64_t kGateBlock = 64;

// Blockwise fp8 (DeepSeek-V3 / Qwen3-FP8 checkpoints): A scaled per 1 x 128 group of each row,
// B per 128 x 128 block. With kb = k / 128 and nb = n / 128:
// D[m, n] = act(sum_kb scale_a[m, kb] * scale_b[kb, nb] * sum_{k in kb} A[m, k] * B[k, n]
//               + bias[n]).
// K is a multiple of 128; N a multiple of 16 (the last N block may be partial).
struct BlockScaledMmParams {
  DType out_dtype;  // kFloat16 or kBFloat16
  const void* a;    // fp8 e4m3, as ScaledMmParams
  const void* b;
  void* d;
  int64_t m, n, k;
  int64_t lda, ldb, ldd;
  const float* scale_a;  // (m, kb) at scale_a[kb * scale_a_ld + m]: M-major
  int64_t scale_a_ld;    // >= M and a multiple of 4 (16-byte rows: the kernels read them by TMA)
  const float* scale_b;  // (kb, nb) at scale_b[nb * (K / 128) + kb]: [ceil(N / 128), K / 128]
                         // contiguous (K-major, the checkpoints' weight_scale_inv layout)
  const void* bias;      // [N] of out_dtype, or nullptr
  Activation activation;
};

}  // namespace quant
