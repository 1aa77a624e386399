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

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch_checks {
namespace {

// ---- names and dtypes ----

// The dtype as Python names it without the "torch." prefix ("float32", "bfloat16", "int64").
// c10::getDtypeNames returns std::string by value in Torch 2.11 and static views in 2.13: copy,
// as a view into the 2.11 temporary dangles (it garbled activation's messages on CUDA).
inline std::string dtype_name(at::ScalarType t) { return std::string(c10::getDtypeNames(t).first); }

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
//
// One policy for every op: a written tensor must not share a byte with another argument (unless
// the op allows the exact in-place form, same_view above). may_overlap answers exactly: ATen's
// answer for dense tensors, and for strided views of one buffer (q, k and v of a packed qkv
// tensor, the even and odd columns of a matrix, a transposed or expanded view), which ATen finds
// "too hard", a search for two elements whose bytes intersect. The search is bounded: after
// kOverlapSearchSteps steps it answers "overlap", the safe side (an error, never a wrong
// result); real layouts take a few steps per dimension.

namespace detail {

// floor(a / b) and ceil(a / b) for b > 0.
inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
inline int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

// One dimension of the difference of two element addresses: c * stride bytes, c in [lo, hi].
struct Term {
  int64_t stride;  // > 0
  int64_t lo, hi;
};

// Whether some choice of c for terms[i:] puts sum c * stride in the open interval (lo, hi).
// rest_min / rest_max[i] bound that sum; the terms are sorted by decreasing stride, so for
// nested layouts the bounds leave one or two values of each c. Each step spends one of
// `budget`; when it runs out the answer is "yes".
inline bool reachable(const std::vector<Term>& terms, const std::vector<int64_t>& rest_min,
                      const std::vector<int64_t>& rest_max, size_t i, int64_t lo, int64_t hi,
                      int64_t& budget) {
  if (--budget < 0) {
    return true;
  }
  if (i == terms.size()) {
    return lo < 0 && 0 < hi;
  }
  const Term& t = terms[i];
  const int64_t cmin = std::max(floor_div(lo - rest_max[i + 1], t.stride) + 1, t.lo);
  const int64_t cmax = std::min(ceil_div(hi - rest_min[i + 1], t.stride) - 1, t.hi);
  for (int64_t c = cmin; c <= cmax; ++c) {
    if (reachable(terms, rest_min, rest_max, i + 1, lo - c * t.stride, hi - c * t.stride, budget)) {
      return true;
    }
  }
  return false;
}

constexpr int64_t kOverlapSearchSteps = int64_t(1) << 16;

// Whether two non-empty views of one buffer share a byte: is there an element of `a` at
// a0 + sum_d i_d sa_d and one of `b` at b0 + sum_d j_d sb_d (bytes) whose byte ranges intersect,
// i.e. sum i_d sa_d - sum j_d sb_d in (b0 - a0 - size_a, b0 - a0 + size_b)? Dimensions of size 1
// or stride 0 add nothing; dimensions of equal stride merge into one term (i - j ranges over
// every integer between its bounds). Strides are never negative in ATen.
inline bool strided_overlap(const at::Tensor& a, const at::Tensor& b) {
  std::vector<Term> terms;
  const auto add = [&terms](const at::Tensor& t, bool minus) {
    for (int64_t d = 0; d < t.dim(); ++d) {
      const int64_t stride = t.stride(d) * static_cast<int64_t>(t.element_size());
      if (t.size(d) <= 1 || stride == 0) {
        continue;
      }
      const int64_t lo = minus ? -(t.size(d) - 1) : 0;
      const int64_t hi = minus ? 0 : t.size(d) - 1;
      const auto same = std::find_if(terms.begin(), terms.end(),
                                     [stride](const Term& x) { return x.stride == stride; });
      if (same != terms.end()) {
        same->lo += lo;
        same->hi += hi;
      } else {
        terms.push_back({stride, lo, hi});
      }
    }
  };
  add(a, false);
  add(b, true);
  std::sort(terms.begin(), terms.end(),
            [](const Term& x, const Term& y) { return x.stride > y.stride; });
  std::vector<int64_t> rest_min(terms.size() + 1, 0), rest_max(terms.size() + 1, 0);
  for (size_t i = terms.size(); i-- > 0;) {
    rest_min[i] = rest_min[i + 1] + terms[i].lo * terms[i].stride;
    rest_max[i] = rest_max[i + 1] + terms[i].hi * terms[i].stride;
  }
  const int64_t d = static_cast<int64_t>(reinterpret_cast<uintptr_t>(b.const_data_ptr()) -
                                         reinterpret_cast<uintptr_t>(a.const_data_ptr()));
  int64_t budget = kOverlapSearchSteps;
  return reachable(terms, rest_min, rest_max, 0, d - static_cast<int64_t>(a.element_size()),
                   d + static_cast<int64_t>(b.element_size()), budget);
}

}  // namespace detail

// Whether `a` and `b` share memory (exact, see above; `op` names the caller in the error for
// an overlap status this header does not know).
inline bool may_overlap(const char* op, const at::Tensor& a, const at::Tensor& b) {
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
      return detail::strided_overlap(a, b);
    default:
      TORCH_CHECK(false, op, ": unexpected memory overlap status");
  }
  return true;
}

// `written` must not share memory with `other`: "<op>: <name> must not share memory with
// <other_name><note>".
inline void check_no_overlap(const char* op, const char* name, const at::Tensor& written,
                             const char* other_name, const at::Tensor& other,
                             const char* note = "") {
  TORCH_CHECK(!may_overlap(op, written, other), op, ": ", name, " must not share memory with ",
              other_name, note);
}

}  // namespace
}  // namespace torch_checks
