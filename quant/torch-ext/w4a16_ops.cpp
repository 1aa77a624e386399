// w4a16_ops.cpp: the Torch-facing layer of the int4 weight-only ops (prototypes: torch_binding.h).
//
// Each op validates its tensors (dtypes, devices, shapes, strides, overlap) with messages that
// name the op and the argument, fills the params of kernel_src/w4a16_params.h and runs the CPU
// implementation (-DCPU_KERNEL) or the CUDA launchers of w4a16_cuda.h on the current stream of the
// tensors' device under a device guard (-DCUDA_KERNEL; capability 8.0 or newer).
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <optional>
#include <string>

#include "torch_binding.h"
#include "torch_checks.h"
#include "w4a16_layout.h"
#include "w4a16_params.h"

#if defined(CPU_KERNEL)
#include "w4a16_cpu.h"
#endif
#if defined(CUDA_KERNEL)
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>

#include "w4a16_cuda.h"
#endif

namespace {

using torch_checks::dtype_name;
using torch_checks::present;

void check_dtype(const char* op, const char* name, const at::Tensor& t, at::ScalarType expected) {
  TORCH_CHECK(t.scalar_type() == expected, op, ": ", name, " must be ", dtype_name(expected),
              ", got ", dtype_name(t.scalar_type()));
}

// K and N of a packed weight's logical matrix: K a multiple of 16, N of 64.
void check_packed_sizes(const char* op, int64_t k, int64_t n) {
  TORCH_CHECK(k % quant::w4::kTileK == 0, op, ": K must be a multiple of ", quant::w4::kTileK,
              ", got ", k);
  TORCH_CHECK(n % quant::w4::kTileN == 0, op, ": N must be a multiple of ", quant::w4::kTileN,
              ", got ", n);
}

// codes: uint8 [K, N], unit stride along N. packed: int32 [K / 16, 2 N], contiguous.
quant::W4PackParams pack_params(const char* op, const at::Tensor& codes, const at::Tensor& packed) {
  check_dtype(op, "codes", codes, at::kByte);
  check_dtype(op, "packed", packed, at::kInt);
  TORCH_CHECK(codes.dim() == 2, op, ": codes must be 2-D [K, N], got shape ", codes.sizes());
  const int64_t k = codes.size(0), n = codes.size(1);
  check_packed_sizes(op, k, n);
  TORCH_CHECK(n <= 1 || codes.stride(1) == 1, op,
              ": codes must have unit stride along N, got strides ", codes.strides());
  torch_checks::check_shape(op, "packed", packed,
                            {k / quant::w4::kTileK, quant::w4::packed_row_words(n)},
                            "[K / 16, 2 N] for codes [K, N]");
  TORCH_CHECK(packed.is_contiguous(), op, ": packed must be contiguous, got strides ",
              packed.strides());
  torch_checks::check_device_of(op, "packed", packed, "codes", codes);
  torch_checks::check_no_overlap(op, "packed", packed, "codes", codes);
  quant::W4PackParams p{};
  p.codes = static_cast<uint8_t*>(const_cast<void*>(codes.const_data_ptr()));
  p.packed = static_cast<int32_t*>(const_cast<void*>(packed.const_data_ptr()));
  p.k = k;
  p.n = n;
  p.ld = k > 1 ? codes.stride(0) : n;
  return p;
}

void no_device(const char* op, const at::Device& device) {
  TORCH_CHECK(false, op, ": no implementation for device ", device, " in this build");
}

#if defined(CUDA_KERNEL)
// mma.sync m16n8k16 with bf16 operands needs capability 8.0.
void check_capability(const char* op, const at::Device& device) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device.index());
  TORCH_CHECK(prop->major >= 8, op, ": needs a GPU of compute capability 8.0 or newer, got ",
              prop->major, ".", prop->minor, " (", prop->name, ")");
}

void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
}
#endif

// A per-group table (scales, zeros): the activations' dtype, [groups, N], contiguous, on out's
// device and apart from it.
void check_group_table(const char* op, const char* name, const at::Tensor& t,
                       const at::Tensor& scales, const at::Tensor& out) {
  check_dtype(op, name, t, out.scalar_type());
  torch_checks::check_device_of(op, name, t, "out", out);
  torch_checks::check_shape(op, name, t, scales.sizes(), "the shape of scales, [K / group, N]");
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous, got strides ", t.strides());
  torch_checks::check_no_overlap(op, "out", out, name, t);
}

