// device_errors.h: the record through which the CUDA kernels report an index value out of range
// (a KV-cache row past the cache or its block table, a block id, slot or batch index outside its
// tensor) without a device-side assertion, which would end the CUDA context, and without a
// host synchronization, which a decode step cannot afford and a CUDA graph capture forbids.
//
// Protocol. The Torch layer (torch-ext/attention_ops.cpp) allocates one DeviceErrorRecord per
// device in mapped pinned host memory, once, and passes its device-visible address to every
// kernel through the params (AttnFwdParams, KvAppendParams, CacheWriteParams: `errors`, with the
// calling op in `error_op`); a CUDA graph bakes the address in, which stays valid for the
// process. A kernel that meets a bad value never reads or writes outside the tensors (it skips
// the write, or treats the sequence as having no key and writes NaN into its output rows) and
// reports it with report_device_error (device_errors.cuh): the first report wins, and `code` is
// written last, after the other fields are visible to the host. The Torch layer reads `code` at
// the start of every later CUDA call of these ops (a load from host memory: no synchronization),
// and when it is set, clears the record and raises a RuntimeError that describes it.
#pragma once

#include <cstdint>

namespace attention {

// What was out of range (`seq`, `index`, `value`, `limit` as noted).
enum class DeviceErrorCode : int32_t {
  kNone = 0,
  // The attention read more key rows than the cache holds: sequence `seq` needs `value` rows,
  // its block-table row (paged) or its cache (not paged) holds `limit`.
  kKeysPastBlockTable = 1,
  kKeysPastCache = 2,
  // The KV append: new token `index` of sequence `seq` goes to row `value` (cache_seqlens[seq] +
  // index), the block table (paged) or the cache (not paged) has `limit` rows; or
  // cache_seqlens[seq] = `value` is negative.
  kAppendPastBlockTable = 3,
  kAppendPastCache = 4,
  kNegativeCacheSeqlens = 5,
  // block_table[seq, index] = `value` is outside the `limit` blocks of the cache.
  kBlockTableValue = 6,
  // cache_batch_idx[seq] = `value` is outside the batch of `limit` caches.
  kCacheBatchIdx = 7,
  // rotary_cos / rotary_sin have `limit` rows, token `index` of sequence `seq` needs row `value`.
  kRotaryRows = 8,
  // slot_mapping[seq] = `value` is outside the `limit` slots of the cache.
  kSlotMapping = 9,
};

// The public op whose kernel reported (named in the message).
enum class DeviceErrorOp : int32_t {
  kNone = 0,
  kAttnFwd = 1,
  kFwd = 2,
  kVarlenFwd = 3,
  kFwdKvcache = 4,
  kReshapeAndCache = 5,
  kReshapeAndCacheFlash = 6,
};

struct DeviceErrorRecord {
  int32_t code;    // DeviceErrorCode; 0: nothing reported since the last clear
  uint32_t epoch;  // incremented by the host at each clear (device_errors.cuh: the claim)
  int32_t op;      // DeviceErrorOp
  int32_t unused;
  int64_t seq, index, value, limit;
};

}  // namespace attention
