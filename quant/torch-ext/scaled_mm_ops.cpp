// scaled_mm_ops.cpp: the Torch-facing layer of the scaled GEMMs (prototypes: torch_binding.h).
//
// For each op it validates the tensors (dtypes, devices, shapes, strides, alignment, overlap)
// with messages that name the op and the argument and print expected vs. got, picks the scale
// mode from the scale shapes (vLLM's rule: per tensor / token / channel when the element counts
// fit, else blockwise fp8), fills the params of kernel_src/scaled_mm_params.h and runs the CPU
// implementation (-DCPU_KERNEL) or the CUDA launchers of scaled_mm_cuda.h on the current stream
// of out's device under a device guard (-DCUDA_KERNEL), with the workspace they ask for.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "scaled_mm_params.h"
#include "scaled_mm_support.h"
#include "torch_binding.h"
#include "torch_checks.h"

#if defined(CPU_KERNEL)
#include "scaled_mm_cpu.h"
#endif
#if defined(CUDA_KERNEL)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "scaled_mm_cuda.h"
#endif

namespace {

using quant::Activation;
using quant::GemmOperand;
using quant::is_sixteen_bit;
using torch_checks::dtype_name;
using torch_checks::present;

// K of one scale block of blockwise fp8 (both the 1 x 128 activation groups and the 128 x 128
// weight blocks).
constexpr int64_t kScaleBlock = 128;
// Rows of a and columns of b start on 16-byte boundaries (the kernels' vector loads).
constexpr int64_t kOperandAlignBytes = 16;
// out's rows are 8 elements (16 bytes) apart at least, for the epilogue's vector stores.
constexpr int64_t kOutRowStrideMultiple = 8;

// The CUDA GEMM family _set_scaled_mm_path chose (a quant::cuda::GemmPath value); only the
// CUDA build reads it.
std::atomic<int> g_scaled_mm_path{0};

void check_dtype(const char* op, const char* name, const at::Tensor& t, at::ScalarType expected) {
  TORCH_CHECK(t.scalar_type() == expected, op, ": ", name, " must be ", dtype_name(expected),
              ", got ", dtype_name(t.scalar_type()));
}

bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// Sizes, strides and pointers of out, a and b: the part of the params every op shares.
struct Gemm {
  GemmOperand operand;
  quant::DType out_dtype;
  int64_t m, n, k;
  int64_t lda, ldb, ldd;
};

// Which operand types an op takes (check_gemm's `gated`: b is a packed gate / up weight [K, 2N]).
enum class Operands { kQuantized, kSixteenBit, kAny };

std::optional<GemmOperand> operand_of(at::ScalarType a, at::ScalarType b, Operands accepted) {
  if (a != b) return std::nullopt;
  const bool quantized = accepted != Operands::kSixteenBit;
  const bool sixteen_bit = accepted != Operands::kQuantized;
  if (quantized && a == at::kFloat8_e4m3fn) return GemmOperand::kFp8E4m3;
  if (quantized && a == at::kChar) return GemmOperand::kInt8;
  if (sixteen_bit && a == at::kBFloat16) return GemmOperand::kBFloat16;
  if (sixteen_bit && a == at::kHalf) return GemmOperand::kFloat16;
  return std::nullopt;
}

constexpr const char* operands_wanted(Operands accepted) {
  return accepted == Operands::kQuantized    ? "both be float8_e4m3fn or both int8"
         : accepted == Operands::kSixteenBit ? "both be bfloat16 or both float16"
                                             : "have one dtype: float8_e4m3fn, int8, bfloat16 or "
                                               "float16";
}

Gemm check_gemm(const char* op, const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                Operands accepted = Operands::kQuantized, bool gated = false) {
  Gemm g;
  const std::optional<GemmOperand> operand = operand_of(a.scalar_type(), b.scalar_type(), accepted);
  TORCH_CHECK(operand.has_value(), op, ": a and b must ", operands_wanted(accepted), ", got ",
              dtype_name(a.scalar_type()), " and ", dtype_name(b.scalar_type()));
  g.operand = *operand;
  TORCH_CHECK(a.dim() == 2, op, ": a must be 2-D [M, K], got shape ", a.sizes());
  TORCH_CHECK(b.dim() == 2, op, ": b must be 2-D [K, ", gated ? "2N" : "N", "], got shape ",
              b.sizes());
  g.m = a.size(0);
  g.k = a.size(1);
  const int64_t b_cols = b.size(1);
  TORCH_CHECK(b.size(0) == g.k, op, ": b must have K = ", g.k,
              " rows (a is [M, K], b [K, N]), got shape ", b.sizes());
  TORCH_CHECK(g.k > 0 && g.k % 16 == 0, op, ": K must be a positive multiple of 16, got ", g.k);
  if (gated) {
    TORCH_CHECK(b_cols > 0 && b_cols % (2 * quant::kGateBlock) == 0, op,
                ": b must be a packed gate / up weight [K, 2N] with N a positive multiple of ",
                quant::kGateBlock, " (pack_gate_up), got shape ", b.sizes());
    g.n = b_cols / 2;
  } else {
    g.n = b_cols;
    TORCH_CHECK(g.n > 0 && g.n % 16 == 0, op, ": N must be a positive multiple of 16, got ", g.n);
  }
  // Strides of size-1 dimensions are arbitrary in PyTorch: normalize them.
  g.lda = g.m > 1 ? a.stride(0) : g.k;
  g.ldb = b_cols > 1 ? b.stride(1) : g.k;
  TORCH_CHECK(a.stride(1) == 1, op,
              ": a must be row-major [M, K] (unit stride along K), got strides ", a.strides());
  TORCH_CHECK(b.stride(0) == 1, op,
              ": b must be column-major [K, N] (stride(0) == 1, e.g. the .t() of a row-major "
              "[N, K] weight), got strides ",
              b.strides());
  TORCH_CHECK(g.lda >= g.k && g.lda % kOperandAlignBytes == 0, op,
              ": a's row stride must be a multiple of 16 and at least K = ", g.k, ", got ", g.lda);
  TORCH_CHECK(g.ldb >= g.k && g.ldb % kOperandAlignBytes == 0, op,
              ": b's column stride must be a multiple of 16 and at least K = ", g.k, ", got ",
              g.ldb);
  TORCH_CHECK(aligned(a.const_data_ptr(), kOperandAlignBytes) &&
                  aligned(b.const_data_ptr(), kOperandAlignBytes),
              op, ": a and b must start on a 16-byte boundary");

  const std::optional<quant::DType> out_dtype =
      torch_checks::to_dtype<quant::DType>(out.scalar_type());
  TORCH_CHECK(out_dtype.has_value() && *out_dtype != quant::DType::kFloat32, op,
              ": out must be float16 or bfloat16, got ", dtype_name(out.scalar_type()));
  g.out_dtype = *out_dtype;
  // Unquantized operands keep their type: the kernels write D in it.
  TORCH_CHECK(!is_sixteen_bit(g.operand) || out.scalar_type() == a.scalar_type(), op,
              ": out must have the dtype of a and b (", dtype_name(a.scalar_type()), "), got ",
              dtype_name(out.scalar_type()));
  torch_checks::check_shape(op, "out", out, {g.m, g.n}, "[M, N]");
  torch_checks::check_device_of(op, "a", a, "out", out);
  torch_checks::check_device_of(op, "b", b, "out", out);
  TORCH_CHECK(out.stride(1) == 1, op, ": out must have unit stride along N, got strides ",
              out.strides());
  g.ldd = g.m > 1 ? out.stride(0) : g.n;
  TORCH_CHECK(g.ldd >= g.n && g.ldd % kOutRowStrideMultiple == 0, op,
              ": out's row stride must be a multiple of 8 and at least N = ", g.n, ", got ", g.ldd);
  TORCH_CHECK(aligned(out.const_data_ptr(), kOperandAlignBytes), op,
              ": out must start on a 16-byte boundary");
  torch_checks::check_no_overlap(op, "out", out, "a", a);
  torch_checks::check_no_overlap(op, "out", out, "b", b);
  return g;
}

// A float32 / int32 vector argument (scales, bias, zero-point terms): dtype, device, contiguity,
// no overlap with out.
void check_vector(const char* op, const char* name, const at::Tensor& t, at::ScalarType dtype,
                  const at::Tensor& out) {
  check_dtype(op, name, t, dtype);
  torch_checks::check_device_of(op, name, t, "out", out);
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous, got strides ", t.strides());
  torch_checks::check_no_overlap(op, "out", out, name, t);
}

const void* check_bias(const char* op, const std::optional<at::Tensor>& bias, const Gemm& g,
                       const at::Tensor& out, bool gated = false) {
  if (!present(bias)) return nullptr;
  check_vector(op, "bias", *bias, out.scalar_type(), out);
  if (gated) {
    torch_checks::check_shape(op, "bias", *bias, {2 * g.n}, "[2N], packed like b");
  } else {
    torch_checks::check_shape(op, "bias", *bias, {g.n}, "[N], one per output column");
  }
  return bias->const_data_ptr();
}

constexpr const char* kScaleShapes =
    "accepted: a_scales with 1 element (per tensor) or M ([M, 1] or [M], per token) and "
    "b_scales with 1 element (per tensor) or N (per channel); or, for float8_e4m3fn, blockwise "
    "a_scales [M, K / 128] and b_scales [K / 128, ceil(N / 128)]";

// Whether the scales are blockwise ([M, K / 128] and [K / 128, ceil(N / 128)]) rather than per
// tensor / token / channel. vLLM's order: the element counts of the per-tensor modes win, so a
// shape both readings accept (K = 128, one N block) runs the per-token kernel, the same math.
bool is_blockwise(const char* op, const Gemm& g, const at::Tensor& a_scales,
                  const at::Tensor& b_scales) {
  const bool a_plain = a_scales.numel() == 1 || (a_scales.numel() == g.m && a_scales.dim() <= 2 &&
                                                 (a_scales.dim() < 2 || a_scales.size(1) == 1));
  const bool b_plain = b_scales.numel() == 1 || (b_scales.numel() == g.n && b_scales.dim() <= 2);
  if (a_plain && b_plain) return false;
  const int64_t kb = g.k / kScaleBlock;
  const int64_t nb = (g.n + kScaleBlock - 1) / kScaleBlock;
  const bool blocks = g.k % kScaleBlock == 0 && a_scales.dim() == 2 && b_scales.dim() == 2 &&
                      a_scales.size(0) == g.m && a_scales.size(1) == kb && b_scales.size(0) == kb &&
                      b_scales.size(1) == nb;
  TORCH_CHECK(blocks, op, ": scales of shapes ", a_scales.sizes(), " and ", b_scales.sizes(),
              " match no scale mode for M = ", g.m, ", N = ", g.n, ", K = ", g.k, " (",
              kScaleShapes, ")");
  TORCH_CHECK(g.operand == GemmOperand::kFp8E4m3, op,
              ": blockwise scales need float8_e4m3fn operands, got int8");
  return true;
}

#if defined(CUDA_KERNEL)
// The GPU of `device` runs `operand` (and blockwise fp8 when `blockwise`) in this build.
void check_capability(const char* op, const at::Device& device, GemmOperand operand,
                      bool blockwise) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device.index());
  const int cap = prop->major * 10 + prop->minor;
  if (operand == GemmOperand::kFp8E4m3) {
    TORCH_CHECK(cap >= quant::kFp8MinCapability, op,
                ": float8_e4m3fn needs a GPU of compute capability 8.9 or newer, got ", prop->major,
                ".", prop->minor, " (", prop->name, ")");
  } else {
    TORCH_CHECK(cap >= quant::kInt8MinCapability, op,
                ": int8 needs a GPU of compute capability 8.0 or newer, got ", prop->major, ".",
                prop->minor, " (", prop->name, ")");
  }
  TORCH_CHECK(quant::cuda::scaled_mm_supported(cap, operand), op, ": this build has no ",
              operand == GemmOperand::kInt8 ? "int8" : "float8_e4m3fn",
              " GEMM for compute capability ", prop->major, ".", prop->minor);
  TORCH_CHECK(!blockwise || quant::cuda::block_scaled_mm_supported(cap), op,
              ": blockwise fp8 scales need a GPU of compute capability 9.0 (Hopper), got ",
              prop->major, ".", prop->minor, " (", prop->name, ")");
}

