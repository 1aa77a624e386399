// Probe binding: attention::cuda::sm90::bwd on dense [B, S, H, D] tensors (no checks: a probe).
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include "attention_sm90.h"
#include "probe_params.h"

bool bwd(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out, at::Tensor lse, at::Tensor dout,
         at::Tensor dq, at::Tensor dk, at::Tensor dv, double scale, bool causal) {
  const attention::AttnBwdParams p =
      dense_bwd_params(q, k, v, out, lse, dout, dq, dk, dv, scale, causal);
  if (!attention::cuda::sm90::bwd_supports(p)) return false;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  auto ws = at::empty({attention::cuda::sm90::bwd_workspace_floats(p, sms)}, lse.options());
  auto err =
      attention::cuda::sm90::bwd(p, sms, ws.data_ptr<float>(), at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, cudaGetErrorString(err));
  return true;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("bwd", &bwd); }
