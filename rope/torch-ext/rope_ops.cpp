// rope_ops.cpp: the Torch-facing layer of the rope ops (prototypes: torch_binding.h).
//
// For each op it validates the tensors (dtype, device, shapes, strides, overlap) with messages
// that name the op and the argument and print expected vs. got, maps the call onto the 4-D
// strided views and tables of kernel_src/rope_params.h (views only: no copy of anything written),
// and runs the CPU implementation (rope::cpu, -DCPU_KERNEL builds) or launches the CUDA kernel on
// the current stream of q's device under a device guard (rope::cuda, -DCUDA_KERNEL builds).
//
// Rules (rope_params.h has the math):
// - dtypes: q/query is float32, float16 or bfloat16; k, the outputs: q's dtype. cos and sin (or
//   cos_sin_cache): one dtype, float32 or q's. positions: int64 or int32. seqlen_offsets and
//   cu_seqlens: int32 (cos_sin_cache_offsets: int64 or int32). Every tensor on q's device.
// - rot_dim: even, > 0, <= head_dim. Table width: rot_dim / 2 (half table) or rot_dim (full).
// - table heads: 1 (one table for all heads) or the head count of q, and then of k too.
// - rows: positions -> positions[b, s]; cu_seqlens (batch 1) -> varlen; otherwise
//   s + seqlen_offset + seqlen_offsets[b]. positions excludes cu_seqlens, seqlen_offsets and a
//   nonzero seqlen_offset. The row *values* are checked by the implementations (CPU: an error
//   naming positions / seqlen_offsets / cu_seqlens, raised before anything is written; CUDA: a
//   device-side assertion), since reading them here would synchronize with the device.
// - empty tensors: no token (or no head) launches nothing, after the checks above.
//
// Layout rules: a written tensor (q/query and k/key in place, q_out, k_out) needs unit stride
// along head_dim and must not overlap itself (its dimensions sorted by stride, each must step
// over everything the smaller ones span: true of real layouts; sufficient, not necessary).
// Heads, tokens and batches may be at any stride, so q and k may be views of a fused qkv tensor.
// A read tensor that does not fit its view (q or k of rope_out with a non-unit last stride; cos
// and sin with different strides or a non-unit last stride; non-contiguous seqlen_offsets) is
// read through a contiguous copy. cu_seqlens must be contiguous (the varlen convention).
// positions may have any strides.
//
// Overlap rules: an output may be its input itself (in place: same data pointer, dtype, sizes and
// strides); any other sharing of memory between a written tensor and another written or read
// tensor is an error. This test is exact (torch_checks::may_overlap), also for strided views of
// one buffer (q and k of a fused qkv tensor).
//
// apply_rotary (kernels-community `rotary`): when x1 and x2 are the two halves of one tensor
// (same shape and strides, x2 starting rot / 2 elements after x1, unit last stride), out1/out2
// likewise, and cos/sin broadcast against x1 onto a table (their leading dimensions group with
// x's into at most three [batch, row, head] dimensions, unit last stride), the call runs the
// kernel on those views. Any other call (separate tensors, float64, other broadcasts, aliasing
// the kernel cannot honour) is computed by an exact ATen fallback: the same fp32 formulas (fp64
// for float64 inputs) into temporaries, each result rounded once when copied into out1/out2.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rope_params.h"
#include "torch_binding.h"
#include "torch_checks.h"

#if defined(CPU_KERNEL)
#include "rope_cpu.h"
#endif
#if defined(CUDA_KERNEL)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "rope_cuda.h"
#endif

