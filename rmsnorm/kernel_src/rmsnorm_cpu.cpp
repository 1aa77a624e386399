// rmsnorm_cpu.cpp: CPU implementation of the RMSNorm forward and backward of rmsnorm_cpu.h.
//
// Computes exactly the math of rmsnorm_params.h (its header comment is the specification) on
// row-strided [rows, hidden] views: fp32, fp16 and bf16 data, all arithmetic in fp32, every
// rounding to fp16/bf16 to nearest even (cpu_convert.h: c10::BFloat16; c10::Half, or the F16C
// instructions, which round identically, on x86-64 CPUs that have them), and each stored value rounded once to
// its tensor's dtype. Any hidden size works (the row buffers are on the heap: 2 rows of fp32 per
// thread in the forward, 7 in the backward).
//
// Work split: rows are spread over ATen's thread pool (at::parallel_for, so torch.set_num_threads
// applies), with a grain of at least kGrainElems elements per task so that small calls (decode
// sizes) stay on the calling thread. One row is processed as a few flat loops over contiguous fp32
// buffers (convert in, scale, convert out), which the compiler vectorizes at -O3. The two row
// reductions (sum of squares, dot product) keep kLanes independent partial sums, so they vectorize
// too without -ffast-math, and sum in blocks (row_sum) to keep the fp32 error small for long rows.
//
// Aliasing: out may alias input and residual_out may alias residual (forward), grad_input may
// alias grad_out or grad_residual (backward): every row is read completely into fp32 buffers
// before any element of it is written. Other overlaps are rejected by the caller (torch-ext/).
//
// Backward reductions (grad_weight, per-sample grad_scale / grad_shift): the rows are cut into a
// fixed number of contiguous chunks (one per thread, fewer for small problems), each chunk sums
// its rows into its own fp32 partial buffers, and a final pass adds the chunk partials in chunk
// order and rounds once to the output dtype. The result is deterministic for a given thread count.
// Within a chunk, rows are first summed in blocks of kBlockRows (RowSum), so the fp32 rounding
// error grows with kBlockRows + rows / kBlockRows instead of with the row count.

#include "rmsnorm_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "cpu_convert.h"

