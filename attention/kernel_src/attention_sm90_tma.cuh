// attention_sm90_tma.cuh: what the TMA descriptors of the Hopper attention kernels need, shared by
// the forward (attention_sm90_fwd.cuh, host side attention_sm90.cu) and the backward
// (attention_sm90_bwd.cuh, attention_sm90_bwd.cu): which strides a descriptor takes, and the
// global tensors the descriptors are made from.
#pragma once

#include <cstdint>

#include "attention_sm90_cute.h"

namespace attention {
namespace sm90 {

// A TMA descriptor's global strides are below 2^40 bytes; the kernels take fp16 / bf16.
constexpr int64_t kMaxTmaStrideBytes = int64_t{1} << 40;
constexpr int64_t kElementBytes = 2;

// Whether a descriptor can address a dimension of `extent` indices with `stride` (elements): any
// stride for a single index (it is never multiplied by anything but 0), else a nonzero one below
// 2^40 bytes.
inline bool tma_addressable(int64_t stride, int64_t extent) {
  if (extent <= 1) return true;
  return stride > 0 && stride < kMaxTmaStrideBytes / kElementBytes;
}

// The params carry stride 0 for a dimension of one index (attention_params.h: never used); a
// descriptor takes positive multiples of 16 bytes only, and for such a dimension any of them
// addresses the same elements.
inline int64_t tma_stride(int64_t stride) { return stride != 0 ? stride : 16 / kElementBytes; }

// A global q / k / v / dout tensor as the descriptors see it: (rows, head_dim, heads, batch),
// head_dim contiguous; strides in elements. `head_dim` is the kernel's (a cute::Int), or the
// tensor's own where it is narrower than the kernel's tiles: a descriptor fills the columns of
// a box past the tensor's last one with zeros.
template <class Element, class HeadDim>
CUTE_HOST_DEVICE auto tma_gmem_tensor(const void* p, HeadDim head_dim, int rows, int heads,
                                      int batch, int64_t row, int64_t head, int64_t batch_stride) {
  using namespace cute;
  return make_tensor(make_gmem_ptr(static_cast<const Element*>(p)),
                     make_shape(rows, head_dim, heads, batch),
                     make_stride(row, _1{}, head, batch_stride));
}

}  // namespace sm90
}  // namespace attention
