// rmsnorm_ops.cpp: the Torch-facing layer of the rmsnorm ops (prototypes: torch_binding.h).
//
// For each op it validates the tensors (dtype, device, shapes, strides, overlap) with messages
// that name the op and the argument and print expected vs. got, maps each tensor onto the
// row-strided [rows, hidden] view of kernel_src/rmsnorm_params.h, and runs the CPU implementation
// (rmsnorm::cpu, -DCPU_KERNEL builds) or launches the CUDA kernels on the current stream of the
// input's device (rmsnorm::cuda, -DCUDA_KERNEL builds).
//
// Rules (rmsnorm_params.h has the math):
// - dtypes: input is float32, float16 or bfloat16. weight and grad_weight: the input dtype or
//   float32 (grad_weight: the weight dtype). out and grad_out: the input dtype or float32.
//   residual, residual_out, scale, shift, grad_input, grad_residual, grad_scale, grad_shift: the
//   input dtype. rstd: float32. Every tensor on the input's device.
// - shapes: input [..., hidden] with at least one dimension; out, residual, residual_out,
//   grad_out, grad_input, grad_residual: the input shape; weight, grad_weight: [hidden]; rstd:
//   input.shape[:-1]; scale, shift: [B, hidden] or [B, 1, hidden] with B = input.size(0) and
//   input of at least two dimensions (the rows_per_sample = numel / (B * hidden) rows of sample
//   b are consecutive in row-major order); grad_scale, grad_shift: the shape of scale.
// - epsilon: finite and > 0 in float32. weight_offset: finite.
// - empty tensors: rows == 0 launches nothing (the backward's sums over no rows are zero, so
//   grad_weight / grad_scale / grad_shift are zero-filled); hidden == 0 with rows > 0 is an error.
//
// Layout rules: a written tensor (out, residual_out, grad_input, grad_scale, grad_shift) needs
// unit stride along its last dimension and leading dimensions that collapse into one row stride;
// weight-like written vectors (grad_weight) need unit stride and rstd must be contiguous; anything
// else is an error, since writing into a copy would lose the result. A read tensor that does not
// fit its view is read through a contiguous copy.
//
// Overlap rules: the kernels may run in place only as rmsnorm_params.h allows: out may be input
// itself and residual_out may be residual itself (vLLM's in-place fused_add_rms_norm), and
// grad_input may be grad_out or grad_residual itself ("itself": same data pointer, dtype, sizes
// and strides). Any other sharing of memory between a written tensor and another written or read
// tensor is an error. The test is exact (torch_checks::may_overlap): two strided views of one
// buffer whose elements interleave without sharing a byte (even and odd columns) are accepted.
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rmsnorm_params.h"
#include "torch_binding.h"
#include "torch_checks.h"

#if defined(CPU_KERNEL)
#include "rmsnorm_cpu.h"
#endif
#if defined(CUDA_KERNEL)
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>

#include "rmsnorm_cuda.h"
#endif