// Device guard, current stream, workspace of `bytes` when the launcher asks for some.
template <typename Launch>
void launch_cuda(const char* op, const at::Device& device, size_t bytes, Launch launch) {
  const c10::cuda::CUDAGuard device_guard(device);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  at::Tensor workspace;
  void* ws = nullptr;
  if (bytes > 0) {
    workspace = at::empty({static_cast<int64_t>(bytes)},
                          at::TensorOptions().dtype(at::kByte).device(device));
    ws = workspace.mutable_data_ptr();
  }
  const cudaError_t err = launch(ws, stream);
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
}
#endif

#if defined(CUDA_KERNEL)
// The gated form and 16-bit operands have Hopper kernels only: capability 9.0 on the "auto"
// path. Elsewhere the Python wrappers run their unfused fallback instead of calling the op.
void check_hopper_form(const char* op, const at::Device& device, quant::cuda::GemmPath path) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device.index());
  TORCH_CHECK(prop->major == 9 && prop->minor == 0, op,
              ": the gated form and bfloat16 / float16 operands need a GPU of compute capability "
              "9.0 (Hopper), got ",
              prop->major, ".", prop->minor, " (", prop->name, ")");
  TORCH_CHECK(path == quant::cuda::GemmPath::kAuto, op,
              ": the gated form and bfloat16 / float16 operands run on the \"auto\" GEMM path "
              "only, got \"sm80\" (_set_scaled_mm_path)");
}
#endif

