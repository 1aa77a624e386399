// torch_binding.h: Torch-facing launchers of the attention ops (defined in attention_ops.cpp,
// registered in torch_binding.cpp). Semantics: kernel_src/attention_params.h (the attention
// forward) and kernel_src/cache_params.h (the KV-cache writers); validation rules:
// attention_ops.cpp.
//
// B = batch, Sq / Sk = query / key lengths, Hq / Hkv = query / kv heads (Hkv divides Hq), D =
// head_dim (CUDA: 32, 64, 96, 128, 192, 256; CPU: any). q/k/v/out: float16 or bfloat16 (CUDA),
// float32 too (CPU), unit stride along D, any other strides. Index tensors: int32, contiguous.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/Generator.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

// The general forward (every option of AttnFwdParams), out-param. Layouts:
//   q:   [B, Sq, Hq, D], or [total_q, Hq, D] with cu_seqlens_q [B + 1]
//   k/v: [B_k, Sk, Hkv, D] (B_k = B, or any with kv_batch_idx), or [total_k, Hkv, D] with
//        cu_seqlens_k [B + 1], or a paged cache [num_blocks, block_size, Hkv, D] with
//        block_table [B, max_blocks] (then key lengths come from seqused_k, else
//        max_blocks * block_size)
//   out: q's shape; lse (optional, float32): [B, Hq, Sq], or [Hq, total_q] with cu_seqlens_q
// max_seqlen_q / max_seqlen_k: the longest sequence of cu_seqlens_q / cu_seqlens_k (ignored
// without them). window < 0: unbounded side; causal = window (left, 0), bottom-right aligned.
// num_splits: split-KV count, 0 = the backend's choice (CPU: always 1).
void attn_fwd(at::Tensor& out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
              const std::optional<at::Tensor>& lse,
              const std::optional<at::Tensor>& cu_seqlens_q,  // [B + 1] int32
              const std::optional<at::Tensor>& cu_seqlens_k,  // [B + 1] int32
              const std::optional<at::Tensor>& seqused_k,     // [B] int32
              const std::optional<at::Tensor>& block_table,   // [B, max_blocks] int32
              const std::optional<at::Tensor>& kv_batch_idx,  // [B] int32
              const std::optional<at::Tensor>& leftpad_k,     // [B] int32
              const std::optional<at::Tensor>& alibi_slopes,  // [Hq] or [B, Hq] float32
              int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, double softcap,
              bool causal, int64_t window_left, int64_t window_right, int64_t num_splits,
              std::optional<bool> enable_pdl);

// The backward of attn_fwd (kernel_src/attention_params.h, AttnBwdParams): dq, dk, dv (shapes of
// q, k, v, written in full) from dout (out's shape), the forward's out and lse, and the forward's
// options; dense or varlen (cu_seqlens_q / _k), no paged cache. On CUDA head_dim is at most
// attn_bwd_max_head_dim() (256, or 128 on 99 KB GPUs; NotImplementedError past it), and
// deterministic = false adds dQ with fp32 atomics
// into a workspace of [q_rows, heads_q, head_dim] (fewer FLOPs; dq may differ in its last bits
// from run to run, dk and dv do not), true computes it in a pass of its own (the same bits on
// every run). The CPU backward is deterministic either way.
void attn_bwd(at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, const at::Tensor& dout,
              const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
              const at::Tensor& lse,
              const std::optional<at::Tensor>& cu_seqlens_q,  // [B + 1] int32
              const std::optional<at::Tensor>& cu_seqlens_k,  // [B + 1] int32
              const std::optional<at::Tensor>& alibi_slopes,  // [Hq] or [B, Hq] float32
              int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, double softcap,
              bool causal, int64_t window_left, int64_t window_right, bool deterministic);

// flash-attn's mha_bwd / mha_varlen_bwd over attn_bwd: dq, dk, dv (into the given tensors, else
// new ones) and softmax_d = rowsum(dout * out) (float32, laid out as softmax_lse); returns
// (dq, dk, dv, softmax_d) (a tuple, as for the forwards). deterministic as for attn_bwd;
// p_dropout > 0 raises NotImplementedError, so gen and rng_state have nothing to act on.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> bwd(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& softmax_lse, const std::optional<at::Tensor>& dq,
    const std::optional<at::Tensor>& dk, const std::optional<at::Tensor>& dv,
    const std::optional<at::Tensor>& alibi_slopes, double p_dropout, double softmax_scale,
    bool is_causal, int64_t window_size_left, int64_t window_size_right, double softcap,
    bool deterministic, const std::optional<at::Generator>& gen,
    const std::optional<at::Tensor>& rng_state);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> varlen_bwd(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& softmax_lse, const std::optional<at::Tensor>& dq,
    const std::optional<at::Tensor>& dk, const std::optional<at::Tensor>& dv,
    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
    const std::optional<at::Tensor>& alibi_slopes, int64_t max_seqlen_q, int64_t max_seqlen_k,
    double p_dropout, double softmax_scale, bool zero_tensors, bool is_causal,
    int64_t window_size_left, int64_t window_size_right, double softcap, bool deterministic,
    const std::optional<at::Generator>& gen, const std::optional<at::Tensor>& rng_state);