// int4_pack / int4_unpack: the same checks, the same params, opposite directions.
void run_pack(const char* op, const at::Tensor& codes, const at::Tensor& packed, bool unpack) {
  const quant::W4PackParams p = pack_params(op, codes, packed);
#if defined(CPU_KERNEL)
  if (codes.device().is_cpu()) {
    unpack ? quant::cpu::w4_unpack(p) : quant::cpu::w4_pack(p);
    return;
  }
#endif
#if defined(CUDA_KERNEL)
  if (codes.device().is_cuda()) {
    const c10::cuda::CUDAGuard device_guard(codes.device());
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    check_launch(op, unpack ? quant::cuda::w4_unpack(p, stream) : quant::cuda::w4_pack(p, stream));
    return;
  }
#endif
  no_device(op, codes.device());
}

}  // namespace

void int4_pack(at::Tensor& packed, const at::Tensor& codes) {
  run_pack("int4_pack", codes, packed, /*unpack=*/false);
}

void int4_unpack(at::Tensor& codes, const at::Tensor& packed) {
  run_pack("int4_unpack", codes, packed, /*unpack=*/true);
}

namespace {

void run_gemm(const char* op, at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
              const at::Tensor& scales, const std::optional<at::Tensor>& zeros,
              const std::optional<at::Tensor>& perm, const std::optional<at::Tensor>& bias,
              const std::string& activation, bool gated) {
  TORCH_CHECK(a.scalar_type() == at::kHalf || a.scalar_type() == at::kBFloat16, op,
              ": a must be float16 or bfloat16, got ", dtype_name(a.scalar_type()));
  TORCH_CHECK(a.dim() == 2, op, ": a must be 2-D [M, K], got shape ", a.sizes());
  check_dtype(op, "b", b, at::kInt);
  TORCH_CHECK(b.dim() == 2, op, ": b must be 2-D [K / 16, 2 N] (packed by int4_pack), got shape ",
              b.sizes());
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1) / 2;
  TORCH_CHECK(b.size(0) * quant::w4::kTileK == k && b.size(1) % 2 == 0, op,
              ": b must have shape [K / 16, 2 N] with K = ", k, " (a's columns), got ", b.sizes());
  check_packed_sizes(op, k, n);
  TORCH_CHECK(!gated || n % (2 * quant::w4::kTileN) == 0, op,
              ": a gated b must have a multiple of 128 columns (gate and up blocks of 64), got ",
              n);
  const int64_t out_n = gated ? n / 2 : n;
  TORCH_CHECK(b.is_contiguous(), op, ": b must be contiguous, got strides ", b.strides());
  // The GPU reads each lane's 16 bytes of a tile in one load.
  TORCH_CHECK(reinterpret_cast<uintptr_t>(b.const_data_ptr()) % 16 == 0, op,
              ": b must start on a 16-byte boundary (int4_pack's output does)");
  TORCH_CHECK(m <= 1 || k <= 1 || a.stride(1) == 1, op,
              ": a must have unit stride along K, got strides ", a.strides());
  torch_checks::check_dtype_of(op, "out", out, "a", a);
  torch_checks::check_shape(op, "out", out, {m, out_n},
                            gated ? "[M, N / 2]: one column per gate / up pair" : "[M, N]");
  TORCH_CHECK(n <= 1 || out.stride(1) == 1, op, ": out must have unit stride along N, got strides ",
              out.strides());
  torch_checks::check_device_of(op, "a", a, "out", out);
  torch_checks::check_device_of(op, "b", b, "out", out);
  torch_checks::check_no_overlap(op, "out", out, "a", a);
  torch_checks::check_no_overlap(op, "out", out, "b", b);

  TORCH_CHECK(scales.dim() == 2 && scales.size(1) == n && scales.size(0) >= 1, op,
              ": scales must be [K / group_size, N] with N = ", n, ", got shape ", scales.sizes());
  const int64_t groups = scales.size(0);
  TORCH_CHECK(k % groups == 0 && (k / groups) % quant::w4::kTileK == 0, op,
              ": scales' rows must split K = ", k, " into groups of a multiple of ",
              quant::w4::kTileK, " rows, got ", groups, " groups");
  check_group_table(op, "scales", scales, scales, out);
  if (present(zeros)) check_group_table(op, "zeros", *zeros, scales, out);
  if (present(bias)) {
    check_dtype(op, "bias", *bias, out.scalar_type());
    torch_checks::check_device_of(op, "bias", *bias, "out", out);
    torch_checks::check_shape(op, "bias", *bias, {n}, "[N], one per column of b");
    TORCH_CHECK(bias->is_contiguous(), op, ": bias must be contiguous");
    torch_checks::check_no_overlap(op, "out", out, "bias", *bias);
  }
  if (present(perm)) {
    check_dtype(op, "perm", *perm, at::kInt);
    torch_checks::check_device_of(op, "perm", *perm, "out", out);
    torch_checks::check_shape(op, "perm", *perm, {k}, "[K], a's column for each packed row");
    TORCH_CHECK(perm->is_contiguous(), op, ": perm must be contiguous");
  }