void no_device(const char* op, const at::Device& device) {
  TORCH_CHECK(false, op, ": no implementation for device ", device, " in this build");
}

// Empty M launches nothing, after the device checks (a GPU without fp8 rejects every fp8 call).
void run(const char* op, const at::Device& device, const quant::ScaledMmParams& p) {
#if defined(CPU_KERNEL)
  if (device.is_cpu()) {
    if (p.m > 0) quant::cpu::scaled_mm(p);
    return;
  }
#endif
#if defined(CUDA_KERNEL)
  if (device.is_cuda()) {
    const auto path = static_cast<quant::cuda::GemmPath>(g_scaled_mm_path.load());
    if (p.gated || is_sixteen_bit(p.operand)) {
      check_hopper_form(op, device, path);
    } else {
      check_capability(op, device, p.operand, false);
    }
    if (p.m == 0) return;
    const int index = device.index();
    return launch_cuda(op, device, quant::cuda::scaled_mm_workspace_size(p, index, path),
                       [&](void* ws, cudaStream_t stream) {
                         return quant::cuda::scaled_mm(p, ws, index, path, stream);
                       });
  }
#endif
  no_device(op, device);
}

void run(const char* op, const at::Device& device, const quant::BlockScaledMmParams& p) {
#if defined(CPU_KERNEL)
  if (device.is_cpu()) {
    if (p.m > 0) quant::cpu::block_scaled_mm(p);
    return;
  }
#endif
#if defined(CUDA_KERNEL)
  if (device.is_cuda()) {
    check_capability(op, device, GemmOperand::kFp8E4m3, true);
    if (p.m == 0) return;
    const int index = device.index();
    return launch_cuda(op, device, quant::cuda::block_scaled_mm_workspace_size(p, index),
                       [&](void* ws, cudaStream_t stream) {
                         return quant::cuda::block_scaled_mm(p, ws, index, stream);
                       });
  }
#endif
  no_device(op, device);
}

