// torch_binding.cpp: op schemas and device implementations of the rope kernel.
//
// Public ops follow vLLM (rotary_embedding, batched_rotary_embedding: in place, positions and a
// cat(cos, sin) cache) and kernels-community `rotary` (apply_rotary: out-param halves).
// rope_inplace / rope_out are the general forms behind the Python functional API (flash-attn,
// transformers, LTX-Video conventions), its autograd formulas and the layers. All return
// nothing. Launchers: torch_binding.h; semantics: kernel_src/rope_params.h.
#include <torch/library.h>

#include "registration.h"
#include "torch_binding.h"

#if defined(CUDA_KERNEL)
#define ROPE_IMPL(name) ops.impl(#name, c10::kCUDA, &name)
#elif defined(CPU_KERNEL)
#define ROPE_IMPL(name) ops.impl(#name, c10::kCPU, &name)
#else
#error "rope: compile with -DCPU_KERNEL or -DCUDA_KERNEL"
#endif

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  // vLLM: query/key rotated in place, table row = positions[token].
  ops.def(
      "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, "
      "Tensor cos_sin_cache, bool is_neox, bool? enable_pdl=None) -> ()");
  ROPE_IMPL(rotary_embedding);
  // vLLM: table row = positions[token] + cos_sin_cache_offsets[token].
  ops.def(
      "batched_rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, "
      "Tensor cos_sin_cache, bool is_neox, int rot_dim, Tensor cos_sin_cache_offsets, "
      "bool? enable_pdl=None) -> ()");
  ROPE_IMPL(batched_rotary_embedding);

  // General forms (every option of RopeParams): in place, and with separate outputs.
  ops.def(
      "rope_inplace(Tensor(a!) q, Tensor(b!)? k, Tensor cos, Tensor sin, Tensor? positions, "
      "Tensor? seqlen_offsets, Tensor? cu_seqlens, int seqlen_offset, int rot_dim, "
      "bool interleaved, bool full_table, bool transpose, bool? enable_pdl=None) -> ()");
  ROPE_IMPL(rope_inplace);
  ops.def(
      "rope_out(Tensor(a!) q_out, Tensor q, Tensor(b!)? k_out, Tensor? k, Tensor cos, "
      "Tensor sin, Tensor? positions, Tensor? seqlen_offsets, Tensor? cu_seqlens, "
      "int seqlen_offset, int rot_dim, bool interleaved, bool full_table, bool transpose, "
      "bool? enable_pdl=None) -> ()");
  ROPE_IMPL(rope_out);

  // kernels-community `rotary`: out1 = x1 cos - x2 sin, out2 = x1 sin + x2 cos (conj: -theta).
  ops.def(
      "apply_rotary(Tensor x1, Tensor x2, Tensor cos, Tensor sin, Tensor! out1, Tensor! out2, "
      "bool conj, bool? enable_pdl=None) -> ()");
  ROPE_IMPL(apply_rotary);
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