namespace {

using rmsnorm::DType;
using rmsnorm::RmsNormBwdParams;
using rmsnorm::RmsNormFwdParams;

using OptTensor = std::optional<at::Tensor>;

// ---- validation (the shared checks and row views: torch_checks.h) ----

using torch_checks::check_dtype_of;
using torch_checks::check_shape;
using torch_checks::dtype_name;
using torch_checks::may_overlap;
using torch_checks::present;
using torch_checks::read_row_stride;
using torch_checks::readable;
using torch_checks::same_view;
using torch_checks::written_row_stride;

std::optional<DType> to_dtype(at::ScalarType t) { return torch_checks::to_dtype<DType>(t); }

// input's dtype: float32, float16 or bfloat16.
DType check_input_dtype(const char* op, const at::Tensor& input) {
  const std::optional<DType> dtype = to_dtype(input.scalar_type());
  TORCH_CHECK(dtype.has_value(), op, ": input must be float32, float16 or bfloat16, got ",
              dtype_name(input.scalar_type()));
  return *dtype;
}

// `t` must be on the device of input.
void check_device(const char* op, const char* name, const at::Tensor& t, const at::Tensor& input) {
  torch_checks::check_device_of(op, name, t, "input", input);
}

// `t` must have the dtype of input or float32; returns it.
DType check_input_dtype_or_float32(const char* op, const char* name, const at::Tensor& t,
                                   const at::Tensor& input) {
  TORCH_CHECK(t.scalar_type() == input.scalar_type() || t.scalar_type() == at::kFloat, op, ": ",
              name, " must have the dtype of input (", dtype_name(input.scalar_type()),
              ") or float32, got ", dtype_name(t.scalar_type()));
  return *to_dtype(t.scalar_type());
}

// `t` must have the device, dtype and shape of input.
void check_like_input(const char* op, const char* name, const at::Tensor& t,
                      const at::Tensor& input) {
  check_device(op, name, t, input);
  check_dtype_of(op, name, t, "input", input);
  check_shape(op, name, t, input.sizes(), "the input shape");
}

// epsilon is stored as float: it must stay finite and > 0 there.
float check_epsilon(const char* op, double epsilon) {
  const float eps = static_cast<float>(epsilon);
  TORCH_CHECK(std::isfinite(epsilon) && epsilon > 0.0 && std::isfinite(eps) && eps > 0.0f, op,
              ": epsilon must be a finite number > 0 (in float32), got ", epsilon);
  return eps;
}

float check_weight_offset(const char* op, double weight_offset) {
  const float offset = static_cast<float>(weight_offset);
  TORCH_CHECK(std::isfinite(offset), op, ": weight_offset must be finite (in float32), got ",
              weight_offset);
  return offset;
}

// rows and hidden of the [rows, hidden] view of input [..., hidden].
struct RowShape {
  int64_t rows;
  int64_t hidden;
};

RowShape row_shape(const char* op, const at::Tensor& input) {
  TORCH_CHECK(input.dim() >= 1, op,
              ": input must have at least one dimension ([..., hidden]), got a 0-d tensor");
  RowShape s{1, input.size(-1)};
  for (int64_t i = 0; i + 1 < input.dim(); ++i) {
    s.rows *= input.size(i);
  }
  TORCH_CHECK(s.hidden > 0 || s.rows == 0, op,
              ": input must have a last dimension (hidden) > 0 when it has rows, got shape ",
              input.sizes());
  return s;
}

// weight: [hidden], dtype of input or float32.
DType check_weight(const char* op, const char* name, const at::Tensor& weight,
                   const at::Tensor& input) {
  check_device(op, name, weight, input);
  const DType dtype = check_input_dtype_or_float32(op, name, weight, input);
  check_shape(op, name, weight, {input.size(-1)}, "[hidden], hidden = input.size(-1)");
  return dtype;
}

// scale/shift: [B, hidden] or [B, 1, hidden], B = input.size(0), dtype of input.
void check_modulation(const char* op, const char* name, const at::Tensor& t,
                      const at::Tensor& input) {
  check_device(op, name, t, input);
  check_dtype_of(op, name, t, "input", input);
  TORCH_CHECK(input.dim() >= 2, op, ": ", name,
              " needs input of shape [B, ..., hidden] (at least two dimensions), got input shape ",
              input.sizes());
  const int64_t batch = input.size(0);
  const int64_t hidden = input.size(-1);
  const bool fits = (t.dim() == 2 && t.size(0) == batch && t.size(1) == hidden) ||
                    (t.dim() == 3 && t.size(0) == batch && t.size(1) == 1 && t.size(2) == hidden);
  TORCH_CHECK(fits, op, ": ", name, " must have shape [", batch, ", ", hidden, "] or [", batch,
              ", 1, ", hidden, "] ([B, hidden] or [B, 1, hidden], B = input.size(0)), got ",
              t.sizes());
}

// input.shape[:-1]
std::vector<int64_t> leading_shape(const at::Tensor& input) {
  return std::vector<int64_t>(input.sizes().begin(), input.sizes().end() - 1);
}

// ---- overlap ----

// One tensor argument of a call, by name; tensor is null for an absent optional.
struct Arg {
  const char* name;
  const at::Tensor* tensor;
};

Arg arg(const char* name, const at::Tensor& t) { return {name, &t}; }
Arg arg(const char* name, const OptTensor& t) { return {name, present(t) ? &*t : nullptr}; }

// No written tensor shares memory with another written one or with a read one, except the
// (written, read) pairs of `in_place` when the two are the same view.
void check_overlaps(const char* op, const std::vector<Arg>& written, const std::vector<Arg>& read,
                    const std::vector<std::pair<const char*, const char*>>& in_place) {
  for (size_t i = 0; i < written.size(); ++i) {
    const Arg& w = written[i];
    if (w.tensor == nullptr) {
      continue;
    }
    for (size_t j = i + 1; j < written.size(); ++j) {
      const Arg& other = written[j];
      TORCH_CHECK(other.tensor == nullptr || !may_overlap(op, *w.tensor, *other.tensor), op, ": ",
                  w.name, " must not share memory with ", other.name, " (both are written)");
    }
    for (const Arg& r : read) {
      if (r.tensor == nullptr) {
        continue;
      }
      const bool in_place_pair =
          std::any_of(in_place.begin(), in_place.end(), [&](const auto& pair) {
            return std::strcmp(pair.first, w.name) == 0 && std::strcmp(pair.second, r.name) == 0;
          });
      if (in_place_pair) {
        TORCH_CHECK(same_view(*w.tensor, *r.tensor) || !may_overlap(op, *w.tensor, *r.tensor), op,
                    ": ", w.name, " must be ", r.name,
                    " itself (in place: same data pointer, dtype, shape and strides) or not "
                    "share memory with it");
      } else {
        TORCH_CHECK(!may_overlap(op, *w.tensor, *r.tensor), op, ": ", w.name,
                    " must not share memory with ", r.name);
      }
    }
  }
}

// ---- device dispatch ----

// Runs the forward on `device`, the device of every tensor of the call.
void launch(const char* op, const at::Device& device, const RmsNormFwdParams& params) {
#if defined(CPU_KERNEL)
  if (device.is_cpu()) {
    rmsnorm::cpu::rms_norm_fwd(params);
    return;
  }
#endif
#if defined(CUDA_KERNEL)
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard device_guard(device);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const cudaError_t err = rmsnorm::cuda::rms_norm_fwd(params, stream);
    TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
    return;
  }
#endif
  TORCH_CHECK(false, op, ": no implementation for device ", device, " in this build");
}

