// pdl_request.h: the caller's choice of programmatic dependent launch (PDL), as the params of
// kernel_src/ carry it (torch-free and CUDA-free: the CPU build includes the params too).
//
// Source of truth: common/pdl_request.h. Each kernel folder builds alone, so scripts/sync_common.py
// copies this file into <kernel>/kernel_src/ and tests/test_common_sync.py fails when a copy
// drifts. Edit it here, then run `python scripts/sync_common.py`.
//
// The ops take `enable_pdl: Optional[bool] = None` (schema `bool? enable_pdl=None`):
//   None  -> Request::kDefault: each launch's measured default (pdl.cuh, ByDefault);
//   True  -> Request::kOn: PDL for every launch, where the device supports it (sm_90+);
//   False -> Request::kOff: no PDL.
// pdl.cuh turns a Request into the launch attribute. The enum has no linkage of its own to clash
// between kernel libraries; the function has internal linkage.
#pragma once

#include <optional>

namespace pdl {

enum class Request : int { kDefault = 0, kOn = 1, kOff = 2 };

namespace {

// The Request of an op's enable_pdl argument.
inline Request request_of(std::optional<bool> enable_pdl) {
  if (!enable_pdl.has_value()) return Request::kDefault;
  return *enable_pdl ? Request::kOn : Request::kOff;
}

}  // namespace
}  // namespace pdl