// The fields ScaledMmParams and BlockScaledMmParams share: out dtype, pointers, sizes, strides.
template <typename Params>
void set_operands(Params& p, const Gemm& g, at::Tensor& out, const at::Tensor& a,
                  const at::Tensor& b) {
  p.out_dtype = g.out_dtype;
  p.a = a.const_data_ptr();
  p.b = b.const_data_ptr();
  p.d = out.mutable_data_ptr();
  p.m = g.m;
  p.n = g.n;
  p.k = g.k;
  p.lda = g.lda;
  p.ldb = g.ldb;
  p.ldd = g.ldd;
}

// The per-tensor / token / channel GEMM: scales checked, params filled (no zero points).
quant::ScaledMmParams plain_params(const char* op, const Gemm& g, at::Tensor& out,
                                   const at::Tensor& a, const at::Tensor& b,
                                   const at::Tensor& a_scales, const at::Tensor& b_scales,
                                   const std::optional<at::Tensor>& bias, Activation activation) {
  check_vector(op, "a_scales", a_scales, at::kFloat, out);
  check_vector(op, "b_scales", b_scales, at::kFloat, out);
  quant::ScaledMmParams p{};
  p.operand = g.operand;
  set_operands(p, g, out, a, b);
  p.scale_a = a_scales.const_data_ptr<float>();
  p.scale_b = b_scales.const_data_ptr<float>();
  p.scale_a_per_row = a_scales.numel() != 1;
  p.scale_b_per_col = b_scales.numel() != 1;
  p.bias = check_bias(op, bias, g, out);
  p.azp_adj = nullptr;
  p.azp = nullptr;
  p.activation = activation;
  return p;
}

