// attention_cpu.cpp: CPU implementation of the attention forward of attention_cpu.h.
//
// Computes exactly the math of attention_params.h (its header comment is the specification):
// scores scale * <q_i, k_j>, optional softcap (cap * tanh(s / cap)) then the ALiBi bias,
// bottom-right aligned causal / sliding-window masks, softmax over the visible keys, and
// out_i = sum_j p_j v_j with lse_i = log sum_j exp(s_j) (natural log). All arithmetic is fp32;
// q/k/v of float16 / bfloat16 are widened exactly, and each output is rounded once to the
// output dtype (to nearest even, c10::Half / c10::BFloat16).
//
// Tiling (FlashAttention's schedule, on the CPU): a task is one (sequence b, kv head hk, query
// tile). Its rows are the tile's query positions times the heads_q / heads_kv query heads that
// share kv head hk (GQA / MQA rows are packed, so each K/V element is converted to fp32 once per
// task, not once per query head: decode steps are bound by exactly that conversion). The task
// sweeps the visible key range in tiles of kKeysPerTile keys with an online softmax: per row a
// running max m, a running sum l and an fp32 accumulator O, rescaled by exp(m_old - m_new) when
// the max grows. Memory is O(rows * (head_dim + kKeysPerTile)) per thread, independent of the
// sequence lengths: there is no seqlen_q x seqlen_k buffer. Tasks are spread over ATen's thread
// pool (at::parallel_for over (b, hk, query tile)); each writes disjoint rows of out and lse.
//
// Loops are arranged so that the compiler vectorizes them without reassociating any sum (no
// -ffast-math): scores accumulate along head_dim into independent per-key lanes (K is stored
// transposed in the tile), and O accumulates p_j * v_j into independent per-channel lanes. The
// two inner loops also exist as AVX2 copies, picked at run time; since every lane sums in the
// same order at any vector width, results are bit-identical with and without AVX2. exp, log and
// tanh are the C library's float functions, one call per visible score.
//
// Key rows are addressed as attention_params.h says (paged block table, varlen offsets,
// kv_batch_idx, leftpad_k); the values of those int32 arrays are trusted here (the Torch layer
// checks them on the CPU before the call). Split-KV is not used on the CPU (attn_fwd_num_splits
// returns 1): one pass over the keys gives the same result without the combine step.

#include "attention_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_cpu_types.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ATTENTION_X86 1
#endif