namespace {

using rope::DType;
using rope::PairLayout;
using rope::RopeParams;
using rope::RopeTensor;
using rope::RowMode;
using rope::TableKind;

using OptTensor = std::optional<at::Tensor>;

// ---- small helpers (the shared checks: torch_checks.h) ----

using torch_checks::check_dtype_of;
using torch_checks::dtype_name;
using torch_checks::present;
using torch_checks::same_view;
using torch_checks::unit_last_stride;

std::optional<DType> to_dtype(at::ScalarType t) { return torch_checks::to_dtype<DType>(t); }

// `t` must have the shape of `ref`.
void check_shape_of(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                    const at::Tensor& ref) {
  TORCH_CHECK(t.sizes() == ref.sizes(), op, ": ", name, " must have the shape of ", ref_name, " ",
              ref.sizes(), ", got ", t.sizes());
}

// ---- overlap ----

// Whether `a` and `b` share memory (exact: torch_checks::may_overlap).
bool may_overlap(const at::Tensor& a, const at::Tensor& b) {
  return torch_checks::may_overlap("rope", a, b);
}

// Whether two elements of `t` may share memory. Dims of size > 1 sorted by stride must each
// step over everything the smaller ones span (sufficient; fused qkv views satisfy it).
bool self_overlapping(const at::Tensor& t) {
  if (t.numel() <= 1) {
    return false;
  }
  switch (at::has_internal_overlap(t)) {
    case at::MemOverlap::No:
      return false;
    case at::MemOverlap::Yes:
      return true;
    default:
      break;
  }
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (t.size(i) > 1) {
      dims.emplace_back(t.stride(i), t.size(i));
    }
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 0;  // largest element offset reachable with the dims seen so far
  for (const auto& [stride, size] : dims) {
    if (stride <= span) {
      return true;
    }
    span += (size - 1) * stride;
  }
  return false;
}

// ---- the general call ----

// Argument names of one call, as the public op spells them.
struct Names {
  const char* q = "q";
  const char* q_out = "q_out";
  const char* k = "k";
  const char* k_out = "k_out";
  const char* cos = "cos";
  const char* sin = "sin";
  const char* positions = "positions";
  const char* rot_dim = "rot_dim";
  const char* row_note = "";  // appended to the implementation's row errors
};

// One rotation: 4-D views [B, S, H, D] of q (and k), their outputs (the inputs themselves in
// place), 4-D tables [TB, R, TH, W] and the row source.
struct RopeCall {
  const char* op = "";
  Names names;
  at::Tensor q, q_out;
  OptTensor k, k_out;
  at::Tensor cos, sin;
  OptTensor positions;       // [B, S]
  OptTensor seqlen_offsets;  // [B] or [num_seqs]
  OptTensor cu_seqlens;      // [num_seqs + 1]
  int64_t seqlen_offset = 0;
  int64_t rot_dim = 0;
  bool interleaved = false;
  bool full_table = false;
  bool transpose = false;
  pdl::Request pdl_request = pdl::Request::kDefault;  // enable_pdl
};

void check_device(const RopeCall& c, const char* name, const at::Tensor& t) {
  torch_checks::check_device_of(c.op, name, t, c.names.q, c.q);
}

void check_4d(const RopeCall& c, const char* name, const at::Tensor& t, const char* layout) {
  TORCH_CHECK(t.dim() == 4, c.op, ": ", name, " must have 4 dimensions ", layout, ", got shape ",
              t.sizes());
}

// A written tensor: unit stride along head_dim, no element written twice.
void check_written(const RopeCall& c, const char* name, const at::Tensor& t) {
  TORCH_CHECK(unit_last_stride(t), c.op, ": ", name,
              " must have stride 1 along its last dimension (head_dim), got strides ", t.strides());
  TORCH_CHECK(!self_overlapping(t), c.op, ": ", name,
              " must not overlap itself (it is written), got shape ", t.sizes(), " and strides ",
              t.strides());
}

at::Tensor readable(const at::Tensor& t) { return unit_last_stride(t) ? t : t.contiguous(); }

// The int32 vector `t` (1-D, `expected` elements) as the kernel reads it.
void check_int32_vector(const RopeCall& c, const char* name, const at::Tensor& t, int64_t expected,
                        const char* what) {
  check_device(c, name, t);
  TORCH_CHECK(t.scalar_type() == at::kInt, c.op, ": ", name, " must be int32, got ",
              dtype_name(t.scalar_type()));
  TORCH_CHECK(t.dim() == 1 && t.size(0) == expected, c.op, ": ", name, " must have shape [",
              expected, "] (", what, "), got ", t.sizes());
}

// Runs the implementation of `device`.
void launch(const RopeCall& c, const RopeParams& params) {
  const at::Device device = c.q.device();
#if defined(CPU_KERNEL)
  if (device.is_cpu()) {
    try {
      rope::cpu::rope_forward(params);
    } catch (const c10::Error& e) {
      // The implementation's messages start with "rope: "; name the op instead.
      std::string msg = e.msg();
      if (msg.rfind("rope: ", 0) == 0) {
        msg = msg.substr(6);
      }
      TORCH_CHECK(false, c.op, ": ", msg, c.names.row_note);
    }
    return;
  }
#endif
#if defined(CUDA_KERNEL)
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard device_guard(device);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index());
    const cudaError_t err = rope::cuda::rope_forward(params, stream);
    TORCH_CHECK(err == cudaSuccess, c.op, ": CUDA launch failed: ", cudaGetErrorString(err));
    return;
  }
#endif
  TORCH_CHECK(false, c.op, ": no implementation for device ", device, " in this build");
}

RopeTensor rope_tensor(const at::Tensor& in, const at::Tensor& out) {
  RopeTensor t;
  t.in = in.const_data_ptr();
  t.out = out.mutable_data_ptr();
  t.heads = in.size(2);
  t.in_batch_stride = in.stride(0);
  t.in_seq_stride = in.stride(1);
  t.in_head_stride = in.stride(2);
  t.out_batch_stride = out.stride(0);
  t.out_seq_stride = out.stride(1);
  t.out_head_stride = out.stride(2);
  return t;
}

