// device_errors.cuh: the device side of device_errors.h: report_device_error, called by one
// thread per offending (token, sequence, CTA), on the error path only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "device_errors.h"

namespace attention {
namespace cuda {
namespace {

// The first report of each clear wins: the claim is a device-memory word (GPU atomics on host
// memory are not atomic over every link), raised by atomicMax to the record's epoch + 1, so a
// host clear (epoch + 1) opens the next round without any device write. Without relocatable
// device code each compilation unit has a claim word of its own; its reports still give way
// to a record the host has not cleared yet (`code` set), and units that fail in the same call
// run one after the other on its stream.
__device__ unsigned int device_error_claim = 0;

__device__ __forceinline__ void report_device_error(DeviceErrorRecord* record, DeviceErrorOp op,
                                                    DeviceErrorCode code, int64_t seq,
                                                    int64_t index, int64_t value, int64_t limit) {
  if (record == nullptr) return;
  volatile DeviceErrorRecord* r = record;
  if (r->code != 0) return;  // an earlier report waits for the host
  const unsigned int epoch = r->epoch;
  if (atomicMax(&device_error_claim, epoch + 1u) > epoch) return;  // claimed since the clear
  r->op = static_cast<int32_t>(op);
  r->seq = seq;
  r->index = index;
  r->value = value;
  r->limit = limit;
  __threadfence_system();  // the fields reach host memory before the code that publishes them
  r->code = static_cast<int32_t>(code);
}

}  // namespace
}  // namespace cuda
}  // namespace attention