namespace rmsnorm {
namespace cpu {
namespace {

// Minimum number of elements one thread-pool task processes, so that tiny calls stay serial.
constexpr int64_t kGrainElems = 16384;
// Independent fp32 partial sums in the row reductions (four SSE registers at the baseline x86-64
// target of the build).
constexpr int64_t kLanes = 16;
// Elements of one row summed on their own before they join the row's total (row_sum).
constexpr int64_t kReduceBlock = 1024;
// Rows summed into a block buffer before it is added to a chunk's partial sums.
constexpr int64_t kBlockRows = 64;

// ---- dtypes and conversions ----

void check_dtype(const char* op, const char* name, DType dtype) {
  TORCH_CHECK(dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16, op,
              ": unsupported DType value ", static_cast<int>(dtype), " for ", name);
}

using cpu_convert::at_index;

// dst[0, n) <- src[0, n) converted to fp32.
void load(DType dtype, float* dst, const void* src, int64_t n) {
  cpu_convert::load(dtype, dst, src, n, "rmsnorm::cpu");
}

// dst[0, n) <- src[0, n) rounded to `dtype` (to nearest even).
void store(DType dtype, void* dst, const float* src, int64_t n) {
  cpu_convert::store(dtype, dst, src, n, "rmsnorm::cpu");
}

// v[0, n) <- round_dtype(v[0, n)), kept in fp32.
void round_to(DType dtype, float* v, int64_t n) {
  cpu_convert::round_to(dtype, v, n, "rmsnorm::cpu");
}

// ---- row reductions ----

// Sums kLanes partial sums pairwise.
float reduce_lanes(float* acc) {
  for (int64_t width = kLanes / 2; width > 0; width /= 2) {
    for (int64_t j = 0; j < width; ++j) acc[j] += acc[j + width];
  }
  return acc[0];
}

// sum over i of term(i) for i in [0, n): kLanes interleaved partial sums (vectorized), each
// summing a block of kReduceBlock elements on its own before it is added to the lane's total, so
// the fp32 error grows with kReduceBlock / kLanes + n / kReduceBlock terms per lane instead of
// n / kLanes (about 9e-6 relative error at hidden = 65536 without the blocks, under 1e-6 with).
template <typename Term>
float row_sum(int64_t n, const Term& term) {
  float total[kLanes] = {};
  for (int64_t begin = 0; begin < n; begin += kReduceBlock) {
    const int64_t end = std::min(n, begin + kReduceBlock);
    float acc[kLanes] = {};
    int64_t i = begin;
    for (; i + kLanes <= end; i += kLanes) {
      for (int64_t j = 0; j < kLanes; ++j) acc[j] += term(i + j);
    }
    for (int64_t j = 0; i < end; ++i, ++j) acc[j] += term(i);
    for (int64_t j = 0; j < kLanes; ++j) total[j] += acc[j];
  }
  return reduce_lanes(total);
}

float sum_squares(const float* __restrict v, int64_t n) {
  return row_sum(n, [v](int64_t i) { return v[i] * v[i]; });
}

float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  return row_sum(n, [a, b](int64_t i) { return a[i] * b[i]; });
}

// rstd = 1 / sqrt(mean(r^2) + eps), rmsnorm_params.h.
float row_rstd(const float* r, int64_t hidden, float eps) {
  return 1.0f / std::sqrt(sum_squares(r, hidden) / static_cast<float>(hidden) + eps);
}

// w' = weight_offset + weight in fp32, once for all rows; empty when there is no weight (w' = 1).
std::vector<float> effective_weight(const void* weight, DType dtype, float offset, int64_t hidden) {
  std::vector<float> w;
  if (weight != nullptr) {
    w.resize(hidden);
    load(dtype, w.data(), weight, hidden);
    for (int64_t i = 0; i < hidden; ++i) w[i] = offset + w[i];
  }
  return w;
}

int64_t row_grain(int64_t hidden) { return std::max<int64_t>(1, kGrainElems / hidden); }

// ---- forward ----

void fwd(const RmsNormFwdParams& p) {
  const int64_t hidden = p.hidden;
  const std::vector<float> w_vec =
      effective_weight(p.weight, p.weight_dtype, p.weight_offset, hidden);
  const float* w = p.weight != nullptr ? w_vec.data() : nullptr;
  const bool fused = p.residual != nullptr;
  const bool modulated = p.scale != nullptr;

  at::parallel_for(0, p.rows, row_grain(hidden), [&](int64_t first, int64_t last) {
    const std::unique_ptr<float[]> buffers(new float[2 * hidden]);
    float* r = buffers.get();  // r, then n, n', y
    float* t = r + hidden;     // residual, scale, shift rows
    for (int64_t row = first; row < last; ++row) {
      load(p.in_dtype, r, at_index(p.input, p.in_dtype, row * p.input_stride), hidden);
      if (fused) {
        load(p.in_dtype, t, at_index(p.residual, p.in_dtype, row * p.residual_stride), hidden);
        for (int64_t i = 0; i < hidden; ++i) r[i] += t[i];
        round_to(p.in_dtype, r, hidden);  // r = round_in(input + residual)
        store(p.in_dtype, at_index(p.residual_out, p.in_dtype, row * p.residual_out_stride), r,
              hidden);
      }
      const float rstd = row_rstd(r, hidden, p.eps);
      if (p.rstd != nullptr) {
        p.rstd[row] = rstd;
      }
      for (int64_t i = 0; i < hidden; ++i) r[i] *= rstd;
      if (p.round_norm) {
        round_to(p.norm_dtype, r, hidden);
      }
      if (w != nullptr) {
        for (int64_t i = 0; i < hidden; ++i) r[i] *= w[i];
      }
      if (modulated) {
        const int64_t b = row / p.rows_per_sample;
        load(p.in_dtype, t, at_index(p.scale, p.in_dtype, b * p.scale_stride), hidden);
        for (int64_t i = 0; i < hidden; ++i) r[i] *= 1.0f + t[i];
        load(p.in_dtype, t, at_index(p.shift, p.in_dtype, b * p.shift_stride), hidden);
        for (int64_t i = 0; i < hidden; ++i) r[i] += t[i];
      }
      store(p.out_dtype, at_index(p.out, p.out_dtype, row * p.out_stride), r, hidden);
    }
  });
}

// ---- backward ----

// Sums rows of `hidden` values into `total`, through a block buffer flushed every kBlockRows rows.
class RowSum {
 public:
  RowSum(int64_t hidden, float* block) : hidden_(hidden), block_(block) {}

