// Probe binding: attention::cuda::attn_bwd on dense [B, S, H, D] tensors (no checks: a probe).
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include "attention_cuda.h"

void bwd(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out, at::Tensor lse, at::Tensor dout,
         at::Tensor dq, at::Tensor dk, at::Tensor dv, double scale, bool causal, int64_t wl,
         int64_t wr, double softcap, std::optional<at::Tensor> alibi, bool deterministic) {
  attention::AttnBwdParams p;
  auto& f = p.fwd;
  f.dtype = q.scalar_type() == at::kHalf ? attention::DType::kFloat16 : attention::DType::kBFloat16;
  f.batch = q.size(0);
  f.seqlen_q = q.size(1);
  f.heads_q = q.size(2);
  f.head_dim = q.size(3);
  f.seqlen_k = k.size(1);
  f.heads_kv = k.size(2);
  f.q = q.data_ptr();
  f.q_batch_stride = q.stride(0);
  f.q_row_stride = q.stride(1);
  f.q_head_stride = q.stride(2);
  f.k = k.data_ptr();
  f.k_batch_stride = k.stride(0);
  f.k_row_stride = k.stride(1);
  f.k_head_stride = k.stride(2);
  f.v = v.data_ptr();
  f.v_batch_stride = v.stride(0);
  f.v_row_stride = v.stride(1);
  f.v_head_stride = v.stride(2);
  f.out = out.data_ptr();
  f.out_batch_stride = out.stride(0);
  f.out_row_stride = out.stride(1);
  f.out_head_stride = out.stride(2);
  f.lse = lse.data_ptr<float>();
  f.lse_batch_stride = lse.stride(0);
  f.lse_head_stride = lse.stride(1);
  f.softmax_scale = scale;
  f.softcap = softcap;
  f.causal = causal;
  f.window_left = wl;
  f.window_right = wr;
  if (alibi.has_value()) f.alibi_slopes = alibi->data_ptr<float>();
  p.dout = dout.data_ptr();
  p.dout_batch_stride = dout.stride(0);
  p.dout_row_stride = dout.stride(1);
  p.dout_head_stride = dout.stride(2);
  p.dq = dq.data_ptr();
  p.dq_batch_stride = dq.stride(0);
  p.dq_row_stride = dq.stride(1);
  p.dq_head_stride = dq.stride(2);
  p.dk = dk.data_ptr();
  p.dk_batch_stride = dk.stride(0);
  p.dk_row_stride = dk.stride(1);
  p.dk_head_stride = dk.stride(2);
  p.dv = dv.data_ptr();
  p.dv_batch_stride = dv.stride(0);
  p.dv_row_stride = dv.stride(1);
  p.dv_head_stride = dv.stride(2);
  at::Tensor dq_accum;  // deterministic = false: dQ added with atomics into it
  if (!deterministic) {
    dq_accum = at::zeros({q.size(0) * q.size(1), q.size(2), q.size(3)}, lse.options());
    p.dq_accum = dq_accum.data_ptr<float>();
  }
  auto dsum = at::empty_like(lse);
  auto err = attention::cuda::attn_bwd(p, dsum.data_ptr<float>(), q.size(0) * q.size(1),
                                       at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, cudaGetErrorString(err));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("bwd", &bwd); }
