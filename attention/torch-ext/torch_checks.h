// torch_checks.h: argument checks and row-view helpers shared by the Torch-facing layers
// (torch-ext/<kernel>_ops.cpp) of the kernels.
//
// One source of truth: common/torch_checks.h, copied into each user's torch-ext/ by
// scripts/sync_common.py (a kernel folder must build on its own); tests/test_common_sync.py
// fails when a copy drifts. Edit common/, then run the script.
//
// Messages start with the op name, name the argument and print expected vs. got (the tests of
// every kernel match them: change them here only with those tests). Checks throw through
// TORCH_CHECK (c10::Error, a RuntimeError in Python).
//
// Row views: a tensor [..., width] is seen as rows of `width` elements with unit stride along the
// last dimension and one stride between consecutive rows; its leading dimensions must collapse
// into that stride (size-1 dimensions do not constrain the layout). A 0-d tensor is one row of
// one element.
//
// Linkage: everything is in an unnamed namespace (internal linkage), so two kernels built from
// different versions of this header and loaded into one process can never bind each other's
// definitions; `inline` keeps -Wall quiet about the functions a kernel does not use. Include it
// from one source file of the kernel (its <kernel>_ops.cpp).
#pragma once

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace torch_checks {
namespace {

// ---- names and dtypes ----

// The dtype as Python names it without the "torch." prefix ("float32", "bfloat16", "int64").
// c10::getDtypeNames returns std::string by value in Torch 2.11 and static views in 2.13: copy,
// as a view into the 2.11 temporary dangles (it garbled activation's messages on CUDA).
inline std::string dtype_name(at::ScalarType t) {
  return std::string(c10::getDtypeNames(t).first);
}

// An optional tensor argument that was given (not None, not undefined).
inline bool present(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// float32, float16, bfloat16 -> the kernel's DType enum (kFloat32, kFloat16, kBFloat16); any
// other dtype -> nullopt.
template <typename DType>
inline std::optional<DType> to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    default:
      return std::nullopt;
  }
}

// ---- relations between arguments ----

// `t` must be on the device of `ref`.
inline void check_device_of(const char* op, const char* name, const at::Tensor& t,
                            const char* ref_name, const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), op, ": ", name, " must be on the device of ", ref_name,
              " (expected ", ref.device(), ", got ", t.device(), ")");
}

// `t` must have the dtype of `ref`.
inline void check_dtype_of(const char* op, const char* name, const at::Tensor& t,
                           const char* ref_name, const at::Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " must have the dtype of ",
              ref_name, " (expected ", dtype_name(ref.scalar_type()), ", got ",
              dtype_name(t.scalar_type()), ")");
}

// `t` must have shape `expected`; `what` says where that shape comes from.
inline void check_shape(const char* op, const char* name, const at::Tensor& t,
                        at::IntArrayRef expected, const char* what) {
  TORCH_CHECK(t.sizes() == expected, op, ": ", name, " must have shape ", expected, " (", what,
              "), got ", t.sizes());
}

// The same elements in the same layout and dtype: the in-place forms a kernel may allow.
inline bool same_view(const at::Tensor& a, const at::Tensor& b) {
  return a.const_data_ptr() == b.const_data_ptr() && a.scalar_type() == b.scalar_type() &&
         a.sizes() == b.sizes() && a.strides() == b.strides();
}

// ---- row views ----

// Width of the last dimension; a 0-d tensor is one row of one element.
inline int64_t last_dim(const at::Tensor& t) { return t.dim() == 0 ? 1 : t.size(-1); }

inline bool unit_last_stride(const at::Tensor& t) {
  return t.dim() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1;
}

// Element stride between consecutive rows when the leading dimensions of `t` collapse into one,
// else nullopt. Size-1 dimensions do not constrain the layout.
inline std::optional<int64_t> collapsed_row_stride(const at::Tensor& t) {
  std::optional<int64_t> stride;  // stride of the innermost non-trivial leading dimension
  int64_t next = 0;               // stride the next outer non-trivial dimension must have
  for (int64_t i = t.dim() - 2; i >= 0; --i) {
    if (t.size(i) == 1) {
      continue;
    }
    if (stride && t.stride(i) != next) {
      return std::nullopt;
    }
    if (!stride) {
      stride = t.stride(i);
    }
    next = t.stride(i) * t.size(i);
  }
  return stride ? *stride : last_dim(t);  // at most one row: any stride works
}

// Checks that the written tensor `t` fits the row view and returns its row stride.
inline int64_t written_row_stride(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(unit_last_stride(t), op, ": ", name,
              " must have stride 1 along its last dimension, got strides ", t.strides());
  const std::optional<int64_t> stride = collapsed_row_stride(t);
  TORCH_CHECK(stride.has_value(), op, ": ", name,
              " must have leading dimensions that collapse into one row stride (e.g. a "
              "contiguous tensor or a row slice of one), got shape ",
              t.sizes(), " and strides ", t.strides());
  const int64_t width = last_dim(t);
  const int64_t rows = width == 0 ? 0 : t.numel() / width;
  TORCH_CHECK(rows <= 1 || *stride >= width, op, ": ", name,
              " rows must not overlap (expected a row stride >= ", width, ", got ", *stride, ")");
  return *stride;
}

// The read tensor `t` itself when it fits the row view, else a contiguous copy.
inline at::Tensor readable(const at::Tensor& t) {
  if (unit_last_stride(t) && collapsed_row_stride(t).has_value()) {
    return t;
  }
  return t.contiguous();
}

// Row stride of a tensor returned by readable().
inline int64_t read_row_stride(const at::Tensor& t) { return collapsed_row_stride(t).value(); }

// ---- memory overlap ----

// [first, last] byte addresses spanned by a non-empty tensor (strides are never negative).
inline std::pair<uintptr_t, uintptr_t> byte_span(const at::Tensor& t) {
  int64_t last = 0;
  for (int64_t i = 0; i < t.dim(); ++i) {
    last += (t.size(i) - 1) * t.stride(i);
  }
  const auto first = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  return {first, first + static_cast<uintptr_t>((last + 1) * t.element_size()) - 1};
}

// Whether `a` and `b` may share memory: ATen's exact answer for dense tensors; for strided views of
// one buffer, which ATen finds "too hard", the answer of `strided(a, b)`.
template <typename Strided>
inline bool may_overlap_with(const char* op, const at::Tensor& a, const at::Tensor& b,
                             const Strided& strided) {
  if (a.numel() == 0 || b.numel() == 0 || !a.is_alias_of(b)) {
    return false;
  }
  switch (at::get_overlap_status(a, b)) {
    case at::MemOverlapStatus::Full:
    case at::MemOverlapStatus::Partial:
      return true;
    case at::MemOverlapStatus::No:
      return false;
    case at::MemOverlapStatus::TooHard:
      return strided(a, b);
    default:
      TORCH_CHECK(false, op, ": unexpected memory overlap status");
  }
  return true;
}

// Whether the address spans of two views of one buffer intersect.
inline bool spans_intersect(const at::Tensor& a, const at::Tensor& b) {
  const auto sa = byte_span(a);
  const auto sb = byte_span(b);
  return sa.first <= sb.second && sb.first <= sa.second;
}

// may_overlap_with, conservative for strided views of one buffer: any intersection of their
// address spans counts, even when their elements interleave without sharing a byte.
inline bool may_overlap(const char* op, const at::Tensor& a, const at::Tensor& b) {
  return may_overlap_with(op, a, b, spans_intersect);
}

}  // namespace
}  // namespace torch_checks
