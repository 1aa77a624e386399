// rope_cpu.cpp: CPU implementation of the rotary embedding of rope_cpu.h.
//
// Computes exactly the math of rope_params.h (its header comment is the specification): q and k
// of fp32, fp16 or bf16, tables of fp32 or the activation dtype, NeoX or interleaved pairs, half
// or per-channel tables, the forward or its transpose, rows from positions, sequence offsets or
// varlen cu_seqlens. All arithmetic is fp32: each output is a * ca - b * sa (or b * cb + a * sb),
// two fp32 products and one fp32 sum, then one rounding to the output dtype, to nearest even
// (cpu_convert.h: c10::BFloat16; c10::Half, or the F16C instructions, which round identically,
// on x86-64 CPUs that have them). The build compiles this file with -ffp-contract=off (build.toml) so that no
// compiler fuses a product and the sum into an FMA: the fp32 values are then bit for bit those of
// PyTorch's eager `x.float() * cos + rotate(x).float() * sin` (diffusers' LTX-Video formula, and
// transformers' formula on fp32 inputs). Any head_dim and rot_dim work (the row buffers are on the
// heap: 8 * rot_dim / 2 floats per thread).
//
// Rows are resolved and range-checked for every token first, in one serial pass (8 bytes per
// token; it also validates cu_seqlens), so a bad row throws before any output element is written
// and no table entry outside [0, table_rows) is ever read. Then the (token, head) items of q and
// k are spread over ATen's thread pool (at::parallel_for, so torch.set_num_threads applies) with
// a grain of at least kGrainElems elements per task, so that decode-sized calls (a few tokens)
// stay on the calling thread. Within a task, the coefficients of a table row are converted to
// fp32 once and reused by every head that shares them (all heads when head_stride == 0).
//
// Aliasing: out may be in (in place): each (token, head) item reads its rot_dim channels into
// fp32 buffers before it writes any of them, and items touch disjoint memory (the binding,
// torch-ext/rope_ops.cpp, rejects outputs that overlap anything else). Pass-through channels
// [rot_dim, head_dim) are copied bit for bit when out != in and left untouched in place.

#include "rope_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "cpu_convert.h"

