// attention_sm90_bwd.cu: the host side of the Hopper attention backward (attention_sm90.h): which
// params it takes, the workspace, and the three launches of a call: the preprocess pass (lse in
// the log2 domain and D = rowsum(dO * O), padded to whole query tiles), the main kernel
// (attention_sm90_bwd.cuh), and the passes its run_bwd launches after it: the sum of the dK / dV
// partials of a split group, and the conversion of the fp32 dQ workspace into dq; at head dim 256
// the dQ pass (attention_sm90_bwd_dq.cuh) instead. Built for 9.0a only, like attention_sm90.cu.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "attention_sm90.h"
#include "attention_sm90_bwd.cuh"
#include "attention_sm90_bwd_dq.cuh"
#include "attention_sm90_tma.cuh"

namespace attention {
namespace cuda {
namespace sm90 {
namespace {

using KernelArgs = attention::sm90::BwdArgs;
template <class Element, int kHeadDim>
using Kernel = attention::sm90::BwdKernelFor<Element, kHeadDim>;

// The padding of the workspace rows: the query tiles of the main kernel (64) and the dQ pass (128).
constexpr int64_t kRowPadding = 128;
constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();

int64_t padded_rows(int64_t seqlen_q) {
  return (seqlen_q + kRowPadding - 1) / kRowPadding * kRowPadding;
}

// The strides a TMA descriptor takes (attention_sm90_tma.cuh).
using ::attention::sm90::tma_addressable;
using ::attention::sm90::tma_stride;

struct Workspace {
  float* lse_log2;     // [batch][heads_q][padded rows]
  float* dsum;         // same
  float* dq_accum;     // [batch][heads_q][padded rows / 64][head_dim x 64] (BwdArgs::dq_accum),
                       // up to head dim 128 (the dQ pass needs none)
  float* dkv_partial;  // BwdArgs::dkv_partial, when the group is split
  int64_t rows;        // batch * heads_q * padded rows
};

// The visible band of `f` in the kernel's terms: causal is a right side of 0 (also under a wider
// window). A side that hides nothing is unbounded (-1), which also keeps the kernel's int
// arithmetic clear of huge window sizes: the left one from seqlen_k - 1 (query 0 then sees key
// 0 and above), the right one from seqlen_q - 1 (the last key is then seen by query 0).
void set_band(const AttnFwdParams& f, KernelArgs* a) {
  const int64_t left = f.window_left, right = f.causal ? 0 : f.window_right;
  a->window_left = left >= 0 && left < f.seqlen_k - 1 ? static_cast<int>(left) : -1;
  a->window_right = right >= 0 && right < f.seqlen_q - 1 ? static_cast<int>(right) : -1;
}

// The kernel instance a head dim runs on: 64, 128 or 256, the smallest at least as wide, for
// multiples of 8 above 32 (the forward's rule, attention_sm90.cu); 0 for none. The tensors are
// read as zero-padded to it; the workspace tiles and partials have its width.
int64_t instance_for(int64_t head_dim) {
  if (head_dim % 8 != 0 || head_dim <= 32 || head_dim > 256) return 0;
  return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
}

// Calls f(Kernel<Element, instance>{}) for the instance of `head_dim` (instance_for).
template <class Element, class F>
auto with_instance(int64_t head_dim, F&& f) {
  switch (instance_for(head_dim)) {
    case 64:
      return f(Kernel<Element, 64>{});
    case 128:
      return f(Kernel<Element, 128>{});
    default:
      return f(Kernel<Element, 256>{});
  }
}

// Floats of the dQ workspace a row (the dQ pass at 256 needs none).
int64_t dq_accum_width(int64_t head_dim) {
  const int64_t instance = instance_for(head_dim);
  return instance <= 128 ? instance : 0;
}

// Floats of the dK / dV partials of `splits` splits (none unsplit).
int64_t partial_floats(const AttnBwdParams& p, int splits) {
  const AttnFwdParams& f = p.fwd;
  return splits > 1 ? 2 * splits * f.batch * f.heads_kv * f.seqlen_k * instance_for(f.head_dim) : 0;
}

Workspace workspace_of(const AttnBwdParams& p, float* base) {
  const AttnFwdParams& f = p.fwd;
  const int64_t rows = f.batch * f.heads_q * padded_rows(f.seqlen_q);
  return {base, base + rows, base + 2 * rows, base + rows * (2 + dq_accum_width(f.head_dim)), rows};
}

// One row of 16 lanes: D = rowsum(dO * O) in fp32, and lse * log2(e); past seqlen_q 0 and +inf
// (queries the main kernel loads as zeros, or from the next packed sequence, must get P = 0).
// Varlen: row i of sequence b is packed row cu_seqlens_q[b] + i, the lse [heads_q, total_q].
template <class Element>
__global__ void attn_bwd_sm90_preprocess_kernel(const AttnBwdParams p, Workspace w,
                                                int64_t padded) {
  constexpr int kLanes = 16;
  const AttnFwdParams& f = p.fwd;
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const int lane = threadIdx.x % kLanes;
  if (row >= w.rows) return;  // whole groups of 16 leave together: the shuffles below stay full
  const int64_t i = row % padded, bh = row / padded;
  const int64_t h = bh % f.heads_q, b = bh / f.heads_q;
  const bool varlen = f.cu_seqlens_q != nullptr;
  const int64_t q0 = varlen ? f.cu_seqlens_q[b] : 0;
  const int64_t len = varlen ? f.cu_seqlens_q[b + 1] - q0 : f.seqlen_q;
  const int64_t bs = varlen ? 0 : b, at = q0 + i;  // batch index and row in the tensors
  float sum = 0.0f;
  if (i < len) {
    const Element* o = static_cast<const Element*>(f.out) + bs * f.out_batch_stride +
                       at * f.out_row_stride + h * f.out_head_stride;
    const Element* d = static_cast<const Element*>(p.dout) + bs * p.dout_batch_stride +
                       at * p.dout_row_stride + h * p.dout_head_stride;
    for (int64_t c = lane * 8; c < f.head_dim; c += kLanes * 8) {
      const uint4 ov = *reinterpret_cast<const uint4*>(o + c);
      const uint4 dv = *reinterpret_cast<const uint4*>(d + c);
      const Element* oe = reinterpret_cast<const Element*>(&ov);
      const Element* de = reinterpret_cast<const Element*>(&dv);
      for (int j = 0; j < 8; ++j) sum += float(oe[j]) * float(de[j]);
    }
  }
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  if (lane == 0) {
    w.dsum[row] = sum;
    w.lse_log2[row] = i < len ? f.lse[bs * f.lse_batch_stride + h * f.lse_head_stride + at] *
                                    1.44269504088896340736f
                              : INFINITY;
  }
}

KernelArgs kernel_args(const AttnBwdParams& p, const Workspace& w, int splits) {
  const AttnFwdParams& f = p.fwd;
  KernelArgs a{};
  a.q = f.q;
  a.k = f.k;
  a.v = f.v;
  a.dout = p.dout;
  a.lse_log2 = w.lse_log2;
  a.dsum = w.dsum;
  a.dq_accum = w.dq_accum;
  a.dkv_partial = w.dkv_partial;
  a.group_splits = splits;
  a.dq = p.dq;
  a.dk = p.dk;
  a.dv = p.dv;
  a.batch = static_cast<int>(f.batch);
  a.heads_q = static_cast<int>(f.heads_q);
  a.heads_kv = static_cast<int>(f.heads_kv);
  a.seqlen_q = static_cast<int>(f.seqlen_q);
  a.seqlen_k = static_cast<int>(f.seqlen_k);
  a.seqlen_q_padded = static_cast<int>(padded_rows(f.seqlen_q));
  a.head_dim = static_cast<int>(f.head_dim);
  a.q_row = tma_stride(f.q_row_stride);
  a.q_head = tma_stride(f.q_head_stride);
  a.q_batch = tma_stride(f.q_batch_stride);
  a.k_row = tma_stride(f.k_row_stride);
  a.k_head = tma_stride(f.k_head_stride);
  a.k_batch = tma_stride(f.k_batch_stride);
  a.v_row = tma_stride(f.v_row_stride);
  a.v_head = tma_stride(f.v_head_stride);
  a.v_batch = tma_stride(f.v_batch_stride);
  a.do_row = tma_stride(p.dout_row_stride);
  a.do_head = tma_stride(p.dout_head_stride);
  a.do_batch = tma_stride(p.dout_batch_stride);
  a.dq_row = p.dq_row_stride;
  a.dq_head = p.dq_head_stride;
  a.dq_batch = p.dq_batch_stride;
  a.dk_row = p.dk_row_stride;
  a.dk_head = p.dk_head_stride;
  a.dk_batch = p.dk_batch_stride;
  a.dv_row = p.dv_row_stride;
  a.dv_head = p.dv_head_stride;
  a.dv_batch = p.dv_batch_stride;
  a.softmax_scale = f.softmax_scale;
  set_band(f, &a);
  a.cu_seqlens_q = f.cu_seqlens_q;
  a.cu_seqlens_k = f.cu_seqlens_k;
  a.total_q = static_cast<int>(f.total_q);
  a.total_k = static_cast<int>(f.total_k);
  return a;
}

// The main kernel's group_splits for `p` (the same for both element types: it depends on the
// tile shape only, and reads no pointer of the arguments).
int group_splits_of(const AttnBwdParams& p, int sm_count) {
  const KernelArgs a = kernel_args(p, Workspace{}, 1);
  return with_instance<cutlass::half_t>(p.fwd.head_dim, [&](auto kernel) {
    return attention::sm90::group_splits<decltype(kernel)>(a, sm_count);
  });
}

template <class Element>
cudaError_t run(const AttnBwdParams& p, const Workspace& w, int splits, cudaStream_t stream) {
  const AttnFwdParams& f = p.fwd;
  const int64_t padded = padded_rows(f.seqlen_q);
  if (w.rows > 0) {
    const size_t dq_floats = w.rows * dq_accum_width(f.head_dim);
    cudaError_t err = dq_floats > 0
                          ? cudaMemsetAsync(w.dq_accum, 0, sizeof(float) * dq_floats, stream)
                          : cudaSuccess;
    if (err != cudaSuccess) return err;
    const int64_t blocks = (w.rows * 16 + 255) / 256;
    attn_bwd_sm90_preprocess_kernel<Element>
        <<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p, w, padded);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  const KernelArgs a = kernel_args(p, w, splits);
  const cudaError_t err = with_instance<Element>(f.head_dim, [&](auto kernel) {
    return attention::sm90::run_bwd<decltype(kernel)>(a, stream);
  });
  if (err != cudaSuccess || instance_for(f.head_dim) != 256) return err;
  return attention::sm90::run_dq_pass<attention::sm90::BwdDqKernel<Element, 256>>(a, stream);
}

}  // namespace

bool bwd_supports(const AttnBwdParams& p) {
  const AttnFwdParams& f = p.fwd;
  if (f.dtype != DType::kFloat16 && f.dtype != DType::kBFloat16) return false;
  if (instance_for(f.head_dim) == 0) return false;
  // Fixed-length batches, or varlen with both q and k / v packed.
  const bool varlen = f.cu_seqlens_q != nullptr;
  if (varlen != (f.cu_seqlens_k != nullptr)) return false;
  if (f.seqused_k != nullptr || f.kv_batch_idx != nullptr || f.leftpad_k != nullptr ||
      f.block_table != nullptr) {
    return false;
  }
  if (f.softcap != 0.0f || f.alibi_slopes != nullptr) return false;
  if (f.lse == nullptr || f.heads_kv <= 0 || f.heads_q % f.heads_kv != 0) return false;
  for (const int64_t n :
       {f.batch, f.heads_q, f.heads_kv, f.seqlen_q, f.seqlen_k, f.total_q, f.total_k}) {
    if (n < 0 || n > kMax32) return false;
  }
  if (padded_rows(f.seqlen_q) > kMax32 || f.batch * f.heads_kv > kMax32 ||
      f.batch * f.heads_q > 65535 || (f.seqlen_k + 63) / 64 > 65535 ||
      (f.seqlen_q + 127) / 128 > 65535) {
    return false;
  }
  // The extents the descriptors take (varlen tensors are one batch of packed rows).
  const int64_t batch = varlen ? 1 : f.batch;
  const int64_t rows_q = varlen ? f.total_q : f.seqlen_q, rows_k = varlen ? f.total_k : f.seqlen_k;
  const struct {
    int64_t stride, extent;
  } loads[] = {
      {f.q_batch_stride, batch},    {f.q_row_stride, rows_q},    {f.q_head_stride, f.heads_q},
      {f.k_batch_stride, batch},    {f.k_row_stride, rows_k},    {f.k_head_stride, f.heads_kv},
      {f.v_batch_stride, batch},    {f.v_row_stride, rows_k},    {f.v_head_stride, f.heads_kv},
      {p.dout_batch_stride, batch}, {p.dout_row_stride, rows_q}, {p.dout_head_stride, f.heads_q}};
  for (const auto& l : loads) {
    if (!tma_addressable(l.stride, l.extent)) return false;
  }
  // The preprocess pass reads out and dout, and the kernels write dq, dk and dv, in pairs or
  // 16-byte chunks of the head dim.
  for (const int64_t s : {f.out_batch_stride, f.out_row_stride, f.out_head_stride,
                          p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride}) {
    if (s % 8 != 0) return false;
  }
  for (const void* ptr : {static_cast<const void*>(f.out), p.dout}) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return false;
  }
  for (const void* ptr : {static_cast<const void*>(p.dq), static_cast<const void*>(p.dk),
                          static_cast<const void*>(p.dv)}) {
    if (reinterpret_cast<uintptr_t>(ptr) % 4 != 0) return false;
  }
  for (const int64_t s :
       {p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, p.dk_batch_stride, p.dk_row_stride,
        p.dk_head_stride, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride}) {
    if (s % 2 != 0) return false;
  }
  return true;
}

int64_t bwd_workspace_floats(const AttnBwdParams& p, int sm_count) {
  const AttnFwdParams& f = p.fwd;
  return f.batch * f.heads_q * padded_rows(f.seqlen_q) * (2 + dq_accum_width(f.head_dim)) +
         partial_floats(p, group_splits_of(p, sm_count));
}

cudaError_t bwd(const AttnBwdParams& p, int sm_count, float* workspace, cudaStream_t stream) {
  if (!bwd_supports(p) || (workspace == nullptr && bwd_workspace_floats(p, sm_count) > 0)) {
    return cudaErrorInvalidValue;
  }
  if (p.fwd.batch == 0 || p.fwd.heads_q == 0) return cudaSuccess;
  const Workspace w = workspace_of(p, workspace);
  const int splits = group_splits_of(p, sm_count);
  return p.fwd.dtype == DType::kBFloat16 ? run<cutlass::bfloat16_t>(p, w, splits, stream)
                                         : run<cutlass::half_t>(p, w, splits, stream);
}

}  // namespace sm90
}  // namespace cuda
}  // namespace attention
