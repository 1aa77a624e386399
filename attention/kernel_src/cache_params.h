// cache_params.h: the torch-free contract of the KV-cache writers (CPU: cache_cpu.h, CUDA:
// cache_cuda.h), shared with the Torch-facing layer (torch-ext/attention_ops.cpp).
//
// 1. CacheWriteParams: vLLM's reshape_and_cache / reshape_and_cache_flash. Token t's key and
//    value rows [num_heads, head_size] go to cache slot s = slot_mapping[t] (int64 or int32):
//    block s / block_size, row s % block_size of that block; s < 0 skips the token (vLLM's
//    padding slot -1). One addressing covers both vLLM layouts: element (block, row, head, d) of
//    a cache lives at
//        block * block_stride + row * row_stride + head * head_stride
//          + (d / x) * d_outer_stride + (d % x) * d_inner_stride
//    - reshape_and_cache (vLLM's paged layout): key_cache [num_blocks, num_heads, head_size / x,
//      block_size, x] (x = 16 bytes / element size in vLLM, any divisor of head_size here),
//      value_cache [num_blocks, num_heads, head_size, block_size] (x = head_size: d_outer = 0);
//    - reshape_and_cache_flash: [num_blocks, block_size, num_heads, head_size] for both (x =
//      head_size, d_inner_stride = 1), any block / row / head strides.
//    Values are copied bit for bit (kv_cache_dtype "auto": the cache has the key's dtype).
//
// 2. KvAppendParams: the cache update of flash-attn's flash_attn_with_kvcache, run before the
//    attention. New keys/values [batch, seqlen_new, heads_kv, head_dim] are written at rows
//    cache_seqlens[b] + i (absolute rows: a cache_leftpad does not shift them, as in flash-attn)
//    of the cache of sequence b: batch kv_batch_idx[b] (or b) of a [batch_cache, seqlen_cache,
//    heads_kv, head_dim] cache, or, with a block table, block block_table[b][row / block_size],
//    row row % block_size of a [num_blocks, block_size, heads_kv, head_dim] cache.
//    Optional rotary embedding (flash-attn's rotary_cos / rotary_sin [rotary_rows, rotary_dim /
//    2], q's dtype or float32): the new keys are rotated at position cache_seqlens[b] + i before
//    they are written, and q is rotated into q_out at position cache_seqlens[b] + i (causal or
//    local attention: q_positions_per_token) or cache_seqlens[b] for every query token (flash-
//    attn's convention otherwise). Pairs: GPT-J / interleaved (x[2c], x[2c+1]) or NeoX
//    (x[c], x[c + rotary_dim / 2]); a' = a cos - b sin, b' = b cos + a sin in fp32, one rounding;
//    channels [rotary_dim, head_dim) are copied. Values are copied bit for bit.
// Every pointer lies on the device of the call; tensors have unit stride along head_dim. Index
// values are range-checked: the CPU implementation throws before writing anything, the CUDA
// kernels skip what is out of range and report it through `errors` (device_errors.h), and
// neither ever reads or writes outside the tensors the params describe.
#pragma once

#include <cstdint>

#include "attention_params.h"
#include "device_errors.h"

namespace attention {

// One cache tensor's addressing (see above).
struct CacheLayout {
  void* data = nullptr;
  int64_t block_stride = 0, row_stride = 0, head_stride = 0;
  int64_t x = 1;               // channels per innermost group (head_size for unsplit layouts)
  int64_t d_outer_stride = 0;  // stride of d / x
  int64_t d_inner_stride = 1;  // stride of d % x
};

struct CacheWriteParams {
  DType dtype = DType::kBFloat16;
  int64_t num_tokens = 0;  // tokens written: slot_mapping.size(0) (<= key.size(0))
  int64_t num_heads = 0;
  int64_t head_size = 0;
  const void* key = nullptr;  // [>= num_tokens, num_heads, head_size]
  int64_t key_token_stride = 0, key_head_stride = 0;
  const void* value = nullptr;  // [>= num_tokens, num_heads, head_size]
  int64_t value_token_stride = 0, value_head_stride = 0;
  CacheLayout key_cache, value_cache;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  const void* slot_mapping = nullptr;  // [num_tokens]
  bool slot_mapping_int64 = true;      // else int32

  DeviceErrorRecord* errors = nullptr;  // CUDA: where a bad slot is reported (null: nowhere)
  DeviceErrorOp error_op = DeviceErrorOp::kNone;
};

struct KvAppendParams {
  DType dtype = DType::kBFloat16;
  int64_t batch = 0;
  int64_t heads_q = 0, heads_kv = 0, head_dim = 0;

  // New keys / values (optional: seqlen_new = 0 or null pointers writes nothing).
  int64_t seqlen_new = 0;
  const void* k_new = nullptr;  // [batch, seqlen_new, heads_kv, head_dim]
  int64_t k_new_batch_stride = 0, k_new_row_stride = 0, k_new_head_stride = 0;
  const void* v_new = nullptr;
  int64_t v_new_batch_stride = 0, v_new_row_stride = 0, v_new_head_stride = 0;

  // Caches, as AttnFwdParams' k / v.
  void* k_cache = nullptr;
  int64_t k_cache_batch_stride = 0, k_cache_row_stride = 0, k_cache_head_stride = 0;
  void* v_cache = nullptr;
  int64_t v_cache_batch_stride = 0, v_cache_row_stride = 0, v_cache_head_stride = 0;
  int64_t cache_batch = 0;   // not paged: batch dimension of the caches
  int64_t cache_seqlen = 0;  // not paged: rows per cache sequence

  const int32_t* cache_seqlens = nullptr;  // [batch] (required)
  const int32_t* kv_batch_idx = nullptr;   // [batch] (not paged)
  const int32_t* block_table = nullptr;    // [batch, max_blocks] (paged)
  int64_t block_table_batch_stride = 0;
  int64_t max_blocks = 0;
  int64_t page_block_size = 0;
  int64_t num_blocks = 0;

  // Rotary embedding (optional).
  const void* rotary_cos = nullptr;  // [rotary_rows, rotary_dim / 2]
  const void* rotary_sin = nullptr;
  bool rotary_fp32 = false;  // tables float32, else the dtype of q
  int64_t rotary_rows = 0, rotary_dim = 0;
  int64_t rotary_cos_row_stride = 0, rotary_sin_row_stride = 0;  // unit stride along a row
  bool rotary_interleaved = true;

  // q rotated into q_out (only with rotary tables).
  const void* q = nullptr;  // [batch, seqlen_q, heads_q, head_dim]
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  void* q_out = nullptr;
  int64_t q_out_batch_stride = 0, q_out_row_stride = 0, q_out_head_stride = 0;
  int64_t seqlen_q = 0;
  bool q_positions_per_token = true;

  DeviceErrorRecord* errors = nullptr;  // CUDA: where a bad index is reported (null: nowhere)
  DeviceErrorOp error_op = DeviceErrorOp::kNone;
};

}  // namespace attention
