// cache_cpu.h: CPU implementations of the KV-cache writers of cache_params.h (no Torch headers
// except ATen's parallel_for and c10's error macros in the .cpp).
#pragma once

#include "cache_params.h"

namespace attention {
namespace cpu {

// vLLM reshape_and_cache / reshape_and_cache_flash (cache_params.h, 1). Checks every slot first
// and throws c10::Error naming slot_mapping (its index and value) when one is >= num_blocks *
// block_size; nothing is written then.
void cache_write(const CacheWriteParams& params);

// flash_attn_with_kvcache's cache update and rotary embedding (cache_params.h, 2). Checks every
// index first (cache_seqlens, cache_batch_idx, block_table, rotary table rows) and throws
// c10::Error naming the argument, before anything is written.
void kv_append(const KvAppendParams& params);

}  // namespace cpu
}  // namespace attention