void run(RopeCall& c) {
  const Names& n = c.names;
  const char* op = c.op;
  RopeParams p;
  p.pdl_request = c.pdl_request;

  // q and its output.
  check_4d(c, n.q, c.q, "[B, S, Hq, D]");
  const std::optional<DType> dtype = to_dtype(c.q.scalar_type());
  TORCH_CHECK(dtype.has_value(), op, ": ", n.q, " must be float32, float16 or bfloat16, got ",
              dtype_name(c.q.scalar_type()));
  p.dtype = *dtype;
  const int64_t batch = c.q.size(0);
  const int64_t seqlen = c.q.size(1);
  const int64_t head_dim = c.q.size(3);
  check_device(c, n.q_out, c.q_out);
  check_dtype_of(op, n.q_out, c.q_out, n.q, c.q);
  check_shape_of(op, n.q_out, c.q_out, n.q, c.q);

  // k and its output.
  TORCH_CHECK(present(c.k) == present(c.k_out), op, ": ", n.k, " and ", n.k_out,
              " must be given together or not at all, got ", present(c.k) ? n.k : n.k_out, " only");
  if (present(c.k)) {
    const at::Tensor& k = *c.k;
    check_4d(c, n.k, k, "[B, S, Hk, D]");
    check_device(c, n.k, k);
    check_dtype_of(op, n.k, k, n.q, c.q);
    TORCH_CHECK(k.size(0) == batch && k.size(1) == seqlen && k.size(3) == head_dim, op, ": ", n.k,
                " must have shape [", batch, ", ", seqlen, ", Hk, ", head_dim,
                "] (the batch, sequence and head_dim of ", n.q, "), got ", k.sizes());
    check_device(c, n.k_out, *c.k_out);
    check_dtype_of(op, n.k_out, *c.k_out, n.k, k);
    check_shape_of(op, n.k_out, *c.k_out, n.k, k);
  }
  const int64_t heads_q = c.q.size(2);
  const int64_t heads_k = present(c.k) ? c.k->size(2) : 0;

  // rot_dim and the tables.
  TORCH_CHECK(c.rot_dim > 0 && c.rot_dim % 2 == 0 && c.rot_dim <= head_dim, op, ": ", n.rot_dim,
              " must be even, > 0 and <= head_dim (", head_dim, "), got ", c.rot_dim);
  check_device(c, n.cos, c.cos);
  check_device(c, n.sin, c.sin);
  check_4d(c, n.cos, c.cos, "[TB, R, TH, W]");
  check_shape_of(op, n.sin, c.sin, n.cos, c.cos);
  check_dtype_of(op, n.sin, c.sin, n.cos, c.cos);
  TORCH_CHECK(c.cos.scalar_type() == at::kFloat || c.cos.scalar_type() == c.q.scalar_type(), op,
              ": ", n.cos, " must be float32 or have the dtype of ", n.q, " (",
              dtype_name(c.q.scalar_type()), "), got ", dtype_name(c.cos.scalar_type()));
  p.table_dtype = *to_dtype(c.cos.scalar_type());
  const int64_t table_batch = c.cos.size(0);
  const int64_t table_rows = c.cos.size(1);
  const int64_t table_heads = c.cos.size(2);
  const int64_t width = c.full_table ? c.rot_dim : c.rot_dim / 2;
  TORCH_CHECK(table_batch == 1 || table_batch == batch, op, ": ", n.cos,
              " must have 1 or B = ", batch,
              " entries along its first dimension (one table for "
              "all sequences or one per sequence), got shape ",
              c.cos.sizes());
  TORCH_CHECK(table_heads == 1 || (table_heads == heads_q && (!present(c.k) || heads_k == heads_q)),
              op, ": ", n.cos,
              " must have 1 entry along its third dimension (one table for all "
              "heads) or one per head of ",
              n.q, present(c.k) ? " and " : "", present(c.k) ? n.k : "", " (", heads_q,
              present(c.k) ? " and " : "", present(c.k) ? std::to_string(heads_k) : std::string(),
              "), got shape ", c.cos.sizes());
  TORCH_CHECK(c.cos.size(3) == width, op, ": ", n.cos, " must have ", width, " columns (",
              c.full_table ? "rot_dim: one per rotated channel" : "rot_dim / 2: one per pair",
              ", rot_dim = ", c.rot_dim, "), got shape ", c.cos.sizes());

  // The row source.
  TORCH_CHECK(!(present(c.positions) && present(c.cu_seqlens)), op, ": give ", n.positions,
              " or cu_seqlens, not both");
  int64_t num_seqs = 0;
  if (present(c.positions)) {
    const at::Tensor& pos = *c.positions;
    check_device(c, n.positions, pos);
    TORCH_CHECK(pos.scalar_type() == at::kLong || pos.scalar_type() == at::kInt, op, ": ",
                n.positions, " must be int64 or int32, got ", dtype_name(pos.scalar_type()));
    TORCH_CHECK(pos.dim() == 2 && pos.size(0) == batch && pos.size(1) == seqlen, op, ": ",
                n.positions, " must have shape [", batch, ", ", seqlen, "] ([B, S]), got ",
                pos.sizes());
    TORCH_CHECK(!present(c.seqlen_offsets) && c.seqlen_offset == 0, op, ": ", n.positions,
                " give the table rows; seqlen_offsets and seqlen_offset (", c.seqlen_offset,
                ") must be None and 0 with it");
    p.row_mode = RowMode::kPositions;
  } else if (present(c.cu_seqlens)) {
    const at::Tensor& cu = *c.cu_seqlens;
    check_device(c, "cu_seqlens", cu);
    TORCH_CHECK(cu.scalar_type() == at::kInt, op, ": cu_seqlens must be int32, got ",
                dtype_name(cu.scalar_type()));
    TORCH_CHECK(cu.dim() == 1 && cu.size(0) >= 1, op,
                ": cu_seqlens must have shape [num_seqs + 1], got ", cu.sizes());
    TORCH_CHECK(cu.is_contiguous(), op, ": cu_seqlens must be contiguous, got strides ",
                cu.strides());
    TORCH_CHECK(batch == 1, op, ": with cu_seqlens (varlen), ", n.q,
                " must hold the packed tokens as [1, total_tokens, H, D], got shape ", c.q.sizes());
    num_seqs = cu.size(0) - 1;
    if (present(c.seqlen_offsets)) {
      check_int32_vector(c, "seqlen_offsets", *c.seqlen_offsets, num_seqs,
                         "one offset per sequence of cu_seqlens");
    }
    p.row_mode = RowMode::kVarlen;
  } else {
    if (present(c.seqlen_offsets)) {
      check_int32_vector(c, "seqlen_offsets", *c.seqlen_offsets, batch, "one offset per batch");
    }
    p.row_mode = RowMode::kSequence;
  }

  const int64_t tokens = batch * seqlen;
  if (tokens == 0 || head_dim == 0 || heads_q + heads_k == 0) {
    return;
  }

  // Layouts and overlap.
  check_written(c, n.q_out, c.q_out);
  const bool q_in_place = same_view(c.q_out, c.q);
  if (present(c.k)) {
    check_written(c, n.k_out, *c.k_out);
  }
  const bool k_in_place = present(c.k) && same_view(*c.k_out, *c.k);
  std::vector<std::pair<const char*, const at::Tensor*>> read = {{n.cos, &c.cos}, {n.sin, &c.sin}};
  if (present(c.positions)) read.emplace_back(n.positions, &*c.positions);
  if (present(c.seqlen_offsets)) read.emplace_back("seqlen_offsets", &*c.seqlen_offsets);
  if (present(c.cu_seqlens)) read.emplace_back("cu_seqlens", &*c.cu_seqlens);
  if (!q_in_place) read.emplace_back(n.q, &c.q);
  if (present(c.k) && !k_in_place) read.emplace_back(n.k, &*c.k);
  std::vector<std::pair<const char*, const at::Tensor*>> written = {{n.q_out, &c.q_out}};
  if (present(c.k)) written.emplace_back(n.k_out, &*c.k_out);
  for (size_t i = 0; i < written.size(); ++i) {
    const auto& [wname, w] = written[i];
    for (size_t j = i + 1; j < written.size(); ++j) {
      TORCH_CHECK(!may_overlap(*w, *written[j].second), op, ": ", wname,
                  " must not share memory with ", written[j].first, " (both are written)");
    }
    for (const auto& [rname, r] : read) {
      TORCH_CHECK(!may_overlap(*w, *r), op, ": ", wname, " must not share memory with ", rname,
                  (std::string(rname) == n.q || std::string(rname) == n.k)
                      ? " unless it is that tensor itself (in place: same data pointer, dtype, "
                        "shape and strides)"
                      : "");
    }
  }

  // Read through copies where the view does not fit (never a written tensor: in place, the
  // output is the input and has unit last stride).
  const at::Tensor q_in = q_in_place ? c.q : readable(c.q);
  at::Tensor k_in;
  if (present(c.k)) {
    k_in = k_in_place ? *c.k : readable(*c.k);
  }
  at::Tensor cos = c.cos;
  at::Tensor sin = c.sin;
  if (cos.strides() != sin.strides() || !unit_last_stride(cos)) {
    cos = cos.contiguous();
    sin = sin.contiguous();
  }
  at::Tensor offsets, cu;
  if (present(c.seqlen_offsets)) {
    offsets = c.seqlen_offsets->contiguous();
  }
  if (present(c.cu_seqlens)) {
    cu = *c.cu_seqlens;
  }

  p.batch = batch;
  p.seqlen = seqlen;
  p.head_dim = head_dim;
  p.rot_dim = c.rot_dim;
  p.layout = c.interleaved ? PairLayout::kInterleaved : PairLayout::kNeox;
  p.table_kind = c.full_table ? TableKind::kFull : TableKind::kHalf;
  p.transpose = c.transpose;
  p.q = rope_tensor(q_in, c.q_out);
  if (present(c.k)) {
    p.k = rope_tensor(k_in, *c.k_out);
  }
  p.cos = cos.const_data_ptr();
  p.sin = sin.const_data_ptr();
  p.table_batch = table_batch;
  p.table_rows = table_rows;
  p.table_heads = table_heads;
  p.table_batch_stride = table_batch == 1 ? 0 : cos.stride(0);
  p.row_stride = table_rows == 1 ? 0 : cos.stride(1);
  p.head_stride = table_heads == 1 ? 0 : cos.stride(2);
  if (p.head_stride == 0) {
    p.table_heads = 1;  // one entry (or one repeated entry) serves every head
  }
  if (present(c.positions)) {
    p.positions = c.positions->const_data_ptr();
    p.positions_int32 = c.positions->scalar_type() == at::kInt;
    p.positions_batch_stride = batch == 1 ? 0 : c.positions->stride(0);
    p.positions_seq_stride = seqlen == 1 ? 0 : c.positions->stride(1);
  }
  p.seqlen_offset = c.seqlen_offset;
  if (offsets.defined()) {
    p.seqlen_offsets = offsets.const_data_ptr<int32_t>();
  }
  if (cu.defined()) {
    p.cu_seqlens = cu.const_data_ptr<int32_t>();
    p.num_seqs = num_seqs;
  }
  launch(c, p);
}