// Runs the backward on `device`; on CUDA with the fp32 workspace the kernels ask for.
void launch(const char* op, const at::Device& device, RmsNormBwdParams& params) {
#if defined(CPU_KERNEL)
  if (device.is_cpu()) {
    rmsnorm::cpu::rms_norm_bwd(params);  // allocates its own reduction scratch
    return;
  }
#endif
#if defined(CUDA_KERNEL)
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard device_guard(device);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    // Allocated on the current stream by the caching allocator, so freeing it when this function
    // returns is ordered after the kernels that use it.
    at::Tensor workspace;
    const int64_t workspace_floats = rmsnorm::cuda::rms_norm_bwd_workspace_floats(params);
    if (workspace_floats > 0) {
      workspace =
          at::empty({workspace_floats}, at::TensorOptions().dtype(at::kFloat).device(device));
      params.workspace = workspace.mutable_data_ptr<float>();
    }
    const cudaError_t err = rmsnorm::cuda::rms_norm_bwd(params, stream);
    TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
    return;
  }
#endif
  TORCH_CHECK(false, op, ": no implementation for device ", device, " in this build");
}

// ---- forward ----

struct RmsNormCall {
  const char* out_name = "out";                    // "input" for the in-place forms
  const char* residual_out_name = "residual_out";  // "residual" for the in-place forms
  OptTensor weight;
  OptTensor residual;
  OptTensor residual_out;
  OptTensor scale;
  OptTensor shift;
  OptTensor rstd;
  double epsilon = 0.0;
  double weight_offset = 0.0;
  std::optional<at::ScalarType> norm_dtype;           // nullopt: no rounding of n
  pdl::Request pdl_request = pdl::Request::kDefault;  // enable_pdl
};

