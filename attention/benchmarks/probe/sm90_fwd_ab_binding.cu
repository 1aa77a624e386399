// Probe binding: one instance of the Hopper attention forward (attention_sm90_fwd.cuh, bf16, head
// dim PROBE_HEAD_DIM) on dense [B, S, H, D] tensors, launched through run_fwd with no checks (a
// probe). Built once per copy of kernel_src by sm90_fwd_ab.py; PROBE_PLAIN_ARGS sets the
// FwdArgs fields that copies since 2933ab8 have (no window, modifier or varlen), and
// PROBE_PLAIN_KERNEL launches the plain kernel of a copy with a kGeneral template flag.
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <cmath>

#include "attention_sm90_fwd.cuh"

using Kernel = attention::sm90::FwdKernelFor<cutlass::bfloat16_t, PROBE_HEAD_DIM>;

void fwd(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out, at::Tensor lse, bool causal,
         at::Tensor tile_counter) {
  attention::sm90::FwdArgs a{};
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  a.out = out.data_ptr();
  a.lse = lse.data_ptr<float>();
  a.lse_batch = lse.stride(0);
  a.lse_head = lse.stride(1);
  a.batch = q.size(0);
  a.seqlen_q = q.size(1);
  a.heads_q = q.size(2);
  a.head_dim = q.size(3);
  a.seqlen_k = k.size(1);
  a.heads_kv = k.size(2);
  a.q_batch = q.stride(0);
  a.q_row = q.stride(1);
  a.q_head = q.stride(2);
  a.k_batch = k.stride(0);
  a.k_row = k.stride(1);
  a.k_head = k.stride(2);
  a.v_batch = v.stride(0);
  a.v_row = v.stride(1);
  a.v_head = v.stride(2);
  a.o_batch = out.stride(0);
  a.o_row = out.stride(1);
  a.o_head = out.stride(2);
  a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(q.size(3)));
  a.causal = causal;
  a.tile_group = 1;
#ifdef PROBE_PLAIN_ARGS
  a.window_left = -1;
  a.window_right = causal ? 0 : -1;
  a.softcap = 0.0f;
  a.alibi = nullptr;
  a.cu_seqlens_q = nullptr;
  a.cu_seqlens_k = nullptr;
#endif
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  if (causal) {
    TORCH_CHECK(cudaMemsetAsync(tile_counter.data_ptr(), 0, sizeof(int), stream) == cudaSuccess);
    a.tile_counter = tile_counter.data_ptr<int>();
  }
  int device = 0, sms = 0;
  TORCH_CHECK(cudaGetDevice(&device) == cudaSuccess);
  TORCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess);
#ifdef PROBE_PLAIN_KERNEL
  // A copy whose kernel takes <Kernel, kGeneral>: its plain kernel alone (run_fwd would also
  // compile the general one, doubling the build).
  const int64_t tiles =
      int64_t((a.seqlen_q + Kernel::kBlockM - 1) / Kernel::kBlockM) * a.heads_q * a.batch;
  const auto params = Kernel::make_params(a);
  auto* kernel = attention::sm90::attn_fwd_sm90_kernel<Kernel, false>;
  TORCH_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   Kernel::kSmemBytes) == cudaSuccess);
  const unsigned grid = static_cast<unsigned>(tiles < sms ? tiles : sms);
  kernel<<<grid, Kernel::kThreads, Kernel::kSmemBytes, stream>>>(params);
  const cudaError_t err = cudaGetLastError();
#else
  const cudaError_t err = attention::sm90::run_fwd<Kernel>(a, sms, stream);
#endif
  TORCH_CHECK(err == cudaSuccess, cudaGetErrorString(err));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("fwd", &fwd); }