// ---- vLLM ----

// query / key of the vLLM convention as [B, S, H, D] views: leading dims = positions' dims,
// then [H * D] or [H, D].
at::Tensor vllm_view(const char* op, const char* name, const at::Tensor& t,
                     const at::Tensor& positions, int64_t head_size) {
  const int64_t lead = positions.dim();
  TORCH_CHECK(t.dim() == lead + 1 || t.dim() == lead + 2, op, ": ", name, " must have shape ",
              lead == 1 ? "[T, H * head_size] or [T, H, head_size]"
                        : "[B, S, H * head_size] or [B, S, H, head_size]",
              " (the leading dimensions of positions, ", positions.sizes(), "), got ", t.sizes());
  TORCH_CHECK(t.sizes().slice(0, lead) == positions.sizes(), op, ": ", name,
              " must have the leading dimensions of positions ", positions.sizes(), ", got shape ",
              t.sizes());
  at::Tensor v = t;
  if (t.dim() == lead + 1) {
    const int64_t hidden = t.size(-1);
    TORCH_CHECK(hidden % head_size == 0, op, ": ", name, ".size(-1) = ", hidden,
                " must be a multiple of head_size = ", head_size, " ([..., H * head_size])");
    TORCH_CHECK(unit_last_stride(t), op, ": ", name,
                " must have stride 1 along its last dimension, got strides ", t.strides());
    std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end() - 1);
    sizes.push_back(hidden / head_size);
    sizes.push_back(head_size);
    v = t.view(sizes);
  } else {
    TORCH_CHECK(t.size(-1) == head_size, op, ": ", name, " must have head_size = ", head_size,
                " channels per head ([..., H, head_size]), got shape ", t.sizes());
  }
  return lead == 1 ? v.unsqueeze(0) : v;
}

