// probe_params.h: the AttnBwdParams of dense [B, S, H, D] tensors (lse [B, H, S]) for the probe
// bindings; no checks (probes pass what they built).
#pragma once

#include <torch/extension.h>

#include "attention_params.h"

inline attention::AttnBwdParams dense_bwd_params(const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, const at::Tensor& out,
                                                 const at::Tensor& lse, const at::Tensor& dout,
                                                 const at::Tensor& dq, const at::Tensor& dk,
                                                 const at::Tensor& dv, double scale, bool causal) {
  attention::AttnBwdParams p;
  auto& f = p.fwd;
  f.dtype = q.scalar_type() == at::kHalf ? attention::DType::kFloat16 : attention::DType::kBFloat16;
  f.batch = q.size(0);
  f.seqlen_q = q.size(1);
  f.heads_q = q.size(2);
  f.head_dim = q.size(3);
  f.seqlen_k = k.size(1);
  f.heads_kv = k.size(2);
  const auto set = [](const at::Tensor& t, auto& ptr, int64_t& batch, int64_t& row, int64_t& head) {
    ptr = t.data_ptr();
    batch = t.stride(0);
    row = t.stride(1);
    head = t.stride(2);
  };
  set(q, f.q, f.q_batch_stride, f.q_row_stride, f.q_head_stride);
  set(k, f.k, f.k_batch_stride, f.k_row_stride, f.k_head_stride);
  set(v, f.v, f.v_batch_stride, f.v_row_stride, f.v_head_stride);
  set(out, f.out, f.out_batch_stride, f.out_row_stride, f.out_head_stride);
  set(dout, p.dout, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride);
  set(dq, p.dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  set(dk, p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  set(dv, p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  f.lse = lse.data_ptr<float>();
  f.lse_batch_stride = lse.stride(0);
  f.lse_head_stride = lse.stride(1);
  f.softmax_scale = scale;
  f.causal = causal;
  if (causal) f.window_right = 0;
  return p;
}