namespace attention {
namespace cpu {
namespace {

// Query rows (query positions x query heads of one kv group) per task, and keys per inner tile.
// 64 x 64 fp32 scores (16 KiB) plus the K/V tiles stay in L1/L2 for head_dim up to 256.
constexpr int64_t kRowsPerTile = 64;
constexpr int64_t kKeysPerTile = 64;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

// ---- inner loops ----
//
// Written so that each output lane accumulates in a fixed order (over head_dim for scores, over
// keys for O) whatever the vector width: the AVX2 copies, chosen at run time on CPUs that have
// AVX2 (the baseline x86-64 build has SSE2 only), give bit-identical results to the baseline
// ones, only faster. Products and sums stay separate instructions (-ffp-contract=off, build.toml).

// s[r][jj] = <q_r, k_jj> for `rows` rows; kt is the K tile transposed ([head_dim][kKeysPerTile]).
// Four rows at a time share each load of kt.
template <typename A>
[[gnu::always_inline]] inline void qk_impl(const A* __restrict q, int64_t rows, int64_t d,
                                           const A* __restrict kt, int64_t nk, A* __restrict s) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    A* s0 = s + r * kKeysPerTile;
    A* s1 = s0 + kKeysPerTile;
    A* s2 = s1 + kKeysPerTile;
    A* s3 = s2 + kKeysPerTile;
    for (int64_t jj = 0; jj < nk; ++jj) s0[jj] = s1[jj] = s2[jj] = s3[jj] = 0;
    const A* q0 = q + r * d;
    for (int64_t c = 0; c < d; ++c) {
      const A a0 = q0[c], a1 = q0[d + c], a2 = q0[2 * d + c], a3 = q0[3 * d + c];
      const A* k = kt + c * kKeysPerTile;
      for (int64_t jj = 0; jj < nk; ++jj) {
        const A kv = k[jj];
        s0[jj] += a0 * kv;
        s1[jj] += a1 * kv;
        s2[jj] += a2 * kv;
        s3[jj] += a3 * kv;
      }
    }
  }
  for (; r < rows; ++r) {
    A* s0 = s + r * kKeysPerTile;
    for (int64_t jj = 0; jj < nk; ++jj) s0[jj] = 0;
    const A* q0 = q + r * d;
    for (int64_t c = 0; c < d; ++c) {
      const A a0 = q0[c];
      const A* k = kt + c * kKeysPerTile;
      for (int64_t jj = 0; jj < nk; ++jj) s0[jj] += a0 * k[jj];
    }
  }
}

// o = o * correction + sum_{jj in [lo, hi)} p[jj] v[jj]  (v: [kKeysPerTile][head_dim]).
template <typename A>
[[gnu::always_inline]] inline void pv_impl(A* __restrict o, A correction, const A* __restrict p,
                                           int64_t lo, int64_t hi, const A* __restrict v,
                                           int64_t d) {
  if (correction != 1) {
    for (int64_t c = 0; c < d; ++c) o[c] *= correction;
  }
  for (int64_t jj = lo; jj < hi; ++jj) {
    const A pj = p[jj];
    const A* vr = v + jj * d;
    for (int64_t c = 0; c < d; ++c) o[c] += pj * vr[c];
  }
}

void qk_base(const float* q, int64_t rows, int64_t d, const float* kt, int64_t nk, float* s) {
  qk_impl(q, rows, d, kt, nk, s);
}
void pv_base(float* o, float correction, const float* p, int64_t lo, int64_t hi, const float* v,
             int64_t d) {
  pv_impl(o, correction, p, lo, hi, v, d);
}

#if defined(ATTENTION_X86)
__attribute__((target("avx2"))) void qk_avx2(const float* q, int64_t rows, int64_t d,
                                             const float* kt, int64_t nk, float* s) {
  qk_impl(q, rows, d, kt, nk, s);
}
__attribute__((target("avx2"))) void pv_avx2(float* o, float correction, const float* p, int64_t lo,
                                             int64_t hi, const float* v, int64_t d) {
  pv_impl(o, correction, p, lo, hi, v, d);
}
#endif

// float64 (gradient checks, not speed): the portable copies only.
void qk_f64(const double* q, int64_t rows, int64_t d, const double* kt, int64_t nk, double* s) {
  qk_impl(q, rows, d, kt, nk, s);
}
void pv_f64(double* o, double correction, const double* p, int64_t lo, int64_t hi, const double* v,
            int64_t d) {
  pv_impl(o, correction, p, lo, hi, v, d);
}

template <typename A>
struct InnerLoops {
  void (*qk)(const A*, int64_t, int64_t, const A*, int64_t, A*);
  void (*pv)(A*, A, const A*, int64_t, int64_t, const A*, int64_t);
};

template <typename A>
const InnerLoops<A>& inner_loops();

template <>
const InnerLoops<float>& inner_loops<float>() {
  static const InnerLoops<float> loops = [] {
#if defined(ATTENTION_X86)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) return InnerLoops<float>{qk_avx2, pv_avx2};
#endif
    return InnerLoops<float>{qk_base, pv_base};
  }();
  return loops;
}

template <>
const InnerLoops<double>& inner_loops<double>() {
  static const InnerLoops<double> loops{qk_f64, pv_f64};
  return loops;
}

// ---- conversions to fp32 (exact) ----
//
// bf16 -> fp32 is a 16-bit shift of the bits, written so that it vectorizes; fp16 -> fp32 uses
// the F16C instructions when the CPU has them (c10::Half's bit manipulation does not vectorize
// in the baseline build), else c10::Half. Both are exact.

template <typename T>
void to_float(float* __restrict dst, const T* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

template <>
void to_float<float>(float* __restrict dst, const float* __restrict src, int64_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}

template <>
void to_float<c10::BFloat16>(float* __restrict dst, const c10::BFloat16* __restrict src,
                             int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint32_t>(bits[i]) << 16;
}

#if defined(ATTENTION_X86)
bool cpu_has_f16c() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  }();
  return has;
}

