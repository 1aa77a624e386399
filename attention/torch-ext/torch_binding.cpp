// torch_binding.cpp: op schemas and device implementations of the attention kernel.
//
// attn_fwd is the general out-param forward behind the Python API (flash-attn 2 functions,
// transformers / diffusers entry points); fwd, varlen_fwd and fwd_kvcache are flash-attn's
// low-level C++ entry points (mha_fwd, mha_varlen_fwd, mha_fwd_kvcache) returning (out,
// softmax_lse) (a tuple, not flash-attn's Tensor[]: a list return cannot be functionalized next
// to mutated arguments, so it would not trace), and bwd / varlen_bwd (mha_bwd, mha_varlen_bwd:
// (dq, dk, dv, softmax_d)); reshape_and_cache(_flash) are vLLM's KV-cache writers. Launchers:
// torch_binding.h; semantics: kernel_src/attention_params.h and kernel_src/cache_params.h.
// The four forward ops end in `bool? enable_pdl=None`: programmatic dependent launch on CUDA
// (None: the kernels' default, on for both; False: off; ignored on CPU; pdl_request.h).
#include <torch/library.h>

#include "registration.h"
#include "torch_binding.h"

#if defined(CUDA_KERNEL)
#define ATTN_IMPL(name) ops.impl(#name, c10::kCUDA, &name)
#elif defined(CPU_KERNEL)
#define ATTN_IMPL(name) ops.impl(#name, c10::kCPU, &name)
#else
#error "attention: compile with -DCPU_KERNEL or -DCUDA_KERNEL"
#endif

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def(
      "attn_fwd(Tensor(a!) out, Tensor q, Tensor k, Tensor v, Tensor(b!)? lse, Tensor? "
      "cu_seqlens_q, "
      "Tensor? cu_seqlens_k, Tensor? seqused_k, Tensor? block_table, Tensor? kv_batch_idx, "
      "Tensor? leftpad_k, Tensor? alibi_slopes, int max_seqlen_q, int max_seqlen_k, float "
      "softmax_scale, "
      "float softcap, bool causal, int window_left, int window_right, int num_splits, "
      "bool? enable_pdl=None) -> ()");
  ATTN_IMPL(attn_fwd);
  ops.def(
      "attn_bwd(Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, Tensor dout, Tensor q, Tensor k, "
      "Tensor v, Tensor out, Tensor lse, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
      "Tensor? alibi_slopes, int max_seqlen_q, int max_seqlen_k, float softmax_scale, "
      "float softcap, bool causal, int window_left, int window_right, bool deterministic) -> ()");
  ATTN_IMPL(attn_bwd);

  // flash-attn 2 C++ API (flash_api.cpp).
  ops.def(
      "fwd(Tensor q, Tensor k, Tensor v, Tensor(a!)? out, Tensor? alibi_slopes, float p_dropout, "
      "float softmax_scale, bool is_causal, int window_size_left, int window_size_right, float "
      "softcap, "
      "bool return_softmax, Generator? gen, bool? enable_pdl=None) -> (Tensor, Tensor)");
  ATTN_IMPL(fwd);
  ops.def(
      "varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!)? out, Tensor cu_seqlens_q, Tensor "
      "cu_seqlens_k, "
      "Tensor? seqused_k, Tensor? leftpad_k, Tensor? block_table, Tensor? alibi_slopes, int "
      "max_seqlen_q, "
      "int max_seqlen_k, float p_dropout, float softmax_scale, bool zero_tensors, bool is_causal, "
      "int window_size_left, int window_size_right, float softcap, bool return_softmax, Generator? "
      "gen, "
      "bool? enable_pdl=None) -> (Tensor, Tensor)");
  ATTN_IMPL(varlen_fwd);
  ops.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
      "Tensor(a!)? dq, Tensor(b!)? dk, Tensor(c!)? dv, Tensor? alibi_slopes, float p_dropout, "
      "float softmax_scale, bool is_causal, int window_size_left, int window_size_right, "
      "float softcap, bool deterministic, Generator? gen, Tensor? rng_state) -> (Tensor, Tensor, "
      "Tensor, Tensor)");
  ATTN_IMPL(bwd);
  ops.def(
      "varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
      "Tensor(a!)? dq, Tensor(b!)? dk, Tensor(c!)? dv, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
      "Tensor? alibi_slopes, int max_seqlen_q, int max_seqlen_k, float p_dropout, "
      "float softmax_scale, bool zero_tensors, bool is_causal, int window_size_left, "
      "int window_size_right, float softcap, bool deterministic, Generator? gen, "
      "Tensor? rng_state) -> (Tensor, Tensor, Tensor, Tensor)");
  ATTN_IMPL(varlen_bwd);
  ops.def(
      "fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v, "
      "Tensor? cache_seqlens, Tensor? rotary_cos, Tensor? rotary_sin, Tensor? cache_batch_idx, "
      "Tensor? cache_leftpad, Tensor? block_table, Tensor? alibi_slopes, Tensor(c!)? out, "
      "float softmax_scale, bool is_causal, int window_size_left, int window_size_right, float "
      "softcap, "
      "bool rotary_interleaved, int num_splits, bool? enable_pdl=None) -> (Tensor, Tensor)");
  ATTN_IMPL(fwd_kvcache);

  // vLLM KV-cache writers (csrc/cache_kernels.cu names and argument order).
  ops.def(
      "reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
      "Tensor slot_mapping, str kv_cache_dtype, Tensor? k_scale, Tensor? v_scale) -> ()");
  ATTN_IMPL(reshape_and_cache);
  ops.def(
      "reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) "
      "value_cache, "
      "Tensor slot_mapping, str kv_cache_dtype, Tensor? k_scale, Tensor? v_scale) -> ()");
  ATTN_IMPL(reshape_and_cache_flash);

  // Raises the index error a CUDA kernel of this device reported (no tensor argument: one kernel
  // for every dispatch key).
  ops.def("check_kvcache_errors(int device) -> ()", &check_kvcache_errors);
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