// flash-attn's mha_fwd: q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D]. Returns (out, softmax_lse
// [B, Hq, Sq]) (out is `out` when given). p_dropout > 0 and return_softmax raise
// NotImplementedError (forward without dropout only).
std::tuple<at::Tensor, at::Tensor> fwd(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const std::optional<at::Tensor>& out,
                                       const std::optional<at::Tensor>& alibi_slopes,
                                       double p_dropout, double softmax_scale, bool is_causal,
                                       int64_t window_size_left, int64_t window_size_right,
                                       double softcap, bool return_softmax,
                                       const std::optional<at::Generator>& gen,
                                       std::optional<bool> enable_pdl);

// flash-attn's mha_varlen_fwd: q [total_q, Hq, D], k/v [total_k, Hkv, D] (or a paged cache with
// block_table: key lengths from seqused_k, else from cu_seqlens_k). Returns (out, softmax_lse
// [Hq, total_q]). zero_tensors: out zeroed and softmax_lse set to -inf first (rows outside every
// sequence keep those values).
std::tuple<at::Tensor, at::Tensor> varlen_fwd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& out, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, const std::optional<at::Tensor>& seqused_k,
    const std::optional<at::Tensor>& leftpad_k, const std::optional<at::Tensor>& block_table,
    const std::optional<at::Tensor>& alibi_slopes, int64_t max_seqlen_q, int64_t max_seqlen_k,
    double p_dropout, double softmax_scale, bool zero_tensors, bool is_causal,
    int64_t window_size_left, int64_t window_size_right, double softcap, bool return_softmax,
    const std::optional<at::Generator>& gen, std::optional<bool> enable_pdl);

// flash-attn's mha_fwd_kvcache: q [B, Sq, Hq, D]; k_cache/v_cache [B_cache, S_cache, Hkv, D] or
// paged [num_blocks, block_size, Hkv, D] with block_table [B, max_blocks]. New k/v [B, S_new,
// Hkv, D] (optional) are written into the caches at rows cache_seqlens[b] + i (rotated with
// rotary_cos/sin [rows, rotary_dim / 2] if given; q then too), and q attends to the keys
// [cache_leftpad[b], cache_seqlens[b] + S_new) of its cache. Returns (out, softmax_lse [B, Hq, Sq]).
std::tuple<at::Tensor, at::Tensor> fwd_kvcache(
    const at::Tensor& q, at::Tensor& k_cache, at::Tensor& v_cache,
    const std::optional<at::Tensor>& k, const std::optional<at::Tensor>& v,
    const std::optional<at::Tensor>& cache_seqlens,  // [B] int32
    const std::optional<at::Tensor>& rotary_cos, const std::optional<at::Tensor>& rotary_sin,
    const std::optional<at::Tensor>& cache_batch_idx,  // [B] int32
    const std::optional<at::Tensor>& cache_leftpad,    // [B] int32
    const std::optional<at::Tensor>& block_table,      // [B, max_blocks]
    const std::optional<at::Tensor>& alibi_slopes, const std::optional<at::Tensor>& out,
    double softmax_scale, bool is_causal, int64_t window_size_left, int64_t window_size_right,
    double softcap, bool rotary_interleaved, int64_t num_splits, std::optional<bool> enable_pdl);

// vLLM reshape_and_cache: key/value [T, H, D] (T >= slot_mapping.size(0)); key_cache
// [num_blocks, H, D / x, block_size, x], value_cache [num_blocks, H, D, block_size]; token t goes
// to slot slot_mapping[t] (int64 or int32; -1 skips). kv_cache_dtype "auto" only (the caches have
// key's dtype); k_scale / v_scale are accepted and unused with "auto".
void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                       at::Tensor& value_cache, const at::Tensor& slot_mapping,
                       const std::string& kv_cache_dtype, const std::optional<at::Tensor>& k_scale,
                       const std::optional<at::Tensor>& v_scale);

// vLLM reshape_and_cache_flash: as reshape_and_cache with both caches [num_blocks, block_size, H,
// D] (any strides, unit stride along D).
void reshape_and_cache_flash(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                             at::Tensor& value_cache, const at::Tensor& slot_mapping,
                             const std::string& kv_cache_dtype,
                             const std::optional<at::Tensor>& k_scale,
                             const std::optional<at::Tensor>& v_scale);
// Synchronizes CUDA device `device` and raises the error its kernels reported since the last
// check, if any (an index value out of range: attention_ops.cpp, kernel_src/device_errors.h);
// clears it. Nothing to do in a CPU build, whose checks raise at once.
void check_kvcache_errors(int64_t device);