  // Starts summing into `total` (already zeroed), after flushing the previous target.
  void retarget(float* total) {
    flush();
    total_ = total;
  }

  // Returns the block row to add into (zeroed at the start of each block).
  float* row() {
    if (rows_ == kBlockRows) {
      flush();
    }
    if (rows_ == 0) {
      std::fill(block_, block_ + hidden_, 0.0f);
    }
    ++rows_;
    return block_;
  }

  void flush() {
    if (rows_ > 0) {
      for (int64_t i = 0; i < hidden_; ++i) total_[i] += block_[i];
      rows_ = 0;
    }
  }

 private:
  int64_t hidden_;
  float* block_;
  float* total_ = nullptr;
  int64_t rows_ = 0;
};

// A fixed split of the rows into contiguous chunks, and where each chunk keeps its partial sums:
// grad_weight partials are [chunks, hidden]; per-sample partials hold, for chunk k, one row per
// sample from first_sample(k) to last_sample(k), starting at row sample_offset[k].
struct ChunkPlan {
  int64_t rows;
  int64_t chunks;
  int64_t rows_per_sample;
  std::vector<int64_t> sample_offset;  // chunks + 1 entries

  ChunkPlan(int64_t rows_, int64_t hidden, int64_t rows_per_sample_)
      : rows(rows_), rows_per_sample(rows_per_sample_) {
    const int64_t grain = row_grain(hidden);
    const int64_t max_chunks = (rows + grain - 1) / grain;
    chunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), max_chunks));
    sample_offset.assign(chunks + 1, 0);
    for (int64_t k = 0; k < chunks; ++k) {
      sample_offset[k + 1] = sample_offset[k] + last_sample(k) - first_sample(k) + 1;
    }
  }
  int64_t row_begin(int64_t k) const { return rows * k / chunks; }
  int64_t first_sample(int64_t k) const { return row_begin(k) / rows_per_sample; }
  int64_t last_sample(int64_t k) const {
    return std::max(row_begin(k + 1) - 1, row_begin(k)) / rows_per_sample;
  }
};

// out[b] <- sum over the chunks k that hold sample b of partial[sample_offset[k] + b - first(k)],
// rounded to `dtype`; out rows are `stride` elements apart.
void reduce_samples(const ChunkPlan& plan, const float* partial, int64_t hidden, int64_t samples,
                    DType dtype, void* out, int64_t stride) {
  at::parallel_for(0, samples, row_grain(hidden), [&](int64_t first, int64_t last) {
    std::vector<float> sum(hidden);
    for (int64_t b = first; b < last; ++b) {
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int64_t k = 0; k < plan.chunks; ++k) {
        if (b < plan.first_sample(k) || b > plan.last_sample(k)) {
          continue;
        }
        const float* part = partial + (plan.sample_offset[k] + b - plan.first_sample(k)) * hidden;
        for (int64_t i = 0; i < hidden; ++i) sum[i] += part[i];
      }
      store(dtype, at_index(out, dtype, b * stride), sum.data(), hidden);
    }
  });
}

