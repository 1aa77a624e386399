// torch_binding.h: Torch-facing launchers of the rope ops (defined in rope_ops.cpp, registered in
// torch_binding.cpp). Semantics: kernel_src/rope_params.h; validation rules: rope_ops.cpp.
//
// D = head_size (head_dim), rot = rot_dim (even, <= D). q/k and the general forms' outputs need
// unit stride along D; heads and tokens may be at any stride (views of a fused qkv tensor).
// float32, float16, bfloat16; tables float32 or the activation dtype. enable_pdl (every op):
// programmatic dependent launch on CUDA (nullopt: each launch's default; pdl_request.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

// vLLM, in place. query/key: [T, H * D], [T, H, D] (positions [T]) or [B, S, H * D],
// [B, S, H, D] (positions [B, S]); key has its own head count H or is None.
void rotary_embedding(const at::Tensor& positions,           // [T] or [B, S], int64/int32
                      at::Tensor& query,                     // [T|B,S, Hq * D | Hq, D]
                      const std::optional<at::Tensor>& key,  // [T|B,S, Hk * D | Hk, D]
                      int64_t head_size,                     // D
                      const at::Tensor& cos_sin_cache,       // [max_pos, rot] = cat(cos, sin)
                      bool is_neox, std::optional<bool> enable_pdl);

// vLLM, in place, table row = positions + cos_sin_cache_offsets (one offset per token).
void batched_rotary_embedding(const at::Tensor& positions,           // [T] or [B, S]
                              at::Tensor& query,                     // as rotary_embedding
                              const std::optional<at::Tensor>& key,  // as rotary_embedding
                              int64_t head_size,                     // D
                              const at::Tensor& cos_sin_cache,       // [max_pos, rot]
                              bool is_neox,
                              int64_t rot_dim,                          // rot
                              const at::Tensor& cos_sin_cache_offsets,  // [T] or [B, S]
                              std::optional<bool> enable_pdl);

// The general forms: every option of RopeParams. q, k: [B, S, Hq, D] and [B, S, Hk, D];
// cos, sin: [TB, R, TH, W] with TB in {1, B}, TH in {1, Hq (= Hk)}, W = rot / 2 (half table)
// or rot (full_table). Rows: positions [B, S] (int32/int64) if given, else cu_seqlens
// [num_seqs + 1] (int32, B == 1) if given, else s + seqlen_offset (+ seqlen_offsets[b]).
// seqlen_offsets: int32 [B] (or [num_seqs] with cu_seqlens).
void rope_inplace(at::Tensor& q,                                    // [B, S, Hq, D], in/out
                  const std::optional<at::Tensor>& k,               // [B, S, Hk, D], in/out
                  const at::Tensor& cos,                            // [TB, R, TH, W]
                  const at::Tensor& sin,                            // [TB, R, TH, W]
                  const std::optional<at::Tensor>& positions,       // [B, S]
                  const std::optional<at::Tensor>& seqlen_offsets,  // [B] or [num_seqs]
                  const std::optional<at::Tensor>& cu_seqlens,      // [num_seqs + 1]
                  int64_t seqlen_offset, int64_t rot_dim, bool interleaved, bool full_table,
                  bool transpose, std::optional<bool> enable_pdl);

void rope_out(at::Tensor& q_out,                                // [B, S, Hq, D]
              const at::Tensor& q,                              // [B, S, Hq, D]
              const std::optional<at::Tensor>& k_out,           // [B, S, Hk, D]
              const std::optional<at::Tensor>& k,               // [B, S, Hk, D]
              const at::Tensor& cos,                            // [TB, R, TH, W]
              const at::Tensor& sin,                            // [TB, R, TH, W]
              const std::optional<at::Tensor>& positions,       // [B, S]
              const std::optional<at::Tensor>& seqlen_offsets,  // [B] or [num_seqs]
              const std::optional<at::Tensor>& cu_seqlens,      // [num_seqs + 1]
              int64_t seqlen_offset, int64_t rot_dim, bool interleaved, bool full_table,
              bool transpose, std::optional<bool> enable_pdl);

// kernels-community `rotary`: out1 = x1 cos - x2 sin, out2 = x1 sin + x2 cos (conj: the
// transpose), cos/sin broadcast against x1 as TensorIterator does.
void apply_rotary(const at::Tensor& x1,   // [..., rot / 2]
                  const at::Tensor& x2,   // [..., rot / 2]
                  const at::Tensor& cos,  // broadcastable to x1
                  const at::Tensor& sin,  // broadcastable to x1
                  at::Tensor& out1,       // x1's shape
                  at::Tensor& out2,       // x1's shape
                  bool conj, std::optional<bool> enable_pdl);