namespace rope {
namespace cpu {
namespace {

// Minimum number of elements one thread-pool task processes (ATen's own GRAIN_SIZE), so that
// small calls, decode steps included, stay serial.
constexpr int64_t kGrainElems = 32768;
// |seqlen_offset| bound: keeps s + seqlen_offset + seqlen_offsets[b] far from int64 overflow.
constexpr int64_t kMaxOffset = int64_t{1} << 62;

// ---- dtypes and conversions ----

bool valid_dtype(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

using cpu_convert::at_index;
using cpu_convert::element_size;

// dst[0, n) <- src[0, n) converted to fp32 (exact).
void load(DType dtype, float* dst, const void* src, int64_t n) {
  cpu_convert::load(dtype, dst, src, n, "rope::cpu");
}

// dst[0, n) <- src[0, n) rounded to `dtype` (to nearest even).
void store(DType dtype, void* dst, const float* src, int64_t n) {
  cpu_convert::store(dtype, dst, src, n, "rope::cpu");
}

// even[i] <- v[2 i], odd[i] <- v[2 i + 1], i < n.
void deinterleave(const float* __restrict v, float* __restrict even, float* __restrict odd,
                  int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    even[i] = v[2 * i];
    odd[i] = v[2 * i + 1];
  }
}

// v[2 i] <- even[i], v[2 i + 1] <- odd[i], i < n.
void interleave(const float* __restrict even, const float* __restrict odd, float* __restrict v,
                int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    v[2 * i] = even[i];
    v[2 * i + 1] = odd[i];
  }
}

// ---- rows ----

// The table row of every token (b, s), at index b * seqlen + s, after checking that it lies in
// [0, table_rows) (and, in varlen mode, that cu_seqlens is well formed). Throws before anything
// is written.
std::vector<int64_t> resolve_rows(const RopeParams& p) {
  const int64_t tokens = p.batch * p.seqlen;
  std::vector<int64_t> rows(static_cast<size_t>(tokens));
  const int64_t limit = p.table_rows;
  switch (p.row_mode) {
    case RowMode::kPositions: {
      TORCH_CHECK(p.positions != nullptr, "rope: row mode kPositions needs positions");
      for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t s = 0; s < p.seqlen; ++s) {
          const int64_t at = b * p.positions_batch_stride + s * p.positions_seq_stride;
          const int64_t row = p.positions_int32 ? static_cast<const int32_t*>(p.positions)[at]
                                                : static_cast<const int64_t*>(p.positions)[at];
          TORCH_CHECK(row >= 0 && row < limit, "rope: positions holds ", row, " for token (batch ",
                      b, ", sequence index ", s, "), outside the rows of the cos/sin table [0, ",
                      limit, ")");
          rows[b * p.seqlen + s] = row;
        }
      }
      break;
    }
    case RowMode::kSequence: {
      for (int64_t b = 0; b < p.batch; ++b) {
        const int64_t extra = p.seqlen_offsets != nullptr ? p.seqlen_offsets[b] : 0;
        for (int64_t s = 0; s < p.seqlen; ++s) {
          const int64_t row = s + p.seqlen_offset + extra;
          if (row < 0 || row >= limit) {
            if (p.seqlen_offsets != nullptr) {
              TORCH_CHECK(false, "rope: the row s + seqlen_offset + seqlen_offsets[b] = ", s, " + ",
                          p.seqlen_offset, " + ", extra, " = ", row, " of token (batch ", b,
                          ", sequence index ", s, ") is outside the rows of the cos/sin table [0, ",
                          limit, ")");
            }
            TORCH_CHECK(false, "rope: the row s + seqlen_offset = ", s, " + ", p.seqlen_offset,
                        " = ", row, " of token (batch ", b, ", sequence index ", s,
                        ") is outside the rows of the cos/sin table [0, ", limit, ")");
          }
          rows[b * p.seqlen + s] = row;
        }
      }
      break;
    }
    case RowMode::kVarlen: {
      const int32_t* cu = p.cu_seqlens;
      TORCH_CHECK(cu != nullptr, "rope: row mode kVarlen needs cu_seqlens");
      TORCH_CHECK(p.batch == 1, "rope: varlen (cu_seqlens) needs batch == 1, got ", p.batch);
      TORCH_CHECK(p.num_seqs >= 0, "rope: num_seqs must be >= 0, got ", p.num_seqs);
      TORCH_CHECK(cu[0] == 0, "rope: cu_seqlens[0] must be 0, got ", cu[0]);
      for (int64_t q = 0; q < p.num_seqs; ++q) {
        TORCH_CHECK(cu[q] <= cu[q + 1], "rope: cu_seqlens must be non-decreasing, got cu_seqlens[",
                    q, "] = ", cu[q], " > cu_seqlens[", q + 1, "] = ", cu[q + 1]);
      }
      TORCH_CHECK(cu[p.num_seqs] == p.seqlen, "rope: cu_seqlens[", p.num_seqs,
                  "] (the last entry) must equal the number of tokens ", p.seqlen, ", got ",
                  cu[p.num_seqs]);
      for (int64_t q = 0; q < p.num_seqs; ++q) {
        const int64_t extra = p.seqlen_offsets != nullptr ? p.seqlen_offsets[q] : 0;
        for (int64_t t = cu[q]; t < cu[q + 1]; ++t) {
          const int64_t pos = t - cu[q];
          const int64_t row = pos + p.seqlen_offset + extra;
          if (row < 0 || row >= limit) {
            if (p.seqlen_offsets != nullptr) {
              TORCH_CHECK(false,
                          "rope: the row (t - cu_seqlens[q]) + seqlen_offset + "
                          "seqlen_offsets[q] = ",
                          pos, " + ", p.seqlen_offset, " + ", extra, " = ", row,
                          " of token t = ", t, " (sequence q = ", q,
                          ") is outside the rows of the cos/sin table [0, ", limit, ")");
            }
            TORCH_CHECK(false, "rope: the row (t - cu_seqlens[q]) + seqlen_offset = ", pos, " + ",
                        p.seqlen_offset, " = ", row, " of token t = ", t, " (sequence q = ", q,
                        ") is outside the rows of the cos/sin table [0, ", limit, ")");
          }
          rows[t] = row;
        }
      }
      break;
    }
    default:
      TORCH_CHECK(false, "rope::cpu: unsupported RowMode value ", static_cast<int>(p.row_mode));
  }
  return rows;
}