void bwd(const RmsNormBwdParams& p) {
  const int64_t hidden = p.hidden;
  const std::vector<float> w_vec =
      effective_weight(p.weight, p.weight_dtype, p.weight_offset, hidden);
  const float* w = p.weight != nullptr ? w_vec.data() : nullptr;
  const bool modulated = p.scale != nullptr;
  const int64_t rows_per_sample = modulated ? p.rows_per_sample : p.rows;
  const ChunkPlan plan(p.rows, hidden, std::max<int64_t>(1, rows_per_sample));
  const int64_t samples = modulated ? p.rows / p.rows_per_sample : 1;

  std::vector<float> grad_weight_part(p.grad_weight != nullptr ? plan.chunks * hidden : 0, 0.0f);
  const int64_t sample_rows = plan.sample_offset[plan.chunks];
  std::vector<float> grad_scale_part(p.grad_scale != nullptr ? sample_rows * hidden : 0, 0.0f);
  std::vector<float> grad_shift_part(p.grad_shift != nullptr ? sample_rows * hidden : 0, 0.0f);

  at::parallel_for(0, plan.chunks, 1, [&](int64_t first_chunk, int64_t last_chunk) {
    const int64_t nbuf = 7;  // n, n', g, t and the three RowSum blocks
    const std::unique_ptr<float[]> buffers(new float[nbuf * hidden]);
    float* n = buffers.get();  // r, then n = r * rstd
    float* nr = n + hidden;    // n' (when round_norm)
    float* g = nr + hidden;    // grad_out, then gy, gn, grad_input
    float* t = g + hidden;     // scale, grad_residual rows
    RowSum sum_gw(hidden, t + hidden);
    RowSum sum_gs(hidden, t + 2 * hidden);
    RowSum sum_gsh(hidden, t + 3 * hidden);
    for (int64_t k = first_chunk; k < last_chunk; ++k) {
      if (p.grad_weight != nullptr) {
        sum_gw.retarget(grad_weight_part.data() + k * hidden);
      }
      int64_t sample = -1;
      for (int64_t row = plan.row_begin(k); row < plan.row_begin(k + 1); ++row) {
        load(p.in_dtype, n, at_index(p.input, p.in_dtype, row * p.input_stride), hidden);
        const float rstd = row_rstd(n, hidden, p.eps);
        for (int64_t i = 0; i < hidden; ++i) n[i] *= rstd;
        const float* n_used = n;  // n'
        if (p.round_norm && p.norm_dtype != DType::kFloat32) {
          std::copy(n, n + hidden, nr);
          round_to(p.norm_dtype, nr, hidden);
          n_used = nr;
        }
        load(p.out_dtype, g, at_index(p.grad_out, p.out_dtype, row * p.grad_out_stride), hidden);

        const int64_t b = row / plan.rows_per_sample;
        if (modulated && b != sample) {
          sample = b;
          const int64_t slot = plan.sample_offset[k] + b - plan.first_sample(k);
          if (p.grad_scale != nullptr) {
            sum_gs.retarget(grad_scale_part.data() + slot * hidden);
          }
          if (p.grad_shift != nullptr) {
            sum_gsh.retarget(grad_shift_part.data() + slot * hidden);
          }
        }
        if (p.grad_shift != nullptr) {  // grad_shift[b] += grad_out
          float* acc = sum_gsh.row();
          for (int64_t i = 0; i < hidden; ++i) acc[i] += g[i];
        }
        if (p.grad_scale != nullptr) {  // grad_scale[b] += grad_out * n' * w'
          float* acc = sum_gs.row();
          if (w != nullptr) {
            for (int64_t i = 0; i < hidden; ++i) acc[i] += g[i] * n_used[i] * w[i];
          } else {
            for (int64_t i = 0; i < hidden; ++i) acc[i] += g[i] * n_used[i];
          }
        }
        if (modulated) {  // gy = grad_out * (1 + scale[b])
          load(p.in_dtype, t, at_index(p.scale, p.in_dtype, b * p.scale_stride), hidden);
          for (int64_t i = 0; i < hidden; ++i) g[i] *= 1.0f + t[i];
        }
        if (p.grad_weight != nullptr) {  // grad_weight += gy * n'
          float* acc = sum_gw.row();
          for (int64_t i = 0; i < hidden; ++i) acc[i] += g[i] * n_used[i];
        }
        if (w != nullptr) {  // gn = gy * w'
          for (int64_t i = 0; i < hidden; ++i) g[i] *= w[i];
        }
        // grad_input = rstd * (gn - n * mean(gn * n)) + grad_residual
        const float mean_gn_n = dot(g, n, hidden) / static_cast<float>(hidden);
        for (int64_t i = 0; i < hidden; ++i) g[i] = rstd * (g[i] - n[i] * mean_gn_n);
        if (p.grad_residual != nullptr) {
          load(p.in_dtype, t, at_index(p.grad_residual, p.in_dtype, row * p.grad_residual_stride),
               hidden);
          for (int64_t i = 0; i < hidden; ++i) g[i] += t[i];
        }
        store(p.in_dtype, at_index(p.grad_input, p.in_dtype, row * p.grad_input_stride), g, hidden);
      }
      sum_gw.flush();
      sum_gs.flush();
      sum_gsh.flush();
    }
  });

  if (p.grad_weight != nullptr) {
    at::parallel_for(0, hidden, kGrainElems, [&](int64_t first, int64_t last) {
      std::vector<float> sum(last - first, 0.0f);
      for (int64_t k = 0; k < plan.chunks; ++k) {
        const float* part = grad_weight_part.data() + k * hidden + first;
        for (int64_t i = 0; i < last - first; ++i) sum[i] += part[i];
      }
      store(p.weight_dtype, at_index(p.grad_weight, p.weight_dtype, first), sum.data(),
            last - first);
    });
  }
  if (p.grad_scale != nullptr) {
    reduce_samples(plan, grad_scale_part.data(), hidden, samples, p.in_dtype, p.grad_scale,
                   p.grad_scale_stride);
  }
  if (p.grad_shift != nullptr) {
    reduce_samples(plan, grad_shift_part.data(), hidden, samples, p.in_dtype, p.grad_shift,
                   p.grad_shift_stride);
  }
}

}  // namespace