__attribute__((target("avx,f16c"))) void half_to_float_f16c(float* dst, const c10::Half* src,
                                                            int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}
#endif

template <>
void to_float<c10::Half>(float* __restrict dst, const c10::Half* __restrict src, int64_t n) {
#if defined(ATTENTION_X86)
  if (cpu_has_f16c()) {
    half_to_float_f16c(dst, src, n);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// float64 rows stay float64 (their arithmetic type, Acc<double>).
void to_float(double* __restrict dst, const double* __restrict src, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(double));
}

// ---- per-sequence geometry ----

struct Seq {
  int64_t q_row0 = 0;  // first row of q / out / lse (varlen: cu_seqlens_q[b])
  int64_t len_q = 0;
  int64_t len_k = 0;
};

Seq sequence(const AttnFwdParams& p, int64_t b) {
  Seq s;
  if (p.cu_seqlens_q != nullptr) {
    s.q_row0 = p.cu_seqlens_q[b];
    s.len_q = static_cast<int64_t>(p.cu_seqlens_q[b + 1]) - p.cu_seqlens_q[b];
  } else {
    s.len_q = p.seqlen_q;
  }
  if (p.seqused_k != nullptr) {
    s.len_k = p.seqused_k[b];
  } else if (p.cu_seqlens_k != nullptr) {
    s.len_k = static_cast<int64_t>(p.cu_seqlens_k[b + 1]) - p.cu_seqlens_k[b];
  } else {
    s.len_k = p.seqlen_k - (p.leftpad_k != nullptr ? p.leftpad_k[b] : 0);
  }
  return s;
}

// Element offsets (kv head 0) of key row j of sequence b, in k and in v.
struct RowOffsets {
  int64_t k, v;
};

RowOffsets key_row(const AttnFwdParams& p, int64_t b, int64_t j) {
  if (p.block_table != nullptr) {
    const int64_t block = p.block_table[b * p.block_table_batch_stride + j / p.page_block_size];
    const int64_t row = j % p.page_block_size;
    return {block * p.k_batch_stride + row * p.k_row_stride,
            block * p.v_batch_stride + row * p.v_row_stride};
  }
  // k and v share the row source; their strides may differ.
  if (p.cu_seqlens_k != nullptr) {
    const int64_t row = static_cast<int64_t>(p.cu_seqlens_k[b]) + j;
    return {row * p.k_row_stride, row * p.v_row_stride};
  }
  const int64_t kb = p.kv_batch_idx != nullptr ? p.kv_batch_idx[b] : b;
  const int64_t row = (p.leftpad_k != nullptr ? p.leftpad_k[b] : 0) + j;
  return {kb * p.k_batch_stride + row * p.k_row_stride,
          kb * p.v_batch_stride + row * p.v_row_stride};
}

// ---- one task ----

template <typename A>
struct Scratch {
  std::vector<A> q, kt, v, s, o, m, l, row;
  Scratch(int64_t rows, int64_t head_dim)
      : q(rows * head_dim),
        kt(head_dim * kKeysPerTile),
        v(kKeysPerTile * head_dim),
        s(rows * kKeysPerTile),
        o(rows * head_dim),
        m(rows),
        l(rows),
        row(head_dim) {}
};

template <typename T>
class Task {
  using A = Acc<T>;
  static constexpr A kNegInfA = -std::numeric_limits<A>::infinity();

 public:
  Task(const AttnFwdParams& p, Scratch<A>& w)
      : p_(p), w_(w), loops_(inner_loops<A>()), d_(p.head_dim), group_(p.heads_q / p.heads_kv) {}

  // Rows: query positions [q0, q0 + nq) of sequence b, times the group of kv head hk.
  void run(int64_t b, const Seq& seq, int64_t hk, int64_t q0, int64_t nq) {
    const int64_t rows = nq * group_;
    const T* q = static_cast<const T*>(p_.q);
    const int64_t q_batch = p_.cu_seqlens_q != nullptr ? 0 : b * p_.q_batch_stride;
    for (int64_t qi = 0; qi < nq; ++qi) {
      for (int64_t g = 0; g < group_; ++g) {
        const int64_t h = hk * group_ + g;
        const T* src =
            q + q_batch + (seq.q_row0 + q0 + qi) * p_.q_row_stride + h * p_.q_head_stride;
        to_float(w_.q.data() + (qi * group_ + g) * d_, src, d_);
      }
    }
    std::fill(w_.o.begin(), w_.o.begin() + rows * d_, A(0));
    std::fill(w_.m.begin(), w_.m.begin() + rows, kNegInfA);
    std::fill(w_.l.begin(), w_.l.begin() + rows, A(0));

    // Visible key range of the tile (row i sees [d_i - left, d_i + right], d_i = i + len_k - len_q).
    const int64_t shift = seq.len_k - seq.len_q;
    const int64_t first_diag = q0 + shift;
    const int64_t last_diag = q0 + nq - 1 + shift;
    const int64_t left = p_.window_left;
    const int64_t right = right_bound();
    const int64_t j_begin = left >= 0 ? std::max<int64_t>(0, first_diag - left) : 0;
    const int64_t j_end = right >= 0 ? std::min(seq.len_k, last_diag + right + 1) : seq.len_k;
    for (int64_t j0 = j_begin; j0 < j_end; j0 += kKeysPerTile) {
      const int64_t nk = std::min(kKeysPerTile, j_end - j0);
      load_keys(b, hk, j0, nk);
      scores(rows, nk);
      softmax_update(b, seq, hk, q0, nq, j0, nk);
    }
    store(b, seq, hk, q0, nq);
  }

 private:
  int64_t right_bound() const {
    int64_t right = p_.window_right;
    if (p_.causal) right = right < 0 ? 0 : std::min<int64_t>(right, 0);
    return right;
  }

  // K tile transposed ([head_dim][kKeysPerTile]) and V tile ([kKeysPerTile][head_dim]), fp32.
  void load_keys(int64_t b, int64_t hk, int64_t j0, int64_t nk) {
    const T* k = static_cast<const T*>(p_.k);
    const T* v = static_cast<const T*>(p_.v);
    for (int64_t jj = 0; jj < nk; ++jj) {
      const RowOffsets off = key_row(p_, b, j0 + jj);
      const T* krow = k + off.k + hk * p_.k_head_stride;
      const T* vrow = v + off.v + hk * p_.v_head_stride;
      to_float(w_.row.data(), krow, d_);
      for (int64_t c = 0; c < d_; ++c) w_.kt[c * kKeysPerTile + jj] = w_.row[c];
      to_float(w_.v.data() + jj * d_, vrow, d_);
    }
  }

  // s[r][jj] = <q_r, k_jj> (unscaled).
  void scores(int64_t rows, int64_t nk) {
    loops_.qk(w_.q.data(), rows, d_, w_.kt.data(), nk, w_.s.data());
  }

  void softmax_update(int64_t b, const Seq& seq, int64_t hk, int64_t q0, int64_t nq, int64_t j0,
                      int64_t nk) {
    const A scale = p_.softmax_scale;
    const A cap = p_.softcap;
    const int64_t left = p_.window_left;
    const int64_t right = right_bound();
    const int64_t shift = seq.len_k - seq.len_q;
    for (int64_t qi = 0; qi < nq; ++qi) {
      const int64_t diag = q0 + qi + shift;
      // Visible keys of this row within the tile: [lo, hi) relative to j0.
      const int64_t lo = std::max<int64_t>(0, (left >= 0 ? diag - left : 0) - j0);
      const int64_t hi = std::min<int64_t>(nk, (right >= 0 ? diag + right + 1 : seq.len_k) - j0);
      for (int64_t g = 0; g < group_; ++g) {
        const int64_t r = qi * group_ + g;
        if (lo >= hi) continue;  // no visible key of this row in this tile
        A* srow = w_.s.data() + r * kKeysPerTile;
        A slope = 0;
        if (p_.alibi_slopes != nullptr) {
          slope = p_.alibi_slopes[b * p_.alibi_batch_stride + hk * group_ + g];
        }
        A tile_max = kNegInfA;
        for (int64_t jj = lo; jj < hi; ++jj) {
          A s = srow[jj] * scale;
          if (cap > 0) s = cap * std::tanh(s / cap);
          if (slope != 0) {
            s -= slope * static_cast<A>(std::llabs(diag - (j0 + jj)));
          }
          srow[jj] = s;
          tile_max = std::max(tile_max, s);
        }
        const A m_old = w_.m[r];
        const A m_new = std::max(m_old, tile_max);
        // std::max drops NaN scores: a row whose scores so far are all NaN (a NaN in q) or -inf keeps
        // max -inf and exponentiates against 0 instead, so that NaN reaches l and O (and -inf - -inf
        // never appears).
        const A m_use = m_new == kNegInfA ? A(0) : m_new;
        const A correction = m_old == kNegInfA ? A(0) : std::exp(m_old - m_new);
        A sum = 0;
        for (int64_t jj = lo; jj < hi; ++jj) {
          const A e = std::exp(srow[jj] - m_use);
          srow[jj] = e;
          sum += e;
        }
        w_.m[r] = m_new;
        w_.l[r] = w_.l[r] * correction + sum;
        loops_.pv(w_.o.data() + r * d_, correction, srow, lo, hi, w_.v.data(), d_);
      }
    }
  }

  void store(int64_t b, const Seq& seq, int64_t hk, int64_t q0, int64_t nq) {
    T* out = static_cast<T*>(p_.out);
    const int64_t out_batch = p_.cu_seqlens_q != nullptr ? 0 : b * p_.out_batch_stride;
    const int64_t lse_batch = p_.cu_seqlens_q != nullptr ? 0 : b * p_.lse_batch_stride;
    for (int64_t qi = 0; qi < nq; ++qi) {
      const int64_t row = seq.q_row0 + q0 + qi;
      for (int64_t g = 0; g < group_; ++g) {
        const int64_t r = qi * group_ + g;
        const int64_t h = hk * group_ + g;
        T* dst = out + out_batch + row * p_.out_row_stride + h * p_.out_head_stride;
        const A l = w_.l[r];
        const A* orow = w_.o.data() + r * d_;
        // l = 0: no visible key (out 0, lse +inf); a NaN score or value makes l or O NaN, and NaN
        // reaches out and lse (as in PyTorch's SDPA) rather than being taken for an empty row.
        if (l != 0) {
          const A inv = 1 / l;
          for (int64_t c = 0; c < d_; ++c) dst[c] = static_cast<T>(orow[c] * inv);
        } else {
          for (int64_t c = 0; c < d_; ++c) dst[c] = static_cast<T>(0.0f);
        }
        if (p_.lse != nullptr) {
          p_.lse[lse_batch + h * p_.lse_head_stride + row] =
              l != 0 ? static_cast<float>(w_.m[r] + std::log(l)) : kPosInf;
        }
      }
    }
  }

  const AttnFwdParams& p_;
  Scratch<A>& w_;
  const InnerLoops<A>& loops_;
  const int64_t d_;
  const int64_t group_;
};

template <typename T>
void run_all(const AttnFwdParams& p) {
  const int64_t group = p.heads_q / p.heads_kv;
  const int64_t positions_per_task = std::max<int64_t>(1, kRowsPerTile / group);
  const int64_t rows_per_task = positions_per_task * group;

  // Tasks (b, query tile), each done for every kv head.
  std::vector<Seq> seqs(p.batch);
  std::vector<int64_t> first_task(p.batch + 1, 0);
  for (int64_t b = 0; b < p.batch; ++b) {
    seqs[b] = sequence(p, b);
    const int64_t tiles =
        (std::max<int64_t>(seqs[b].len_q, 0) + positions_per_task - 1) / positions_per_task;
    first_task[b + 1] = first_task[b] + tiles;
  }
  const int64_t tiles = first_task[p.batch];
  const int64_t total = tiles * p.heads_kv;
  if (total == 0) return;

  at::parallel_for(0, total, 1, [&](int64_t begin, int64_t end) {
    Scratch<Acc<T>> scratch(rows_per_task, p.head_dim);
    Task<T> task(p, scratch);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t tile = t / p.heads_kv;
      const int64_t hk = t % p.heads_kv;
      const int64_t b =
          std::upper_bound(first_task.begin(), first_task.end(), tile) - first_task.begin() - 1;
      const int64_t q0 = (tile - first_task[b]) * positions_per_task;
      const int64_t nq = std::min(positions_per_task, seqs[b].len_q - q0);
      task.run(b, seqs[b], hk, q0, nq);
    }
  });
}