  quant::W4A16GemmParams p{};
  p.dtype = a.scalar_type() == at::kHalf ? quant::DType::kFloat16 : quant::DType::kBFloat16;
  p.a = a.const_data_ptr();
  p.b = b.const_data_ptr<int32_t>();
  p.scales = scales.const_data_ptr();
  p.zeros = present(zeros) ? zeros->const_data_ptr() : nullptr;
  p.perm = present(perm) ? perm->const_data_ptr<int32_t>() : nullptr;
  p.bias = present(bias) ? bias->const_data_ptr() : nullptr;
  p.d = out.data_ptr();
  p.m = m;
  p.n = n;
  p.k = k;
  p.group_size = k / groups;
  p.lda = m > 1 ? a.stride(0) : k;
  p.ldd = m > 1 ? out.stride(0) : out_n;
  p.activation = parse_activation(op, activation);
  p.gated = gated;
#if defined(CPU_KERNEL)
  if (out.device().is_cpu()) {
    if (p.perm != nullptr) {
      // The host can read perm here: a value outside [0, K) would read outside a's rows.
      for (int64_t i = 0; i < k; ++i) {
        TORCH_CHECK(p.perm[i] >= 0 && p.perm[i] < k, op, ": perm[", i, "] = ", p.perm[i],
                    " is outside [0, K = ", k, ")");
      }
    }
    quant::cpu::w4a16_gemm(p);
    return;
  }
#endif
#if defined(CUDA_KERNEL)
  if (out.device().is_cuda()) {
    check_capability(op, out.device());
    const c10::cuda::CUDAGuard device_guard(out.device());
    // The kernel copies activations as 32-bit pairs of k: act-order columns (perm) are gathered
    // into a contiguous A first (index_select checks perm's values on the device, so the host
    // does not synchronize), and an A off a 4-byte boundary or with an odd row stride is copied.
    at::Tensor a_read = a;
    const bool paired = k == 0 || (reinterpret_cast<uintptr_t>(a.const_data_ptr()) % 4 == 0 &&
                                   (m <= 1 || a.stride(0) % 2 == 0));
    if (present(perm)) {
      a_read = a.index_select(1, *perm);
    } else if (!paired) {
      a_read = a.clone(at::MemoryFormat::Contiguous);
    }
    p.a = a_read.const_data_ptr();
    p.lda = m > 1 ? a_read.stride(0) : k;
    p.perm = nullptr;
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const int sms = at::cuda::getDeviceProperties(out.device().index())->multiProcessorCount;
    const quant::cuda::W4A16Plan plan = quant::cuda::w4a16_plan(p, sms);
    at::Tensor workspace;
    if (plan.workspace_bytes > 0) {
      workspace = at::empty({static_cast<int64_t>(plan.workspace_bytes)},
                            at::TensorOptions().dtype(at::kByte).device(out.device()));
    }
    check_launch(
        op, quant::cuda::w4a16_gemm(
                p, plan, workspace.defined() ? workspace.mutable_data_ptr() : nullptr, stream));
    return;
  }
#endif
  no_device(op, out.device());
}

}  // namespace

void w4a16_gemm(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const at::Tensor& scales,
                const std::optional<at::Tensor>& zeros, const std::optional<at::Tensor>& perm,
                const std::optional<at::Tensor>& bias, const std::string& activation) {
  run_gemm("w4a16_gemm", out, a, b, scales, zeros, perm, bias, activation, false);
}

void w4a16_gemm_gated(at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                      const at::Tensor& scales, const std::optional<at::Tensor>& zeros,
                      const std::optional<at::Tensor>& perm, const std::optional<at::Tensor>& bias,
                      const std::string& activation) {
  run_gemm("w4a16_gemm_gated", out, a, b, scales, zeros, perm, bias, activation, true);
}
