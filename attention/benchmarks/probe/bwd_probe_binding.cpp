// Probe binding: attention::cuda::attn_bwd on dense [B, S, H, D] tensors (no checks: a probe).
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include "attention_cuda.h"
#include "probe_params.h"

void bwd(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out, at::Tensor lse, at::Tensor dout,
         at::Tensor dq, at::Tensor dk, at::Tensor dv, double scale, bool causal, int64_t wl,
         int64_t wr, double softcap, std::optional<at::Tensor> alibi, bool deterministic) {
  attention::AttnBwdParams p = dense_bwd_params(q, k, v, out, lse, dout, dq, dk, dv, scale, causal);
  auto& f = p.fwd;
  f.softcap = softcap;
  f.window_left = wl;
  f.window_right = wr;
  if (alibi.has_value()) f.alibi_slopes = alibi->data_ptr<float>();
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
