// cache_cuda.cu: CUDA KV-cache writers of cache_cuda.h / cache_params.h.
//
// These kernels move a few KiB per token (one key and one value row per head), so they are
// simple: one thread block per token, threads striding over (head, channel). Copies move the
// element bits unchanged (16-bit or 32-bit words); the rotary embedding computes
// a cos - b sin / b cos + a sin in fp32 with explicitly rounded products and sums (__fmul_rn,
// __fadd_rn, __fsub_rn: no FMA contraction), then rounds once to the dtype, so the result is bit
// for bit the CPU implementation's (cache_cpu.cpp).
//
// Index values are checked on the device (cache_cuda.h): every thread of a token with a bad value
// skips its writes, so nothing outside the tensors is touched, and its first thread reports the
// value through the error record of device_errors.h (no assertion: the CUDA context survives).

#include "cache_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "device_errors.cuh"
#include "dispatch.cuh"

namespace attention {
namespace cuda {
namespace {

constexpr int kThreads = 128;

// ---- element conversions ----

template <typename T>
struct Num;
template <>
struct Num<float> {
  using Bits = uint32_t;
  __device__ static float to_float(float v) { return v; }
  __device__ static float from_float(float v) { return v; }
};
template <>
struct Num<__half> {
  using Bits = uint16_t;
  __device__ static float to_float(__half v) { return __half2float(v); }
  __device__ static __half from_float(float v) { return __float2half_rn(v); }
};
template <>
struct Num<__nv_bfloat16> {
  using Bits = uint16_t;
  __device__ static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};

// ---- reshape_and_cache(_flash) ----

template <typename Bits>
__global__ void cache_write_kernel(const CacheWriteParams p) {
  const int64_t t = blockIdx.x;
  const int64_t slot = p.slot_mapping_int64 ? static_cast<const int64_t*>(p.slot_mapping)[t]
                                            : static_cast<const int32_t*>(p.slot_mapping)[t];
  if (slot < 0) return;  // padding token
  if (slot >= p.num_blocks * p.block_size) {
    if (threadIdx.x == 0) {
      report_device_error(p.errors, p.error_op, DeviceErrorCode::kSlotMapping, t, 0, slot,
                          p.num_blocks * p.block_size);
    }
    return;
  }
  const int64_t block = slot / p.block_size;
  const int64_t row = slot % p.block_size;
  const Bits* key = static_cast<const Bits*>(p.key);
  const Bits* value = static_cast<const Bits*>(p.value);
  Bits* key_cache = static_cast<Bits*>(p.key_cache.data);
  Bits* value_cache = static_cast<Bits*>(p.value_cache.data);
  const CacheLayout& kc = p.key_cache;
  const CacheLayout& vc = p.value_cache;
  const int64_t n = p.num_heads * p.head_size;
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
    const int64_t h = e / p.head_size;
    const int64_t d = e % p.head_size;
    key_cache[block * kc.block_stride + row * kc.row_stride + h * kc.head_stride +
              (d / kc.x) * kc.d_outer_stride + (d % kc.x) * kc.d_inner_stride] =
        key[t * p.key_token_stride + h * p.key_head_stride + d];
    value_cache[block * vc.block_stride + row * vc.row_stride + h * vc.head_stride +
                (d / vc.x) * vc.d_outer_stride + (d % vc.x) * vc.d_inner_stride] =
        value[t * p.value_token_stride + h * p.value_head_stride + d];
  }
}

// ---- flash_attn_with_kvcache: append + rotary ----

// Channel c of a row rotated at table row `pos`; the other element of its pair is read too.
template <typename T, typename TT>
__device__ __forceinline__ T rotate(const KvAppendParams& p, const T* src, int64_t c, int64_t pos) {
  if (c >= p.rotary_dim) return src[c];
  const int64_t half = p.rotary_dim / 2;
  int64_t pair, ia, ib;
  if (p.rotary_interleaved) {
    pair = c / 2;
    ia = 2 * pair;
    ib = ia + 1;
  } else {
    pair = c < half ? c : c - half;
    ia = pair;
    ib = pair + half;
  }
  const float a = Num<T>::to_float(src[ia]);
  const float b = Num<T>::to_float(src[ib]);
  const float co =
      Num<TT>::to_float(static_cast<const TT*>(p.rotary_cos)[pos * p.rotary_cos_row_stride + pair]);
  const float si =
      Num<TT>::to_float(static_cast<const TT*>(p.rotary_sin)[pos * p.rotary_sin_row_stride + pair]);
  const float r = c == ia ? __fsub_rn(__fmul_rn(a, co), __fmul_rn(b, si))
                          : __fadd_rn(__fmul_rn(b, co), __fmul_rn(a, si));
  return Num<T>::from_float(r);
}

template <typename T, typename TT>
__global__ void kv_append_kernel(const KvAppendParams p) {
  const int64_t b = blockIdx.x / p.seqlen_new;
  const int64_t i = blockIdx.x % p.seqlen_new;
  const int64_t start = p.cache_seqlens[b];
  const int64_t row = start + i;
  const bool paged = p.block_table != nullptr;
  const int64_t capacity = paged ? p.max_blocks * p.page_block_size : p.cache_seqlen;
  // Checks (first thread reports, every thread of the token skips).
  const bool report = threadIdx.x == 0;
  bool ok = start >= 0 && row < capacity;
  int64_t kb = b, block = 0;
  if (!ok) {
    if (report) {
      const DeviceErrorCode code = start < 0 ? DeviceErrorCode::kNegativeCacheSeqlens
                                   : paged   ? DeviceErrorCode::kAppendPastBlockTable
                                             : DeviceErrorCode::kAppendPastCache;
      report_device_error(p.errors, p.error_op, code, b, i, start < 0 ? start : row, capacity);
    }
  } else if (paged) {
    block = p.block_table[b * p.block_table_batch_stride + row / p.page_block_size];
    ok = block >= 0 && block < p.num_blocks;
    if (!ok && report) {
      report_device_error(p.errors, p.error_op, DeviceErrorCode::kBlockTableValue, b,
                          row / p.page_block_size, block, p.num_blocks);
    }
  } else if (p.kv_batch_idx != nullptr) {
    kb = p.kv_batch_idx[b];
    ok = kb >= 0 && kb < p.cache_batch;
    if (!ok && report) {
      report_device_error(p.errors, p.error_op, DeviceErrorCode::kCacheBatchIdx, b, 0, kb,
                          p.cache_batch);
    }
  }
  const bool rotary = p.rotary_cos != nullptr;
  if (ok && rotary && row >= p.rotary_rows) {
    ok = false;
    if (report) {
      report_device_error(p.errors, p.error_op, DeviceErrorCode::kRotaryRows, b, i, row,
                          p.rotary_rows);
    }
  }
  if (!ok) return;
  T* k_cache = static_cast<T*>(p.k_cache);
  T* v_cache = static_cast<T*>(p.v_cache);
  const int64_t k_off =
      paged ? block * p.k_cache_batch_stride + (row % p.page_block_size) * p.k_cache_row_stride
            : kb * p.k_cache_batch_stride + row * p.k_cache_row_stride;
  const int64_t v_off =
      paged ? block * p.v_cache_batch_stride + (row % p.page_block_size) * p.v_cache_row_stride
            : kb * p.v_cache_batch_stride + row * p.v_cache_row_stride;
  const int64_t n = p.heads_kv * p.head_dim;
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
    const int64_t h = e / p.head_dim;
    const int64_t c = e % p.head_dim;
    const T* k = static_cast<const T*>(p.k_new) + b * p.k_new_batch_stride +
                 i * p.k_new_row_stride + h * p.k_new_head_stride;
    const T* v = static_cast<const T*>(p.v_new) + b * p.v_new_batch_stride +
                 i * p.v_new_row_stride + h * p.v_new_head_stride;
    k_cache[k_off + h * p.k_cache_head_stride + c] = rotary ? rotate<T, TT>(p, k, c, row) : k[c];
    v_cache[v_off + h * p.v_cache_head_stride + c] = v[c];
  }
}

template <typename T, typename TT>
__global__ void rotate_q_kernel(const KvAppendParams p) {
  const int64_t b = blockIdx.x / p.seqlen_q;
  const int64_t i = blockIdx.x % p.seqlen_q;
  const int64_t start = p.cache_seqlens[b];
  const int64_t pos = start + (p.q_positions_per_token ? i : 0);
  const int64_t n = p.heads_q * p.head_dim;
  if (start < 0 || pos >= p.rotary_rows) {
    // The query row becomes NaN, so its attention output is NaN rather than silently wrong (a
    // negative cache_seqlens is reported by kv_append_kernel).
    if (threadIdx.x == 0 && start >= 0) {
      report_device_error(p.errors, p.error_op, DeviceErrorCode::kRotaryRows, b, i, pos,
                          p.rotary_rows);
    }
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
      T* dst = static_cast<T*>(p.q_out) + b * p.q_out_batch_stride + i * p.q_out_row_stride +
               (e / p.head_dim) * p.q_out_head_stride;
      dst[e % p.head_dim] = Num<T>::from_float(__int_as_float(0x7fc00000));
    }
    return;
  }
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
    const int64_t h = e / p.head_dim;
    const int64_t c = e % p.head_dim;
    const T* src = static_cast<const T*>(p.q) + b * p.q_batch_stride + i * p.q_row_stride +
                   h * p.q_head_stride;
    T* dst = static_cast<T*>(p.q_out) + b * p.q_out_batch_stride + i * p.q_out_row_stride +
             h * p.q_out_head_stride;
    dst[c] = rotate<T, TT>(p, src, c, pos);
  }
}