void vllm_rotary(const char* op, const at::Tensor& positions, at::Tensor& query,
                 const OptTensor& key, int64_t head_size, const at::Tensor& cos_sin_cache,
                 bool is_neox, const char* positions_name, const char* row_note,
                 pdl::Request pdl_request) {
  TORCH_CHECK(head_size > 0, op, ": head_size must be > 0, got ", head_size);
  TORCH_CHECK(positions.dim() == 1 || positions.dim() == 2, op,
              ": positions must have shape [T] or [B, S], got ", positions.sizes());
  TORCH_CHECK(cos_sin_cache.dim() == 2, op,
              ": cos_sin_cache must have shape [max_position, rot_dim] (cat(cos, sin)), got ",
              cos_sin_cache.sizes());
  const int64_t rot_dim = cos_sin_cache.size(1);
  TORCH_CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= head_size, op,
              ": cos_sin_cache must have an even number of columns rot_dim (cat(cos, sin)), "
              "> 0 and <= head_size = ",
              head_size, ", got shape ", cos_sin_cache.sizes());
  RopeCall c;
  c.op = op;
  c.names.q = c.names.q_out = "query";
  c.names.k = c.names.k_out = "key";
  c.names.cos = c.names.sin = "cos_sin_cache";
  c.names.positions = positions_name;
  c.names.rot_dim = "rot_dim (cos_sin_cache.size(1))";
  c.names.row_note = row_note;
  c.q = c.q_out = vllm_view(op, "query", query, positions, head_size);
  if (present(key)) {
    c.k = c.k_out = vllm_view(op, "key", *key, positions, head_size);
  }
  const int64_t half = rot_dim / 2;
  c.cos = cos_sin_cache.narrow(1, 0, half).unsqueeze(0).unsqueeze(2);
  c.sin = cos_sin_cache.narrow(1, half, half).unsqueeze(0).unsqueeze(2);
  c.positions = positions.dim() == 1 ? positions.unsqueeze(0) : positions;
  c.rot_dim = rot_dim;
  c.interleaved = !is_neox;
  c.pdl_request = pdl_request;
  run(c);
}

