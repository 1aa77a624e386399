// newkernel_ops.cpp: the Torch-facing layer of the newkernel ops (prototypes: torch_binding.h).
//
// For each op it validates the tensors with messages that name the op and the argument and print
// expected vs. got (torch_checks.h), maps each tensor onto the row view of newkernel_params.h,
// and runs the CPU implementation (-DCPU_KERNEL builds) or launches the CUDA kernel on the
// current stream of the input's device under a device guard (-DCUDA_KERNEL builds).
//
// The written tensor must fit the row view (writing into a copy would lose the result); a read
// tensor that does not is read through a contiguous copy. Written and read tensors must not
// share memory.
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <optional>

#include "newkernel_params.h"
#include "torch_binding.h"
#include "torch_checks.h"

#if defined(CPU_KERNEL)
#include "newkernel_cpu.h"
#endif
#if defined(CUDA_KERNEL)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "newkernel_cuda.h"
#endif

namespace {

using newkernel::DType;
using newkernel::ScaleParams;

DType check_dtype(const char* op, const char* name, const at::Tensor& t) {
  if (t.scalar_type() == at::kDouble) {
    return DType::kFloat64;
  }
  const std::optional<DType> dtype = torch_checks::to_dtype<DType>(t.scalar_type());
  TORCH_CHECK(dtype.has_value(), op, ": ", name,
              " must be float32, float16, bfloat16 or float64, got ",
              torch_checks::dtype_name(t.scalar_type()));
  return *dtype;
}

// Runs the op on `device`, the device of every tensor of the call.
void launch(const char* op, const at::Device& device, DType dtype, const ScaleParams& params) {
#if defined(CPU_KERNEL)
  if (device.is_cpu()) {
    newkernel::cpu::scale(dtype, params);
    return;
  }
#endif
#if defined(CUDA_KERNEL)
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard device_guard(device);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const cudaError_t err = newkernel::cuda::scale(dtype, params, stream);
    TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
    return;
  }
#endif
  TORCH_CHECK(false, op, ": no implementation for device ", device, " in this build");
}

}  // namespace

void scale(at::Tensor& out, const at::Tensor& input, double alpha) {
  const char* op = "scale";
  const DType dtype = check_dtype(op, "input", input);
  torch_checks::check_dtype_of(op, "out", out, "input", input);
  torch_checks::check_device_of(op, "out", out, "input", input);
  torch_checks::check_shape(op, "out", out, input.sizes(), "the input shape");
  if (out.numel() == 0) {
    return;
  }
  const int64_t out_stride = torch_checks::written_row_stride(op, "out", out);
  torch_checks::check_no_overlap(op, "out", out, "input", input);
  const at::Tensor in = torch_checks::readable(input);
  ScaleParams params;
  params.out = out.mutable_data_ptr();
  params.input = in.const_data_ptr();
  params.n = torch_checks::last_dim(in);
  params.rows = in.numel() / params.n;
  params.out_row_stride = out_stride;
  params.input_row_stride = torch_checks::read_row_stride(in);
  params.alpha = static_cast<float>(alpha);
  // Contiguous rows are one long row: the CUDA kernel then vectorizes any width.
  if (params.out_row_stride == params.n && params.input_row_stride == params.n) {
    params.n *= params.rows;
    params.out_row_stride = params.input_row_stride = params.n;
    params.rows = 1;
  }
  launch(op, input.device(), dtype, params);
}