void rms_norm_fwd(const RmsNormFwdParams& params) {
  constexpr const char* op = "rmsnorm::cpu::rms_norm_fwd";
  check_dtype(op, "in_dtype", params.in_dtype);
  check_dtype(op, "weight_dtype", params.weight_dtype);
  check_dtype(op, "out_dtype", params.out_dtype);
  check_dtype(op, "norm_dtype", params.norm_dtype);
  if (params.rows <= 0) {
    return;
  }
  TORCH_CHECK(params.hidden > 0, op, ": hidden must be > 0 when rows > 0, got ", params.hidden);
  TORCH_CHECK((params.residual == nullptr) == (params.residual_out == nullptr), op,
              ": residual and residual_out must be both set or both null");
  TORCH_CHECK((params.scale == nullptr) == (params.shift == nullptr), op,
              ": scale and shift must be both set or both null");
  TORCH_CHECK(params.scale == nullptr || params.rows_per_sample > 0, op,
              ": rows_per_sample must be > 0, got ", params.rows_per_sample);
  fwd(params);
}

void rms_norm_bwd(const RmsNormBwdParams& params) {
  constexpr const char* op = "rmsnorm::cpu::rms_norm_bwd";
  check_dtype(op, "in_dtype", params.in_dtype);
  check_dtype(op, "weight_dtype", params.weight_dtype);
  check_dtype(op, "out_dtype", params.out_dtype);
  check_dtype(op, "norm_dtype", params.norm_dtype);
  if (params.rows <= 0) {
    return;
  }
  TORCH_CHECK(params.hidden > 0, op, ": hidden must be > 0 when rows > 0, got ", params.hidden);
  TORCH_CHECK(params.grad_weight == nullptr || params.weight != nullptr, op,
              ": grad_weight needs weight");
  TORCH_CHECK(
      (params.grad_scale == nullptr && params.grad_shift == nullptr) || params.scale != nullptr, op,
      ": grad_scale and grad_shift need scale");
  TORCH_CHECK(params.scale == nullptr || params.rows_per_sample > 0, op,
              ": rows_per_sample must be > 0, got ", params.rows_per_sample);
  bwd(params);
}

}  // namespace cpu
}  // namespace rmsnorm