// ---- kernels-community apply_rotary ----

// One tensor's view of a group of x1's leading dims: size and stride.
struct Group {
  int64_t size;
  std::vector<int64_t> strides;  // one per tensor of the grouping
};

// Groups the leading dims of `shape` (all but the last) so that, within a group, every tensor
// of `strides` collapses to one stride; dims of size 1 are dropped. Returns the groups.
std::vector<Group> group_dims(at::IntArrayRef shape, const std::vector<at::IntArrayRef>& strides) {
  std::vector<Group> groups;
  for (int64_t d = 0; d + 1 < static_cast<int64_t>(shape.size()); ++d) {
    if (shape[d] == 1) {
      continue;
    }
    Group g{shape[d], {}};
    for (const auto& s : strides) g.strides.push_back(s[d]);
    if (!groups.empty()) {
      Group& prev = groups.back();
      bool merge = true;
      for (size_t t = 0; t < strides.size(); ++t) {
        merge = merge && prev.strides[t] == g.strides[t] * g.size;
      }
      if (merge) {
        prev.size *= g.size;
        prev.strides = g.strides;
        continue;
      }
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

// x1, x2 as halves [..., half] of one tensor: the [..., 2 * half] view, if they are.
std::optional<at::Tensor> joined_halves(const at::Tensor& first, const at::Tensor& second) {
  const int64_t half = first.size(-1);
  if (second.sizes() != first.sizes() || second.strides() != first.strides() ||
      second.scalar_type() != first.scalar_type() || !unit_last_stride(first) ||
      !first.is_alias_of(second)) {
    return std::nullopt;
  }
  const auto step = reinterpret_cast<const char*>(second.const_data_ptr()) -
                    reinterpret_cast<const char*>(first.const_data_ptr());
  if (step != half * static_cast<int64_t>(first.element_size())) {
    return std::nullopt;
  }
  std::vector<int64_t> sizes(first.sizes().begin(), first.sizes().end());
  std::vector<int64_t> strides(first.strides().begin(), first.strides().end());
  sizes.back() = 2 * half;
  strides.back() = 1;
  return first.as_strided(sizes, strides, first.storage_offset());
}

// The kernel path of apply_rotary, if the call maps onto it.
bool apply_rotary_kernel(const at::Tensor& x1, const at::Tensor& x2, const at::Tensor& cos,
                         const at::Tensor& sin, at::Tensor& out1, at::Tensor& out2, bool conj,
                         pdl::Request pdl_request) {
  if (!to_dtype(x1.scalar_type()).has_value() || sin.scalar_type() != cos.scalar_type() ||
      (cos.scalar_type() != at::kFloat && cos.scalar_type() != x1.scalar_type()) || x1.dim() < 1 ||
      x1.size(-1) < 1) {
    return false;
  }
  const std::optional<at::Tensor> x = joined_halves(x1, x2);
  const std::optional<at::Tensor> out = joined_halves(out1, out2);
  if (!x || !out) {
    return false;
  }
  const at::Tensor cos_e = cos.expand(x1.sizes());
  const at::Tensor sin_e = sin.expand(x1.sizes());
  if (cos_e.strides() != sin_e.strides() || !unit_last_stride(cos_e)) {
    return false;
  }
  const std::vector<Group> groups =
      group_dims(x1.sizes(), {x->strides(), out->strides(), cos_e.strides()});
  if (groups.size() > 3) {
    return false;
  }
  // [B, S, H] = the groups, right-aligned (missing ones of size 1).
  int64_t sizes[3] = {1, 1, 1};
  int64_t strides[3][3] = {};  // [tensor: x, out, cos][dim]
  const size_t first = 3 - groups.size();
  for (size_t g = 0; g < groups.size(); ++g) {
    sizes[first + g] = groups[g].size;
    for (size_t t = 0; t < 3; ++t) strides[t][first + g] = groups[g].strides[t];
  }
  const int64_t half = x1.size(-1);
  auto view = [&](const at::Tensor& t, int which, int64_t width) {
    return t.as_strided({sizes[0], sizes[1], sizes[2], width},
                        {strides[which][0], strides[which][1], strides[which][2], 1},
                        t.storage_offset());
  };
  const at::Tensor x4 = view(*x, 0, 2 * half);
  at::Tensor out4 = view(*out, 1, 2 * half);
  const at::Tensor cos4 = view(cos_e, 2, half);
  const at::Tensor sin4 = view(sin_e, 2, half);
  if (self_overlapping(out4) || (!same_view(out4, x4) && may_overlap(out4, x4)) ||
      may_overlap(out4, cos4) || may_overlap(out4, sin4)) {
    return false;  // aliasing the kernel cannot honour: the fallback computes via temporaries
  }
  RopeCall c;
  c.op = "apply_rotary";
  c.names.q = "x1/x2";
  c.names.q_out = "out1/out2";
  c.q = x4;
  c.q_out = out4;
  c.cos = cos4;
  c.sin = sin4;
  c.rot_dim = 2 * half;
  c.transpose = conj;
  c.pdl_request = pdl_request;
  run(c);
  return true;
}

// A call of the general forms (rope_inplace, rope_out) with their table, row and pair options;
// the caller sets q, k, their outputs and the names that differ.
RopeCall general_call(const char* op, const at::Tensor& cos, const at::Tensor& sin,
                      const OptTensor& positions, const OptTensor& seqlen_offsets,
                      const OptTensor& cu_seqlens, int64_t seqlen_offset, int64_t rot_dim,
                      bool interleaved, bool full_table, bool transpose) {
  RopeCall c;
  c.op = op;
  c.cos = cos;
  c.sin = sin;
  c.positions = positions;
  c.seqlen_offsets = seqlen_offsets;
  c.cu_seqlens = cu_seqlens;
  c.seqlen_offset = seqlen_offset;
  c.rot_dim = rot_dim;
  c.interleaved = interleaved;
  c.full_table = full_table;
  c.transpose = transpose;
  return c;
}

}  // namespace

// ---- the ops of torch_binding.h ----

void rotary_embedding(const at::Tensor& positions, at::Tensor& query, const OptTensor& key,
                      int64_t head_size, const at::Tensor& cos_sin_cache, bool is_neox,
                      std::optional<bool> enable_pdl) {
  vllm_rotary("rotary_embedding", positions, query, key, head_size, cos_sin_cache, is_neox,
              "positions", "", pdl::request_of(enable_pdl));
}

void batched_rotary_embedding(const at::Tensor& positions, at::Tensor& query, const OptTensor& key,
                              int64_t head_size, const at::Tensor& cos_sin_cache, bool is_neox,
                              int64_t rot_dim, const at::Tensor& cos_sin_cache_offsets,
                              std::optional<bool> enable_pdl) {
  constexpr const char* op = "batched_rotary_embedding";
  TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.size(1) == rot_dim, op,
              ": cos_sin_cache must have shape [max_position, rot_dim = ", rot_dim, "], got ",
              cos_sin_cache.sizes());
  TORCH_CHECK(positions.scalar_type() == at::kLong || positions.scalar_type() == at::kInt, op,
              ": positions must be int64 or int32, got ", dtype_name(positions.scalar_type()));
  const at::Tensor& offsets = cos_sin_cache_offsets;
  torch_checks::check_device_of(op, "cos_sin_cache_offsets", offsets, "positions", positions);
  TORCH_CHECK(offsets.scalar_type() == at::kLong || offsets.scalar_type() == at::kInt, op,
              ": cos_sin_cache_offsets must be int64 or int32, got ",
              dtype_name(offsets.scalar_type()));
  TORCH_CHECK(offsets.numel() == positions.numel(), op,
              ": cos_sin_cache_offsets must hold one offset per token (", positions.numel(),
              ", the elements of positions), got shape ", offsets.sizes());
  // The row of each token, as positions for the common path (int64: no overflow).
  const at::Tensor rows =
      positions.to(at::kLong).add(offsets.to(at::kLong).reshape(positions.sizes()));
  vllm_rotary(
      op, rows, query, key, head_size, cos_sin_cache, is_neox, "positions + cos_sin_cache_offsets",
      " (positions here are positions + cos_sin_cache_offsets)", pdl::request_of(enable_pdl));
}

void rope_inplace(at::Tensor& q, const OptTensor& k, const at::Tensor& cos, const at::Tensor& sin,
                  const OptTensor& positions, const OptTensor& seqlen_offsets,
                  const OptTensor& cu_seqlens, int64_t seqlen_offset, int64_t rot_dim,
                  bool interleaved, bool full_table, bool transpose,
                  std::optional<bool> enable_pdl) {
  RopeCall c = general_call("rope_inplace", cos, sin, positions, seqlen_offsets, cu_seqlens,
                            seqlen_offset, rot_dim, interleaved, full_table, transpose);
  c.names.q_out = "q";
  c.names.k_out = "k";
  c.q = c.q_out = q;
  if (present(k)) {
    c.k = c.k_out = *k;
  }
  c.pdl_request = pdl::request_of(enable_pdl);
  run(c);
}

void rope_out(at::Tensor& q_out, const at::Tensor& q, const OptTensor& k_out, const OptTensor& k,
              const at::Tensor& cos, const at::Tensor& sin, const OptTensor& positions,
              const OptTensor& seqlen_offsets, const OptTensor& cu_seqlens, int64_t seqlen_offset,
              int64_t rot_dim, bool interleaved, bool full_table, bool transpose,
              std::optional<bool> enable_pdl) {
  RopeCall c = general_call("rope_out", cos, sin, positions, seqlen_offsets, cu_seqlens,
                            seqlen_offset, rot_dim, interleaved, full_table, transpose);
  c.q = q;
  c.q_out = q_out;
  c.k = k;
  c.k_out = k_out;
  c.pdl_request = pdl::request_of(enable_pdl);
  run(c);
}

void apply_rotary(const at::Tensor& x1, const at::Tensor& x2, const at::Tensor& cos,
                  const at::Tensor& sin, at::Tensor& out1, at::Tensor& out2, bool conj,
                  std::optional<bool> enable_pdl) {
  constexpr const char* op = "apply_rotary";
  const bool floating = x1.scalar_type() == at::kDouble || to_dtype(x1.scalar_type());
  TORCH_CHECK(floating, op, ": x1 must be float32, float16, bfloat16 or float64, got ",
              dtype_name(x1.scalar_type()));
  TORCH_CHECK(x1.dim() >= 1, op, ": x1 must have at least one dimension, got a 0-d tensor");
  for (const auto& [name, t] :
       {std::pair<const char*, const at::Tensor*>{"x2", &x2}, {"out1", &out1}, {"out2", &out2}}) {
    torch_checks::check_device_of(op, name, *t, "x1", x1);
    check_dtype_of(op, name, *t, "x1", x1);
    check_shape_of(op, name, *t, "x1", x1);
  }
  for (const auto& [name, t] :
       {std::pair<const char*, const at::Tensor*>{"cos", &cos}, {"sin", &sin}}) {
    torch_checks::check_device_of(op, name, *t, "x1", x1);
    TORCH_CHECK(at::isFloatingType(t->scalar_type()), op, ": ", name,
                " must be a floating-point tensor, got ", dtype_name(t->scalar_type()));
    bool broadcasts = t->dim() <= x1.dim();
    for (int64_t i = 1; broadcasts && i <= t->dim(); ++i) {
      broadcasts = t->size(-i) == 1 || t->size(-i) == x1.size(-i);
    }
    TORCH_CHECK(broadcasts, op, ": ", name, " must broadcast to the shape of x1 ", x1.sizes(),
                ", got ", t->sizes());
  }
  TORCH_CHECK(!may_overlap(out1, out2), op,
              ": out1 must not share memory with out2 (both are written)");
  if (x1.numel() == 0) {
    return;
  }
  if (apply_rotary_kernel(x1, x2, cos, sin, out1, out2, conj, pdl::request_of(enable_pdl))) {
    return;
  }
  // ATen fallback: fp32 math (fp64 for float64), the kernel's formulas and evaluation order,
  // into temporaries (any aliasing of outputs and inputs is then fine), rounded once by copy_.
  const at::ScalarType math = x1.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor a = x1.to(math);
  const at::Tensor b = x2.to(math);
  const at::Tensor c = cos.to(math);
  const at::Tensor s = sin.to(math);
  at::Tensor r1, r2;
  if (conj) {
    r1 = a.mul(c).add(b.mul(s));  // a' = a ca + b sb
    r2 = b.mul(c).sub(a.mul(s));  // b' = b cb - a sa
  } else {
    r1 = a.mul(c).sub(b.mul(s));  // a' = a ca - b sa
    r2 = b.mul(c).add(a.mul(s));  // b' = b cb + a sb
  }
  out1.copy_(r1);
  out2.copy_(r2);
}