// [M, K / 128] activation scales as the [K / 128, M] M-major matrix the kernels read, its row
// stride (>= M) a multiple of 4: a view when a_scales already is one, else a padded copy.
at::Tensor m_major_scales(const at::Tensor& a_scales) {
  const at::Tensor t = a_scales.t();
  const int64_t m = t.size(1);
  if (t.stride(1) == 1 && t.stride(0) >= m && t.stride(0) % 4 == 0) return t;
  const int64_t ld = (m + 3) / 4 * 4;
  at::Tensor padded = at::empty({t.size(0), ld}, a_scales.options());
  padded.narrow(1, 0, m).copy_(t);
  return padded.narrow(1, 0, m);
}

// cutlass_scaled_mm and cutlass_scaled_mm_act: the mode from the scale shapes, then run.
void scaled_mm_any_mode(const char* op, at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                        const at::Tensor& a_scales, const at::Tensor& b_scales,
                        const std::optional<at::Tensor>& bias, Activation activation) {
  const Gemm g = check_gemm(op, out, a, b);
  if (!is_blockwise(op, g, a_scales, b_scales)) {
    run(op, out.device(), plain_params(op, g, out, a, b, a_scales, b_scales, bias, activation));
    return;
  }
  check_dtype(op, "a_scales", a_scales, at::kFloat);
  check_dtype(op, "b_scales", b_scales, at::kFloat);
  torch_checks::check_device_of(op, "a_scales", a_scales, "out", out);
  torch_checks::check_device_of(op, "b_scales", b_scales, "out", out);
  torch_checks::check_no_overlap(op, "out", out, "a_scales", a_scales);
  torch_checks::check_no_overlap(op, "out", out, "b_scales", b_scales);
  // The kernels read scale_a M-major with 16-byte aligned K-block rows ([K / 128, M] with a row
  // stride that is a multiple of 4) and scale_b K-major ([N / 128, K / 128]): column-major
  // activation scales with such a stride (per_token_group_quant_fp8's column_major_scales) and
  // the .t() of a checkpoint's weight_scale_inv are read in place; others are copied.
  const at::Tensor scale_a = m_major_scales(a_scales);
  const at::Tensor scale_b = b_scales.t().contiguous();
  quant::BlockScaledMmParams p{};
  set_operands(p, g, out, a, b);
  p.scale_a = scale_a.const_data_ptr<float>();
  p.scale_a_ld = scale_a.stride(0);
  p.scale_b = scale_b.const_data_ptr<float>();
  p.bias = check_bias(op, bias, g, out);
  p.activation = activation;
  run(op, out.device(), p);
}

}  // namespace

