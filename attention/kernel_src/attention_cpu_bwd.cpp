// attention_cpu_bwd.cpp: the attention backward on the CPU (attention_cpu.h, attn_bwd): the
// gradients of attention_params.h's forward, evaluated directly in float32 (float64 for float64
// tensors, whose gradients tests check numerically), for the CPU users and the CI that train with
// it. lse is float32 either way (its dtype in every form of the forward).
//
// One task per (sequence, kv head) owns dK and dV of its keys and dQ of the query heads of its
// group. For query row i of head h, with D_i = <dO_i, O_i> and, per visible key j, s the scaled
// score, z = softcap * tanh(s / softcap) (or s) and the logit l = z + alibi:
//   p = exp(l - lse_i);  dV_j += p dO_i;  dl = p (<dO_i, V_j> - D_i);  ds = dl dz/ds;
//   dQ_i += scale ds K_j;  dK_j += scale ds Q_i;
// dz/ds = 1 - tanh^2 with softcap, else 1. A row with no visible key (lse = +inf) has p = 0:
// dQ_i = 0 and nothing added.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <vector>

#include "attention_cpu.h"
#include "attention_cpu_types.h"

namespace attention {
namespace cpu {
namespace {

template <typename A>
A dot(const A* a, const A* b, int64_t n) {
  A s = 0;
  for (int64_t c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

template <typename A>
void axpy(A* y, A alpha, const A* x, int64_t n) {
  for (int64_t c = 0; c < n; ++c) y[c] += alpha * x[c];
}

template <typename T>
void load_row(Acc<T>* dst, const void* base, int64_t offset, int64_t n) {
  const T* src = static_cast<const T*>(base) + offset;
  for (int64_t c = 0; c < n; ++c) dst[c] = static_cast<Acc<T>>(src[c]);
}

template <typename T>
void store_row(void* base, int64_t offset, const Acc<T>* src, int64_t n) {
  T* dst = static_cast<T*>(base) + offset;
  for (int64_t c = 0; c < n; ++c) dst[c] = static_cast<T>(src[c]);
}

// Rows of sequence b: first q row and length, first k row and length (dense: rows of batch b).
struct BwdSeq {
  int64_t q_row0 = 0, len_q = 0, k_row0 = 0, len_k = 0;
};

BwdSeq bwd_sequence(const AttnFwdParams& f, int64_t b) {
  BwdSeq s;
  s.len_q = f.seqlen_q;
  s.len_k = f.seqlen_k;
  if (f.cu_seqlens_q != nullptr) {
    s.q_row0 = f.cu_seqlens_q[b];
    s.len_q = static_cast<int64_t>(f.cu_seqlens_q[b + 1]) - f.cu_seqlens_q[b];
  }
  if (f.cu_seqlens_k != nullptr) {
    s.k_row0 = f.cu_seqlens_k[b];
    s.len_k = static_cast<int64_t>(f.cu_seqlens_k[b + 1]) - f.cu_seqlens_k[b];
  }
  return s;
}

template <typename T>
class BwdTask {
  using A = Acc<T>;

 public:
  explicit BwdTask(const AttnBwdParams& p)
      : p_(p), f_(p.fwd), d_(f_.head_dim), group_(f_.heads_q / f_.heads_kv) {}

  void run(int64_t b, int64_t hk) {
    const BwdSeq seq = bwd_sequence(f_, b);
    const int64_t nk = seq.len_k;
    k_.assign(nk * d_, A(0));
    v_.assign(nk * d_, A(0));
    dk_.assign(nk * d_, A(0));
    dv_.assign(nk * d_, A(0));
    const bool varlen_q = f_.cu_seqlens_q != nullptr, varlen_k = f_.cu_seqlens_k != nullptr;
    for (int64_t j = 0; j < nk; ++j) {
      load_row<T>(k_.data() + j * d_, f_.k,
                  key_offset(b, seq, j, f_.k_batch_stride, f_.k_row_stride, f_.k_head_stride, hk),
                  d_);
      load_row<T>(v_.data() + j * d_, f_.v,
                  key_offset(b, seq, j, f_.v_batch_stride, f_.v_row_stride, f_.v_head_stride, hk),
                  d_);
    }
    q_.resize(d_);
    o_.resize(d_);
    do_.resize(d_);
    dq_.resize(d_);
    const int64_t shift = seq.len_k - seq.len_q;
    const int64_t left = f_.window_left;
    int64_t right = f_.window_right;
    if (f_.causal) right = right < 0 ? 0 : std::min<int64_t>(right, 0);
    for (int64_t g = 0; g < group_; ++g) {
      const int64_t h = hk * group_ + g;
      const A slope =
          f_.alibi_slopes != nullptr ? A(f_.alibi_slopes[b * f_.alibi_batch_stride + h]) : A(0);
      for (int64_t i = 0; i < seq.len_q; ++i) {
        const int64_t row = seq.q_row0 + i;
        const int64_t qb = varlen_q ? 0 : b;
        load_row<T>(q_.data(), f_.q,
                    qb * f_.q_batch_stride + row * f_.q_row_stride + h * f_.q_head_stride, d_);
        load_row<T>(o_.data(), f_.out,
                    qb * f_.out_batch_stride + row * f_.out_row_stride + h * f_.out_head_stride,
                    d_);
        load_row<T>(do_.data(), p_.dout,
                    qb * p_.dout_batch_stride + row * p_.dout_row_stride + h * p_.dout_head_stride,
                    d_);
        std::fill(dq_.begin(), dq_.end(), A(0));
        const A lse = f_.lse[qb * f_.lse_batch_stride + h * f_.lse_head_stride + row];
        const int64_t diag = i + shift;
        const int64_t lo = left >= 0 ? std::max<int64_t>(0, diag - left) : 0;
        const int64_t hi = right >= 0 ? std::min<int64_t>(nk, diag + right + 1) : nk;
        if (lse != std::numeric_limits<A>::infinity()) {
          accumulate_row(lo, hi, diag, lse, slope);
        }
        store_row<T>(p_.dq,
                     qb * p_.dq_batch_stride + row * p_.dq_row_stride + h * p_.dq_head_stride,
                     dq_.data(), d_);
      }
    }
    for (int64_t j = 0; j < nk; ++j) {
      const int64_t kb = varlen_k ? 0 : b;
      const int64_t krow = seq.k_row0 + j;
      store_row<T>(p_.dk,
                   kb * p_.dk_batch_stride + krow * p_.dk_row_stride + hk * p_.dk_head_stride,
                   dk_.data() + j * d_, d_);
      store_row<T>(p_.dv,
                   kb * p_.dv_batch_stride + krow * p_.dv_row_stride + hk * p_.dv_head_stride,
                   dv_.data() + j * d_, d_);
    }
  }

 private:
  int64_t key_offset(int64_t b, const BwdSeq& seq, int64_t j, int64_t batch_stride,
                     int64_t row_stride, int64_t head_stride, int64_t hk) const {
    const int64_t kb = f_.cu_seqlens_k != nullptr ? 0 : b;
    return kb * batch_stride + (seq.k_row0 + j) * row_stride + hk * head_stride;
  }

  // The terms of query row (q_, o_, do_) over its visible keys [lo, hi): dq_, dk_, dv_.
  void accumulate_row(int64_t lo, int64_t hi, int64_t diag, A lse, A slope) {
    const A scale = f_.softmax_scale, cap = f_.softcap;
    const A d_i = dot(do_.data(), o_.data(), d_);
    for (int64_t j = lo; j < hi; ++j) {
      const A* kj = k_.data() + j * d_;
      A s = scale * dot(q_.data(), kj, d_);
      A dz_ds = 1;
      if (cap > 0) {
        const A t = std::tanh(s / cap);
        s = cap * t;
        dz_ds = 1 - t * t;
      }
      if (slope != 0) s -= slope * static_cast<A>(std::llabs(diag - j));
      const A prob = std::exp(s - lse);
      axpy(dv_.data() + j * d_, prob, do_.data(), d_);
      const A dl = prob * (dot(do_.data(), v_.data() + j * d_, d_) - d_i);
      const A ds = scale * dl * dz_ds;
      axpy(dq_.data(), ds, kj, d_);
      axpy(dk_.data() + j * d_, ds, q_.data(), d_);
    }
  }

  const AttnBwdParams& p_;
  const AttnFwdParams& f_;
  const int64_t d_, group_;
  std::vector<A> k_, v_, dk_, dv_, q_, o_, do_, dq_;
};

template <typename T>
void run_bwd(const AttnBwdParams& p) {
  const int64_t tasks = p.fwd.batch * p.fwd.heads_kv;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    BwdTask<T> task(p);
    for (int64_t t = begin; t < end; ++t) task.run(t / p.fwd.heads_kv, t % p.fwd.heads_kv);
  });
}

}  // namespace

void attn_bwd(const AttnBwdParams& p) {
  const AttnFwdParams& f = p.fwd;
  TORCH_CHECK(f.heads_q > 0 && f.heads_kv > 0 && f.heads_q % f.heads_kv == 0 && f.head_dim > 0,
              "attention (CPU): bad head counts or head_dim");
  TORCH_CHECK(f.lse != nullptr && p.dout != nullptr && p.dq != nullptr && p.dk != nullptr &&
                  p.dv != nullptr,
              "attention (CPU): the backward needs lse, dout, dq, dk and dv");
  TORCH_CHECK(f.block_table == nullptr && f.seqused_k == nullptr && f.kv_batch_idx == nullptr &&
                  f.leftpad_k == nullptr,
              "attention (CPU): the backward takes no paged cache, seqused_k, kv_batch_idx or "
              "leftpad_k");
  with_element_type(f.dtype, [&](auto element) { run_bwd<decltype(element)>(p); });
}

}  // namespace cpu
}  // namespace attention