void forward(const char* op, at::Tensor& out, const at::Tensor& input, const RmsNormCall& a) {
  RmsNormFwdParams params;
  params.in_dtype = check_input_dtype(op, input);
  const RowShape shape = row_shape(op, input);
  params.eps = check_epsilon(op, a.epsilon);
  params.weight_offset = check_weight_offset(op, a.weight_offset);

  check_device(op, a.out_name, out, input);
  params.out_dtype = check_input_dtype_or_float32(op, a.out_name, out, input);
  check_shape(op, a.out_name, out, input.sizes(), "the input shape");
  if (present(a.weight)) {
    params.weight_dtype = check_weight(op, "weight", *a.weight, input);
  } else {
    params.weight_dtype = params.in_dtype;
  }
  TORCH_CHECK(present(a.residual) == present(a.residual_out), op,
              ": residual and residual_out must be given together (fused add) or not at all, got ",
              present(a.residual) ? "residual only" : "residual_out only");
  if (present(a.residual)) {
    check_like_input(op, "residual", *a.residual, input);
    check_like_input(op, a.residual_out_name, *a.residual_out, input);
  }
  TORCH_CHECK(present(a.scale) == present(a.shift), op,
              ": scale and shift must be given together (modulation) or not at all, got ",
              present(a.scale) ? "scale only" : "shift only");
  if (present(a.scale)) {
    check_modulation(op, "scale", *a.scale, input);
    check_modulation(op, "shift", *a.shift, input);
  }
  if (present(a.rstd)) {
    check_device(op, "rstd", *a.rstd, input);
    TORCH_CHECK(a.rstd->scalar_type() == at::kFloat, op, ": rstd must be float32, got ",
                dtype_name(a.rstd->scalar_type()));
    check_shape(op, "rstd", *a.rstd, leading_shape(input), "input.shape[:-1]");
  }
  if (a.norm_dtype.has_value()) {
    const std::optional<DType> norm = to_dtype(*a.norm_dtype);
    TORCH_CHECK(norm.has_value(), op,
                ": norm_dtype must be float32, float16, bfloat16 or None, got ",
                dtype_name(*a.norm_dtype));
    params.round_norm = true;
    params.norm_dtype = *norm;
  }

  if (shape.rows == 0) {
    return;
  }

  params.rows = shape.rows;
  params.hidden = shape.hidden;
  params.out_stride = written_row_stride(op, a.out_name, out);
  if (present(a.residual_out)) {
    params.residual_out_stride = written_row_stride(op, a.residual_out_name, *a.residual_out);
  }
  if (present(a.rstd)) {
    TORCH_CHECK(a.rstd->is_contiguous(), op, ": rstd must be contiguous, got strides ",
                a.rstd->strides());
  }
  check_overlaps(
      op, {arg(a.out_name, out), arg(a.residual_out_name, a.residual_out), arg("rstd", a.rstd)},
      {arg("input", input), arg("residual", a.residual), arg("weight", a.weight),
       arg("scale", a.scale), arg("shift", a.shift)},
      {{a.out_name, "input"}, {a.residual_out_name, "residual"}});

  // In place, out is input itself and fits the row view, so `in` is input, not a copy.
  const at::Tensor in = readable(input);
  params.out = out.mutable_data_ptr();
  params.input = in.const_data_ptr();
  params.input_stride = read_row_stride(in);
  at::Tensor residual, weight, scale, shift;
  if (present(a.residual)) {
    residual = readable(*a.residual);
    params.residual = residual.const_data_ptr();
    params.residual_stride = read_row_stride(residual);
    params.residual_out = a.residual_out->mutable_data_ptr();
  }
  if (present(a.weight)) {
    weight = a.weight->contiguous();
    params.weight = weight.const_data_ptr();
  }
  if (present(a.scale)) {
    scale = readable(*a.scale);
    shift = readable(*a.shift);
    params.scale = scale.const_data_ptr();
    params.scale_stride = read_row_stride(scale);
    params.shift = shift.const_data_ptr();
    params.shift_stride = read_row_stride(shift);
    params.rows_per_sample = shape.rows / input.size(0);
  }
  if (present(a.rstd)) {
    params.rstd = a.rstd->mutable_data_ptr<float>();
  }
  params.pdl_request = a.pdl_request;
  launch(op, input.device(), params);
}

// LlamaRMSNorm / vLLM: n rounded to the input dtype, then multiplied by weight.
RmsNormCall llama_args(const at::Tensor& input, const OptTensor& weight, double epsilon,
                       std::optional<bool> enable_pdl) {
  RmsNormCall a;
  a.pdl_request = pdl::request_of(enable_pdl);
  a.weight = weight;
  a.epsilon = epsilon;
  a.norm_dtype = input.scalar_type();
  return a;
}