quant::Activation parse_activation(const char* op, const std::string& name) {
  using quant::Activation;
  if (name == "none") return Activation::kNone;
  if (name == "gelu") return Activation::kGelu;
  if (name == "gelu_tanh") return Activation::kGeluTanh;
  if (name == "silu") return Activation::kSilu;
  TORCH_CHECK(false, op,
              ": activation must be one of \"none\", \"gelu\", \"gelu_tanh\", \"silu\", ", "got \"",
              name, "\"");
  return Activation::kNone;
}

void cutlass_scaled_mm(at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                       const at::Tensor& a_scales, const at::Tensor& b_scales,
                       const std::optional<at::Tensor>& bias) {
  scaled_mm_any_mode("cutlass_scaled_mm", out, a, b, a_scales, b_scales, bias, Activation::kNone);
}

void cutlass_scaled_mm_act(at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                           const at::Tensor& a_scales, const at::Tensor& b_scales,
                           const std::optional<at::Tensor>& bias, const std::string& activation) {
  const char* op = "cutlass_scaled_mm_act";
  scaled_mm_any_mode(op, out, a, b, a_scales, b_scales, bias, parse_activation(op, activation));
}

void cutlass_scaled_mm_azp(at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                           const at::Tensor& a_scales, const at::Tensor& b_scales,
                           const at::Tensor& azp_adj, const std::optional<at::Tensor>& azp,
                           const std::optional<at::Tensor>& bias) {
  const char* op = "cutlass_scaled_mm_azp";
  const Gemm g = check_gemm(op, out, a, b);
  TORCH_CHECK(g.operand == GemmOperand::kInt8, op,
              ": zero points need int8 operands, got float8_e4m3fn");
  TORCH_CHECK(!is_blockwise(op, g, a_scales, b_scales), op,
              ": zero points need per-tensor or per-token a_scales and per-tensor or "
              "per-channel b_scales");
  quant::ScaledMmParams p =
      plain_params(op, g, out, a, b, a_scales, b_scales, bias, Activation::kNone);
  check_vector(op, "azp_adj", azp_adj, at::kInt, out);
  torch_checks::check_shape(op, "azp_adj", azp_adj, {g.n}, "[N], one per output column");
  p.azp_adj = azp_adj.const_data_ptr<int32_t>();
  if (present(azp)) {
    check_vector(op, "azp", *azp, at::kInt, out);
    TORCH_CHECK(azp->numel() == g.m && azp->dim() <= 2 && (azp->dim() < 2 || azp->size(1) == 1), op,
                ": azp must have M = ", g.m, " elements ([M] or [M, 1], one per token), got ",
                "shape ", azp->sizes());
    p.azp = azp->const_data_ptr<int32_t>();
  }
  run(op, out.device(), p);
}

