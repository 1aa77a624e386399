// cache_cpu.cpp: CPU implementations of the KV-cache writers of cache_cpu.h / cache_params.h.
//
// Both functions first resolve and range-check every destination (one serial pass over the
// tokens, a few bytes each) and throw before writing anything; then they copy on ATen's thread
// pool. Values are copied bit for bit (memcpy of whole head rows where the cache row is
// contiguous, element by element for vLLM's split key layout). The rotary embedding is fp32 math
// with one rounding to the dtype (a' = a cos - b sin, b' = b cos + a sin), flash-attn's formula.

#include "cache_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention_cpu_types.h"

namespace attention {
namespace cpu {
namespace {

constexpr int64_t kGrain = 16;  // tokens per thread-pool task (a token moves heads * dim values)

int64_t element_size(DType dtype) {
  return dtype == DType::kFloat64 ? 8 : dtype == DType::kFloat32 ? 4 : 2;
}

// ---- reshape_and_cache(_flash) ----

void copy_row(const char* src, const CacheLayout& c, int64_t dst_offset, int64_t head_size,
              int64_t esize) {
  char* base = static_cast<char*>(c.data);
  if (c.x == head_size && c.d_inner_stride == 1) {
    std::memcpy(base + dst_offset * esize, src, head_size * esize);
    return;
  }
  for (int64_t d = 0; d < head_size; ++d) {
    const int64_t off = dst_offset + (d / c.x) * c.d_outer_stride + (d % c.x) * c.d_inner_stride;
    std::memcpy(base + off * esize, src + d * esize, esize);
  }
}

}  // namespace

void cache_write(const CacheWriteParams& p) {
  TORCH_CHECK(p.block_size > 0 && p.num_blocks >= 0, "cache_write: block_size must be > 0");
  const int64_t slots = p.num_blocks * p.block_size;
  std::vector<int64_t> slot(p.num_tokens);
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t s = p.slot_mapping_int64 ? static_cast<const int64_t*>(p.slot_mapping)[t]
                                           : static_cast<const int32_t*>(p.slot_mapping)[t];
    TORCH_CHECK(s < slots, "slot_mapping[", t, "] = ", s, " is outside the cache of ", p.num_blocks,
                " blocks x ", p.block_size, " = ", slots, " slots (valid: -1 to skip, or 0 .. ",
                slots - 1, ")");
    slot[t] = s;
  }
  const int64_t esize = element_size(p.dtype);
  at::parallel_for(0, p.num_tokens, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (slot[t] < 0) continue;
      const int64_t block = slot[t] / p.block_size;
      const int64_t row = slot[t] % p.block_size;
      for (int64_t h = 0; h < p.num_heads; ++h) {
        const char* k = static_cast<const char*>(p.key) +
                        (t * p.key_token_stride + h * p.key_head_stride) * esize;
        const char* v = static_cast<const char*>(p.value) +
                        (t * p.value_token_stride + h * p.value_head_stride) * esize;
        const CacheLayout& kc = p.key_cache;
        const CacheLayout& vc = p.value_cache;
        copy_row(k, kc, block * kc.block_stride + row * kc.row_stride + h * kc.head_stride,
                 p.head_size, esize);
        copy_row(v, vc, block * vc.block_stride + row * vc.row_stride + h * vc.head_stride,
                 p.head_size, esize);
      }
    }
  });
}

// ---- flash_attn_with_kvcache: append + rotary ----

namespace {

template <typename T, typename TT>
struct Rotary {
  const KvAppendParams& p;

  // Rotates src into dst at table row `pos` (fp32 math, one rounding); copies the pass-through
  // channels. src and dst are distinct rows.
  void apply(const T* src, T* dst, int64_t pos) const {
    const TT* cos = static_cast<const TT*>(p.rotary_cos) + pos * p.rotary_cos_row_stride;
    const TT* sin = static_cast<const TT*>(p.rotary_sin) + pos * p.rotary_sin_row_stride;
    const int64_t half = p.rotary_dim / 2;
    for (int64_t c = 0; c < half; ++c) {
      const int64_t ia = p.rotary_interleaved ? 2 * c : c;
      const int64_t ib = p.rotary_interleaved ? 2 * c + 1 : c + half;
      const float a = static_cast<float>(src[ia]);
      const float b = static_cast<float>(src[ib]);
      const float co = static_cast<float>(cos[c]);
      const float si = static_cast<float>(sin[c]);
      dst[ia] = static_cast<T>(a * co - b * si);
      dst[ib] = static_cast<T>(b * co + a * si);
    }
    for (int64_t c = p.rotary_dim; c < p.head_dim; ++c) dst[c] = src[c];
  }
};

template <typename T, typename TT>
void append(const KvAppendParams& p, const std::vector<int64_t>& k_rows,
            const std::vector<int64_t>& v_rows) {
  const bool rotary = p.rotary_cos != nullptr;
  const Rotary<T, TT> rot{p};
  const int64_t d = p.head_dim;
  // New keys / values: one task per (b, i).
  const int64_t items = p.batch * p.seqlen_new;
  if (p.k_new != nullptr && items > 0) {
    at::parallel_for(0, items, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t b = t / p.seqlen_new;
        const int64_t i = t % p.seqlen_new;
        const int64_t pos = static_cast<int64_t>(p.cache_seqlens[b]) + i;
        for (int64_t h = 0; h < p.heads_kv; ++h) {
          const T* k = static_cast<const T*>(p.k_new) + b * p.k_new_batch_stride +
                       i * p.k_new_row_stride + h * p.k_new_head_stride;
          const T* v = static_cast<const T*>(p.v_new) + b * p.v_new_batch_stride +
                       i * p.v_new_row_stride + h * p.v_new_head_stride;
          T* kd = static_cast<T*>(p.k_cache) + k_rows[t] + h * p.k_cache_head_stride;
          T* vd = static_cast<T*>(p.v_cache) + v_rows[t] + h * p.v_cache_head_stride;
          if (rotary) {
            rot.apply(k, kd, pos);
          } else {
            std::memcpy(kd, k, d * sizeof(T));
          }
          std::memcpy(vd, v, d * sizeof(T));
        }
      }
    });
  }
  // q rotated into q_out.
  if (rotary && p.q != nullptr) {
    at::parallel_for(0, p.batch * p.seqlen_q, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t b = t / p.seqlen_q;
        const int64_t i = t % p.seqlen_q;
        const int64_t pos =
            static_cast<int64_t>(p.cache_seqlens[b]) + (p.q_positions_per_token ? i : 0);
        for (int64_t h = 0; h < p.heads_q; ++h) {
          const T* src = static_cast<const T*>(p.q) + b * p.q_batch_stride + i * p.q_row_stride +
                         h * p.q_head_stride;
          T* dst = static_cast<T*>(p.q_out) + b * p.q_out_batch_stride + i * p.q_out_row_stride +
                   h * p.q_out_head_stride;
          rot.apply(src, dst, pos);
        }
      }
    });
  }
}