void check_params(const AttnFwdParams& p) {
  TORCH_CHECK(p.dtype == DType::kFloat32 || p.dtype == DType::kFloat16 ||
                  p.dtype == DType::kBFloat16 || p.dtype == DType::kFloat64,
              "attention (CPU): unknown dtype code ", static_cast<int>(p.dtype));
  TORCH_CHECK(p.batch >= 0 && p.seqlen_q >= 0 && p.seqlen_k >= 0,
              "attention (CPU): negative batch or sequence length");
  TORCH_CHECK(p.heads_q > 0 && p.heads_kv > 0 && p.heads_q % p.heads_kv == 0,
              "attention (CPU): heads_q = ", p.heads_q,
              " must be a positive multiple of heads_kv = ", p.heads_kv);
  TORCH_CHECK(p.head_dim > 0, "attention (CPU): head_dim must be > 0, got ", p.head_dim);
  TORCH_CHECK(p.q != nullptr && p.k != nullptr && p.v != nullptr && p.out != nullptr,
              "attention (CPU): q, k, v and out must be set");
  TORCH_CHECK(p.block_table == nullptr || p.page_block_size > 0,
              "attention (CPU): a paged cache needs page_block_size > 0");
  TORCH_CHECK(p.block_table == nullptr || p.cu_seqlens_k == nullptr,
              "attention (CPU): cu_seqlens_k cannot be combined with a block table");
  TORCH_CHECK(p.leftpad_k == nullptr || (p.block_table == nullptr && p.cu_seqlens_k == nullptr),
              "attention (CPU): leftpad_k cannot be combined with a block table or cu_seqlens_k");
  TORCH_CHECK(p.softcap >= 0.0f, "attention (CPU): softcap must be >= 0, got ", p.softcap);
}

}  // namespace

int64_t attn_fwd_num_splits(const AttnFwdParams&) { return 1; }

void attn_fwd(const AttnFwdParams& p) {
  check_params(p);
  with_element_type(p.dtype, [&](auto element) { run_all<decltype(element)>(p); });
}

}  // namespace cpu
}  // namespace attention