// ---- rotation ----

// Per-task fp32 buffers, half = rot_dim / 2 floats each: the coefficients of the current table
// entry (ca, cb, sa, sb, with the transpose folded in), the pair halves a and b, and a scratch
// row of rot_dim floats for the interleaved layout.
struct Buffers {
  explicit Buffers(int64_t half) : half_(half), data_(new float[8 * half]) {}
  float* ca() { return data_.get(); }
  float* cb() { return data_.get() + half_; }
  float* sa() { return data_.get() + 2 * half_; }
  float* sb() { return data_.get() + 3 * half_; }
  float* a() { return data_.get() + 4 * half_; }
  float* b() { return data_.get() + 5 * half_; }
  float* scratch() { return data_.get() + 6 * half_; }  // rot_dim floats

 private:
  int64_t half_;
  std::unique_ptr<float[]> data_;
};

// Loads the coefficients of the table entry at element offset `entry` into buf.ca/cb/sa/sb.
// With transpose, a' = a ca + b sb and b' = b cb - a sa are the forward formulas with
// sa <- -sb and sb <- -sa (negation and exchange are exact), so one compute loop serves both.
void load_coefficients(const RopeParams& p, int64_t entry, Buffers& buf) {
  const int64_t half = p.rot_dim / 2;
  const DType t = p.table_dtype;
  const char* cos = at_index(p.cos, t, entry);
  const char* sin = at_index(p.sin, t, entry);
  float* ca = buf.ca();
  float* cb = buf.cb();
  float* sa = buf.sa();
  float* sb = buf.sb();
  if (p.table_kind == TableKind::kHalf) {
    load(t, ca, cos, half);
    load(t, sa, sin, half);
    std::memcpy(cb, ca, half * sizeof(float));
    std::memcpy(sb, sa, half * sizeof(float));
  } else if (p.layout == PairLayout::kNeox) {
    load(t, ca, cos, half);
    load(t, cb, at_index(cos, t, half), half);
    load(t, sa, sin, half);
    load(t, sb, at_index(sin, t, half), half);
  } else {
    float* row = buf.scratch();
    load(t, row, cos, 2 * half);
    deinterleave(row, ca, cb, half);
    load(t, row, sin, 2 * half);
    deinterleave(row, sa, sb, half);
  }
  if (p.transpose) {
    for (int64_t i = 0; i < half; ++i) {
      const float x = sa[i];
      sa[i] = -sb[i];
      sb[i] = -x;
    }
  }
}

// One head of one token: reads the rot_dim channels of `in`, writes them to `out`, copies the
// pass-through channels when out != in.
void rotate_head(const RopeParams& p, const void* in, void* out, Buffers& buf) {
  const int64_t half = p.rot_dim / 2;
  const DType d = p.dtype;
  float* __restrict a = buf.a();
  float* __restrict b = buf.b();
  const float* __restrict ca = buf.ca();
  const float* __restrict cb = buf.cb();
  const float* __restrict sa = buf.sa();
  const float* __restrict sb = buf.sb();
  if (p.layout == PairLayout::kNeox) {
    load(d, a, in, half);
    load(d, b, at_index(in, d, half), half);
  } else {
    load(d, buf.scratch(), in, 2 * half);
    deinterleave(buf.scratch(), a, b, half);
  }
  for (int64_t i = 0; i < half; ++i) {
    const float x = a[i];
    const float y = b[i];
    a[i] = x * ca[i] - y * sa[i];
    b[i] = y * cb[i] + x * sb[i];
  }
  if (p.layout == PairLayout::kNeox) {
    store(d, out, a, half);
    store(d, at_index(out, d, half), b, half);
  } else {
    interleave(a, b, buf.scratch(), half);
    store(d, out, buf.scratch(), 2 * half);
  }
  if (out != in && p.head_dim > p.rot_dim) {
    std::memcpy(at_index(out, d, p.rot_dim), at_index(in, d, p.rot_dim),
                (p.head_dim - p.rot_dim) * element_size(d));
  }
}