template <typename T>
void append_dispatch(const KvAppendParams& p, const std::vector<int64_t>& k_rows,
                     const std::vector<int64_t>& v_rows) {
  if (p.rotary_cos != nullptr && p.rotary_fp32) {
    append<T, float>(p, k_rows, v_rows);
  } else {
    append<T, T>(p, k_rows, v_rows);
  }
}

}  // namespace

void kv_append(const KvAppendParams& p) {
  TORCH_CHECK(p.cache_seqlens != nullptr, "kv_append: cache_seqlens is required");
  const bool paged = p.block_table != nullptr;
  const bool rotary = p.rotary_cos != nullptr;
  // Destinations of every new row, checked before anything is written.
  const int64_t items = p.k_new != nullptr ? p.batch * p.seqlen_new : 0;
  std::vector<int64_t> k_rows(items), v_rows(items);
  const int64_t capacity = paged ? p.max_blocks * p.page_block_size : p.cache_seqlen;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t start = p.cache_seqlens[b];
    TORCH_CHECK(start >= 0, "cache_seqlens[", b, "] = ", start, " must be >= 0");
    if (p.k_new != nullptr) {
      TORCH_CHECK(start + p.seqlen_new <= capacity, "cache_seqlens[", b, "] = ", start, " + ",
                  p.seqlen_new, " new tokens exceeds the capacity of k_cache (", capacity,
                  paged ? " rows: block_table.size(1) x block size)" : " rows per sequence)");
    }
    int64_t kb = b;
    if (!paged && p.kv_batch_idx != nullptr) {
      kb = p.kv_batch_idx[b];
      TORCH_CHECK(kb >= 0 && kb < p.cache_batch, "cache_batch_idx[", b, "] = ", kb,
                  " is outside the batch of k_cache [0, ", p.cache_batch, ")");
    }
    if (rotary) {
      const int64_t last_k =
          p.k_new != nullptr && p.seqlen_new > 0 ? start + p.seqlen_new - 1 : start;
      const int64_t last_q =
          start + (p.q_positions_per_token && p.seqlen_q > 0 ? p.seqlen_q - 1 : 0);
      const int64_t last = std::max(last_k, last_q);
      TORCH_CHECK(last < p.rotary_rows, "rotary_cos / rotary_sin have ", p.rotary_rows,
                  " rows, but sequence ", b, " needs position ", last, " (cache_seqlens[", b,
                  "] = ", start, ")");
    }
    for (int64_t i = 0; i < (p.k_new != nullptr ? p.seqlen_new : 0); ++i) {
      const int64_t row = start + i;
      int64_t k_off, v_off;
      if (paged) {
        const int64_t block =
            p.block_table[b * p.block_table_batch_stride + row / p.page_block_size];
        TORCH_CHECK(block >= 0 && block < p.num_blocks, "block_table[", b, ", ",
                    row / p.page_block_size, "] = ", block, " is outside the cache of ",
                    p.num_blocks, " blocks");
        k_off = block * p.k_cache_batch_stride + (row % p.page_block_size) * p.k_cache_row_stride;
        v_off = block * p.v_cache_batch_stride + (row % p.page_block_size) * p.v_cache_row_stride;
      } else {
        k_off = kb * p.k_cache_batch_stride + row * p.k_cache_row_stride;
        v_off = kb * p.v_cache_batch_stride + row * p.v_cache_row_stride;
      }
      k_rows[b * p.seqlen_new + i] = k_off;
      v_rows[b * p.seqlen_new + i] = v_off;
    }
  }
  with_element_type(p.dtype,
                    [&](auto element) { append_dispatch<decltype(element)>(p, k_rows, v_rows); });
}

}  // namespace cpu
}  // namespace attention