// Gemma: (1 + weight), no rounding of n.
RmsNormCall gemma_args(const OptTensor& weight, double epsilon, std::optional<bool> enable_pdl) {
  RmsNormCall a;
  a.pdl_request = pdl::request_of(enable_pdl);
  a.weight = weight;
  a.epsilon = epsilon;
  a.weight_offset = 1.0;
  return a;
}

// vLLM's in-place fused add: residual <- input + residual; input <- norm(residual).
void fused_add_in_place(const char* op, at::Tensor& input, at::Tensor& residual, RmsNormCall a) {
  a.out_name = "input";
  a.residual_out_name = "residual";
  a.residual = residual;
  a.residual_out = residual;
  forward(op, input, input, a);
}

}  // namespace

// ---- the ops of torch_binding.h ----

void rms_norm(at::Tensor& out, const at::Tensor& input, const OptTensor& weight, double epsilon,
              std::optional<bool> enable_pdl) {
  forward("rms_norm", out, input, llama_args(input, weight, epsilon, enable_pdl));
}

void fused_add_rms_norm(at::Tensor& input, at::Tensor& residual, const OptTensor& weight,
                        double epsilon, std::optional<bool> enable_pdl) {
  fused_add_in_place("fused_add_rms_norm", input, residual,
                     llama_args(input, weight, epsilon, enable_pdl));
}

void gemma_rms_norm(at::Tensor& out, const at::Tensor& input, const OptTensor& weight,
                    double epsilon, std::optional<bool> enable_pdl) {
  forward("gemma_rms_norm", out, input, gemma_args(weight, epsilon, enable_pdl));
}

void gemma_fused_add_rms_norm(at::Tensor& input, at::Tensor& residual, const OptTensor& weight,
                              double epsilon, std::optional<bool> enable_pdl) {
  fused_add_in_place("gemma_fused_add_rms_norm", input, residual,
                     gemma_args(weight, epsilon, enable_pdl));
}

void rms_norm_modulate(at::Tensor& out, const at::Tensor& input, const OptTensor& weight,
                       const at::Tensor& scale, const at::Tensor& shift, double epsilon,
                       std::optional<bool> enable_pdl) {
  RmsNormCall a;
  a.pdl_request = pdl::request_of(enable_pdl);
  a.weight = weight;
  a.scale = scale;
  a.shift = shift;
  a.epsilon = epsilon;
  forward("rms_norm_modulate", out, input, a);
}

void rms_norm_fwd(at::Tensor& out, const at::Tensor& input, const OptTensor& weight,
                  const OptTensor& residual, const OptTensor& residual_out, const OptTensor& scale,
                  const OptTensor& shift, const OptTensor& rstd, double epsilon,
                  double weight_offset, std::optional<at::ScalarType> norm_dtype,
                  std::optional<bool> enable_pdl) {
  RmsNormCall a;
  a.pdl_request = pdl::request_of(enable_pdl);
  a.weight = weight;
  a.residual = residual;
  a.residual_out = residual_out;
  a.scale = scale;
  a.shift = shift;
  a.rstd = rstd;
  a.epsilon = epsilon;
  a.weight_offset = weight_offset;
  a.norm_dtype = norm_dtype;
  forward("rms_norm_fwd", out, input, a);
}