void forward(const RopeParams& p, const std::vector<int64_t>& rows) {
  const bool has_k = p.k.in != nullptr;
  const int64_t heads_q = p.q.heads;
  const int64_t heads = heads_q + (has_k ? p.k.heads : 0);
  const int64_t items = p.batch * p.seqlen * heads;
  const int64_t grain = std::max<int64_t>(1, kGrainElems / std::max<int64_t>(1, p.head_dim));
  const DType d = p.dtype;

  at::parallel_for(0, items, grain, [&](int64_t first, int64_t last) {
    Buffers buf(p.rot_dim / 2);
    int64_t loaded = -1;  // element offset of the table entry whose coefficients are in buf
    for (int64_t item = first; item < last; ++item) {
      const int64_t token = item / heads;
      const int64_t j = item % heads;
      const int64_t b = token / p.seqlen;
      const int64_t s = token % p.seqlen;
      const bool is_q = j < heads_q;
      const RopeTensor& t = is_q ? p.q : p.k;
      const int64_t h = is_q ? j : j - heads_q;

      const int64_t tb = p.table_batch == 1 ? 0 : b;
      const int64_t entry =
          tb * p.table_batch_stride + rows[token] * p.row_stride + h * p.head_stride;
      if (entry != loaded) {
        load_coefficients(p, entry, buf);
        loaded = entry;
      }
      const void* in =
          at_index(t.in, d, b * t.in_batch_stride + s * t.in_seq_stride + h * t.in_head_stride);
      void* out =
          at_index(t.out, d, b * t.out_batch_stride + s * t.out_seq_stride + h * t.out_head_stride);
      rotate_head(p, in, out, buf);
    }
  });
}

void check_tensor(const char* name, const RopeTensor& t) {
  TORCH_CHECK(t.in != nullptr && t.out != nullptr, "rope::cpu: ", name, ".in and ", name,
              ".out must be set");
  TORCH_CHECK(t.heads >= 0, "rope::cpu: ", name, ".heads must be >= 0, got ", t.heads);
}

}  // namespace

void rope_forward(const RopeParams& p) {
  constexpr const char* op = "rope::cpu::rope_forward";
  TORCH_CHECK(valid_dtype(p.dtype), op, ": unsupported dtype value ", static_cast<int>(p.dtype));
  TORCH_CHECK(p.table_dtype == DType::kFloat32 || p.table_dtype == p.dtype, op,
              ": table_dtype must be kFloat32 or dtype, got ", static_cast<int>(p.table_dtype));
  TORCH_CHECK(p.layout == PairLayout::kNeox || p.layout == PairLayout::kInterleaved, op,
              ": unsupported PairLayout value ", static_cast<int>(p.layout));
  TORCH_CHECK(p.table_kind == TableKind::kHalf || p.table_kind == TableKind::kFull, op,
              ": unsupported TableKind value ", static_cast<int>(p.table_kind));
  TORCH_CHECK(p.batch >= 0 && p.seqlen >= 0, op, ": batch and seqlen must be >= 0, got ", p.batch,
              " and ", p.seqlen);
  TORCH_CHECK(p.rot_dim > 0 && p.rot_dim % 2 == 0 && p.rot_dim <= p.head_dim, op,
              ": rot_dim must be even, > 0 and <= head_dim (", p.head_dim, "), got ", p.rot_dim);
  TORCH_CHECK(p.seqlen_offset >= -kMaxOffset && p.seqlen_offset <= kMaxOffset, op,
              ": |seqlen_offset| must be <= 2^62, got ", p.seqlen_offset);
  const bool has_k = p.k.in != nullptr;
  if (p.batch == 0 || p.seqlen == 0 || (p.q.heads == 0 && (!has_k || p.k.heads == 0))) {
    return;
  }
  check_tensor("q", p.q);
  if (has_k) {
    check_tensor("k", p.k);
  }
  TORCH_CHECK(p.cos != nullptr && p.sin != nullptr, op, ": cos and sin must be set");
  TORCH_CHECK(p.table_batch == 1 || p.table_batch == p.batch, op,
              ": table_batch must be 1 or batch (", p.batch, "), got ", p.table_batch);
  if (p.head_stride != 0) {
    TORCH_CHECK(p.table_heads == p.q.heads && (!has_k || p.k.heads == p.table_heads), op,
                ": a table with head_stride != 0 needs one entry per head of q and k: "
                "table_heads = ",
                p.table_heads, ", q.heads = ", p.q.heads, ", k.heads = ", has_k ? p.k.heads : 0);
  }
  forward(p, resolve_rows(p));
}

}  // namespace cpu
}  // namespace rope
