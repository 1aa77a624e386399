// cache_cuda.h: host launchers of the CUDA KV-cache writers of cache_params.h (no Torch headers).
//
// Preconditions, checked by the caller (torch-ext/attention_ops.cpp): pointers on the current
// device, shapes, dtypes and strides as cache_params.h lays them out. Index *values* are checked
// on the device: a slot, cache row (past the cache or past the sequence's block-table row), block
// id, batch index or rotary row outside its tensor makes the kernel skip that token's writes (a
// query row it cannot rotate becomes NaN) and report the value to params.errors
// (device_errors.h), which the caller turns into an error naming the argument; no assertion, so
// the CUDA context survives, and nothing is read or written outside the tensors. Each launcher
// enqueues its kernels on `stream` and returns the launch status (cudaGetLastError()).
#pragma once

#include <cuda_runtime_api.h>

#include "cache_params.h"

namespace attention {
namespace cuda {

// vLLM reshape_and_cache / reshape_and_cache_flash: one block per token.
cudaError_t cache_write(const CacheWriteParams& params, cudaStream_t stream);

// flash_attn_with_kvcache's cache update (+ rotary): one block per new token, one per query token
// for the rotated q.
cudaError_t kv_append(const KvAppendParams& params, cudaStream_t stream);

}  // namespace cuda
}  // namespace attention