void rms_norm_bwd(at::Tensor& grad_input, const OptTensor& grad_weight, const OptTensor& grad_scale,
                  const OptTensor& grad_shift, const at::Tensor& grad_out, const at::Tensor& input,
                  const OptTensor& weight, const OptTensor& grad_residual, const OptTensor& scale,
                  double epsilon, double weight_offset, std::optional<at::ScalarType> norm_dtype,
                  std::optional<bool> enable_pdl) {
  constexpr const char* op = "rms_norm_bwd";
  RmsNormBwdParams params;
  params.pdl_request = pdl::request_of(enable_pdl);
  params.in_dtype = check_input_dtype(op, input);
  const RowShape shape = row_shape(op, input);
  params.eps = check_epsilon(op, epsilon);
  params.weight_offset = check_weight_offset(op, weight_offset);

  check_device(op, "grad_out", grad_out, input);
  params.out_dtype = check_input_dtype_or_float32(op, "grad_out", grad_out, input);
  check_shape(op, "grad_out", grad_out, input.sizes(), "the input shape");
  check_like_input(op, "grad_input", grad_input, input);
  if (present(weight)) {
    params.weight_dtype = check_weight(op, "weight", *weight, input);
  } else {
    params.weight_dtype = params.in_dtype;
  }
  if (present(grad_weight)) {
    TORCH_CHECK(present(weight), op,
                ": grad_weight needs weight (a norm without weight has no weight gradient)");
    check_device(op, "grad_weight", *grad_weight, input);
    check_dtype_of(op, "grad_weight", *grad_weight, "weight", *weight);
    check_shape(op, "grad_weight", *grad_weight, weight->sizes(), "the weight shape");
  }
  if (present(grad_residual)) {
    check_like_input(op, "grad_residual", *grad_residual, input);
  }
  if (present(scale)) {
    check_modulation(op, "scale", *scale, input);
  }
  for (const auto& [name, t] : {std::pair<const char*, const OptTensor*>{"grad_scale", &grad_scale},
                                {"grad_shift", &grad_shift}}) {
    if (!present(*t)) {
      continue;
    }
    TORCH_CHECK(present(scale), op, ": ", name,
                " needs scale (the forward was not modulated without it)");
    check_device(op, name, **t, input);
    check_dtype_of(op, name, **t, "scale", *scale);
    check_shape(op, name, **t, scale->sizes(), "the scale shape");
  }
  if (norm_dtype.has_value()) {
    const std::optional<DType> norm = to_dtype(*norm_dtype);
    TORCH_CHECK(norm.has_value(), op,
                ": norm_dtype must be float32, float16, bfloat16 or None, got ",
                dtype_name(*norm_dtype));
    params.round_norm = true;
    params.norm_dtype = *norm;
  }

  if (shape.rows == 0) {
    // The sums over no rows are zero; grad_input is empty.
    for (const OptTensor* t : {&grad_weight, &grad_scale, &grad_shift}) {
      if (present(*t)) {
        t->value().zero_();
      }
    }
    return;
  }

  params.rows = shape.rows;
  params.hidden = shape.hidden;
  params.grad_input_stride = written_row_stride(op, "grad_input", grad_input);
  if (present(grad_weight)) {
    written_row_stride(op, "grad_weight", *grad_weight);  // 1-D: checks the unit stride
  }
  if (present(grad_scale)) {
    params.grad_scale_stride = written_row_stride(op, "grad_scale", *grad_scale);
  }
  if (present(grad_shift)) {
    params.grad_shift_stride = written_row_stride(op, "grad_shift", *grad_shift);
  }
  check_overlaps(op,
                 {arg("grad_input", grad_input), arg("grad_weight", grad_weight),
                  arg("grad_scale", grad_scale), arg("grad_shift", grad_shift)},
                 {arg("grad_out", grad_out), arg("input", input), arg("weight", weight),
                  arg("grad_residual", grad_residual), arg("scale", scale)},
                 {{"grad_input", "grad_out"}, {"grad_input", "grad_residual"}});

  const at::Tensor go = readable(grad_out);
  const at::Tensor in = readable(input);
  params.grad_input = grad_input.mutable_data_ptr();
  params.grad_out = go.const_data_ptr();
  params.grad_out_stride = read_row_stride(go);
  params.input = in.const_data_ptr();
  params.input_stride = read_row_stride(in);
  at::Tensor gres, w, sc;
  if (present(grad_residual)) {
    gres = readable(*grad_residual);
    params.grad_residual = gres.const_data_ptr();
    params.grad_residual_stride = read_row_stride(gres);
  }
  if (present(weight)) {
    w = weight->contiguous();
    params.weight = w.const_data_ptr();
  }
  if (present(scale)) {
    sc = readable(*scale);
    params.scale = sc.const_data_ptr();
    params.scale_stride = read_row_stride(sc);
    params.rows_per_sample = shape.rows / input.size(0);
  }
  if (present(grad_weight)) {
    params.grad_weight = grad_weight->mutable_data_ptr();
  }
  if (present(grad_scale)) {
    params.grad_scale = grad_scale->mutable_data_ptr();
  }
  if (present(grad_shift)) {
    params.grad_shift = grad_shift->mutable_data_ptr();
  }
  launch(op, input.device(), params);
}