template <typename T, typename TT>
void launch_append(const KvAppendParams& p, cudaStream_t stream) {
  if (p.k_new != nullptr && p.batch * p.seqlen_new > 0) {
    kv_append_kernel<T, TT>
        <<<static_cast<unsigned>(p.batch * p.seqlen_new), kThreads, 0, stream>>>(p);
  }
  if (p.rotary_cos != nullptr && p.q != nullptr && p.batch * p.seqlen_q > 0) {
    rotate_q_kernel<T, TT><<<static_cast<unsigned>(p.batch * p.seqlen_q), kThreads, 0, stream>>>(p);
  }
}

template <typename T>
void launch_append_tables(const KvAppendParams& p, cudaStream_t stream) {
  if (p.rotary_cos != nullptr && p.rotary_fp32) {
    launch_append<T, float>(p, stream);
  } else {
    launch_append<T, T>(p, stream);
  }
}

constexpr int64_t kMaxGrid = 2147483647;  // gridDim.x limit

}  // namespace

cudaError_t cache_write(const CacheWriteParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0 || p.num_heads * p.head_size == 0) return cudaGetLastError();
  if (p.num_tokens > kMaxGrid || p.block_size <= 0 || p.key_cache.x <= 0 || p.value_cache.x <= 0) {
    return cudaErrorInvalidValue;
  }
  const unsigned grid = static_cast<unsigned>(p.num_tokens);
  if (p.dtype == DType::kFloat32) {
    cache_write_kernel<uint32_t><<<grid, kThreads, 0, stream>>>(p);
  } else {
    cache_write_kernel<uint16_t><<<grid, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t kv_append(const KvAppendParams& p, cudaStream_t stream) {
  if (p.cache_seqlens == nullptr || p.batch * p.seqlen_new > kMaxGrid ||
      p.batch * p.seqlen_q > kMaxGrid || (p.block_table != nullptr && p.page_block_size <= 0)) {
    return cudaErrorInvalidValue;
  }
  return dispatch::floats(p.dtype, [&](auto t) {
    launch_append_tables<typename decltype(t)::type>(p, stream);
    return cudaGetLastError();
  });
}

}  // namespace cuda
}  // namespace attention