void linear_act(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight,
                const std::optional<at::Tensor>& bias, const std::string& activation) {
  const char* op = "linear_act";
  TORCH_CHECK(weight.dim() == 2, op, ": weight must be 2-D [N, K], got shape ", weight.sizes());
  TORCH_CHECK(weight.size(0) <= 1 || weight.stride(1) == 1, op,
              ": weight must be row-major [N, K] (unit stride along K), got strides ",
              weight.strides());
  // The weight's transpose is the column-major B of the scaled GEMMs; check_gemm calls x "a".
  const Gemm g = check_gemm(op, out, x, weight.t(), Operands::kSixteenBit);
  quant::ScaledMmParams p{};
  p.operand = g.operand;
  set_operands(p, g, out, x, weight);
  p.bias = check_bias(op, bias, g, out);
  p.activation = parse_activation(op, activation);
  // The fused Hopper kernel of this form gave wrong results in its first H200 run and is not
  // built; quant.linear_act runs F.linear and the activation on CUDA instead.
  TORCH_CHECK(!out.is_cuda(), op,
              ": the fused CUDA kernel is not available; call quant.linear_act, which runs "
              "F.linear and the activation on CUDA");
  run(op, out.device(), p);
}

void scaled_mm_gated(at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                     const std::optional<at::Tensor>& a_scales,
                     const std::optional<at::Tensor>& b_scales,
                     const std::optional<at::Tensor>& bias, const std::string& activation) {
  const char* op = "scaled_mm_gated";
  const Gemm g = check_gemm(op, out, a, b, Operands::kAny, true);
  quant::ScaledMmParams p{};
  p.operand = g.operand;
  set_operands(p, g, out, a, b);
  if (is_sixteen_bit(g.operand)) {
    TORCH_CHECK(!present(a_scales) && !present(b_scales), op,
                ": bfloat16 / float16 operands take no scales (pass None for a_scales and "
                "b_scales)");
  } else {
    TORCH_CHECK(present(a_scales) && present(b_scales), op,
                ": float8_e4m3fn / int8 operands need a_scales and b_scales");
    check_vector(op, "a_scales", *a_scales, at::kFloat, out);
    check_vector(op, "b_scales", *b_scales, at::kFloat, out);
    TORCH_CHECK(a_scales->numel() == 1 || a_scales->numel() == g.m, op,
                ": a_scales must have 1 element (per tensor) or M = ", g.m,
                " (per token), got shape ", a_scales->sizes());
    TORCH_CHECK(b_scales->numel() == 1 || b_scales->numel() == 2 * g.n, op,
                ": b_scales must have 1 element (per tensor) or 2N = ", 2 * g.n,
                " (per channel of the packed weight), got shape ", b_scales->sizes());
    p.scale_a = a_scales->const_data_ptr<float>();
    p.scale_b = b_scales->const_data_ptr<float>();
    p.scale_a_per_row = a_scales->numel() != 1;
    p.scale_b_per_col = b_scales->numel() != 1;
  }
  p.bias = check_bias(op, bias, g, out, true);
  p.activation = parse_activation(op, activation);
  p.gated = true;
  run(op, out.device(), p);
}

bool cutlass_scaled_mm_supports_fp8(int64_t cuda_device_capability) {
  const int cap = static_cast<int>(cuda_device_capability);
#if defined(CUDA_KERNEL)
  return quant::cuda::scaled_mm_supported(cap, GemmOperand::kFp8E4m3);
#else
  return quant::scaled_mm_capability_supports(cap, GemmOperand::kFp8E4m3);
#endif
}

bool cutlass_scaled_mm_supports_block_fp8(int64_t cuda_device_capability) {
  const int cap = static_cast<int>(cuda_device_capability);
#if defined(CUDA_KERNEL)
  return quant::cuda::block_scaled_mm_supported(cap);
#else
  return quant::block_scaled_mm_capability_supports(cap);
#endif
}

void _set_scaled_mm_path(const std::string& path) {
  TORCH_CHECK(path == "auto" || path == "sm80",
              "_set_scaled_mm_path: path must be \"auto\" or \"sm80\", got \"", path, "\"");
  // 0 and 1 are quant::cuda::GemmPath::kAuto and kTensorCoreSm80 (scaled_mm_cuda.h).
  g_scaled_mm_path.store(path == "auto" ? 0 : 1);
}
