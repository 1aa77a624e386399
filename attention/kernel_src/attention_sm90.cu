// attention_sm90.cu: the host side of the Hopper attention forward (attention_sm90.h): which params
// it takes, their translation into the kernel's arguments, and the instance of their dtype and
// head dim (attention_sm90_instances.h; the kernel is attention_sm90_fwd.cuh). Built for 9.0a
// only; attention_cuda.cu, built for every capability, calls the two functions below.
#include "attention_sm90.h"

#include <cstdint>
#include <limits>

#include "attention_fwd_config.h"
#include "attention_sm90_instances.h"
#include "attention_sm90_tma.cuh"

namespace attention {
namespace cuda {
namespace sm90 {
namespace {

using KernelArgs = attention::sm90::FwdArgs;

constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();
// Below this many query rows the stage-1 decode tiles (and split-KV) are the tuned path.
constexpr int64_t kMinSeqlenQ = 64;
// Rows of the smallest query tile a Hopper kernel can have (the M of one wgmma): the kernel counts
// its tiles in int32.
constexpr int64_t kMinBlockM = 64;
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The strides a TMA descriptor takes (attention_sm90_tma.cuh).
using ::attention::sm90::tma_addressable;
using ::attention::sm90::tma_stride;

KernelArgs kernel_args(const AttnFwdParams& p) {
  KernelArgs a{};
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.out = p.out;
  a.lse = p.lse;
  a.lse_batch = p.lse_batch_stride;
  a.lse_head = p.lse_head_stride;
  a.batch = static_cast<int>(p.batch);
  a.heads_q = static_cast<int>(p.heads_q);
  a.heads_kv = static_cast<int>(p.heads_kv);
  a.seqlen_q = static_cast<int>(p.seqlen_q);
  a.seqlen_k = static_cast<int>(p.seqlen_k);
  a.head_dim = static_cast<int>(p.head_dim);
  a.q_row = tma_stride(p.q_row_stride);
  a.q_head = tma_stride(p.q_head_stride);
  a.q_batch = tma_stride(p.q_batch_stride);
  a.k_row = tma_stride(p.k_row_stride);
  a.k_head = tma_stride(p.k_head_stride);
  a.k_batch = tma_stride(p.k_batch_stride);
  a.v_row = tma_stride(p.v_row_stride);
  a.v_head = tma_stride(p.v_head_stride);
  a.v_batch = tma_stride(p.v_batch_stride);
  a.o_row = p.out_row_stride;
  a.o_head = p.out_head_stride;
  a.o_batch = p.out_batch_stride;
  a.softmax_scale = p.softmax_scale;
  a.causal = p.causal;
  // A side at least seqlen_q + seqlen_k wide bounds nothing (supports() keeps that sum in int32).
  const auto side = [&](int64_t w) {
    return w < 0 || w >= p.seqlen_q + p.seqlen_k ? -1 : static_cast<int>(w);
  };
  a.window_left = side(p.window_left);
  a.window_right = p.causal ? 0 : side(p.window_right);
  a.softcap = p.softcap;
  a.alibi = p.alibi_slopes;
  a.alibi_batch = p.alibi_batch_stride;
  a.cu_seqlens_q = p.cu_seqlens_q;
  a.cu_seqlens_k = p.cu_seqlens_k;
  a.total_q = static_cast<int>(p.total_q);
  a.total_k = static_cast<int>(p.total_k);
  a.tile_counter = p.tile_counter;
  a.tile_group = 1;  // head by head; fwd() sizes the causal groups
  return a;
}

// The (head, batch) pairs of a causal tile group (TileOrder in attention_sm90_fwd.cuh), by the
// stage-1 kernel's rule (tile_group_pairs): their K / V stay in L2, so reading them once per query
// block rank costs no HBM traffic. Head by head (a group of one) took 1.29x the time of one group
// of every pair at one Llama-3-8B layer of 1 x 2048 tokens on an H200 (benchmarks/NOTES.md).
int tile_group(const AttnFwdParams& p, int64_t l2_bytes) {
  const int64_t pairs = p.heads_q * p.batch;
  if (!p.causal || pairs < 2) return 1;
  return static_cast<int>(
      tile_group_pairs(pairs, p.heads_q / p.heads_kv, p.seqlen_k, p.head_dim, l2_bytes));
}

// Head dims up to 32 stay on stage 1, which has instances of 32 and below: through the 64 one
// they would compute twice the products or more.
constexpr int64_t kMinHeadDim = 32;

// The head dims with an instance (attention_sm90_instances.h), ascending: one list for the rule
// (supports) and the dispatch (fwd). A head dim between two of them runs on the instance above,
// its tensors read as zero-padded (tma_gmem_tensor): the zero columns add nothing to Q K^T and
// give output columns that are not written.
template <int... kDims>
struct HeadDims {
  // The instance a head dim runs on: the smallest at least as wide, for multiples of 8 (a TMA
  // descriptor's row strides are multiples of 16 bytes) above kMinHeadDim; 0 for none.
  static int64_t instance_for(int64_t head_dim) {
    if (head_dim % 8 != 0 || head_dim <= kMinHeadDim) return 0;
    int64_t found = 0;
    (void)((head_dim <= kDims && (found = kDims, true)) || ...);
    return found;
  }
  template <class Element>
  static cudaError_t run(const KernelArgs& a, int64_t instance, int sm_count, cudaStream_t stream) {
    cudaError_t err = cudaErrorInvalidValue;
    (void)((instance == kDims &&
            (err = attention::sm90::run_fwd_instance<Element, kDims>(a, sm_count, stream), true)) ||
           ...);
    return err;
  }
};
using InstanceHeadDims = HeadDims<64, 96, 128, 192, 256>;

}  // namespace

bool supports(const AttnFwdParams& p) {
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return false;
  if (InstanceHeadDims::instance_for(p.head_dim) == 0) return false;
  // Fixed-length batches, or varlen with both q and k / v packed.
  const bool varlen = p.cu_seqlens_q != nullptr;
  if (varlen != (p.cu_seqlens_k != nullptr)) return false;
  if (p.seqused_k != nullptr || p.kv_batch_idx != nullptr || p.leftpad_k != nullptr ||
      p.block_table != nullptr) {
    return false;
  }
  if (p.num_splits > 1) return false;
  if (p.seqlen_q < kMinSeqlenQ) return false;
  for (const int64_t n :
       {p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.total_q, p.total_k}) {
    if (n < 0 || n > kMax32) return false;
  }
  // The band's bounds, row + seqlen_k - seqlen_q + window, in int32.
  if (2 * (p.seqlen_q + p.seqlen_k) > kMax32) return false;
  if (p.batch * p.heads_q > kMax32 / ceil_div(p.seqlen_q, kMinBlockM)) return false;
  // The extents the descriptors take (make_params: varlen tensors are one batch of packed rows).
  const int64_t batch = varlen ? 1 : p.batch;
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
  const struct {
    int64_t stride, extent;
  } strides[] = {
      {p.q_batch_stride, batch}, {p.q_row_stride, rows_q}, {p.q_head_stride, p.heads_q},
      {p.k_batch_stride, batch}, {p.k_row_stride, rows_k}, {p.k_head_stride, p.heads_kv},
      {p.v_batch_stride, batch}, {p.v_row_stride, rows_k}, {p.v_head_stride, p.heads_kv}};
  for (const auto& st : strides) {
    if (!tma_addressable(st.stride, st.extent)) return false;
  }
  return true;
}

cudaError_t fwd(const AttnFwdParams& p, int sm_count, int64_t l2_bytes, cudaStream_t stream) {
  if (!supports(p)) return cudaErrorInvalidValue;
  KernelArgs a = kernel_args(p);
  a.tile_group = tile_group(p, l2_bytes);
  const int64_t instance = InstanceHeadDims::instance_for(p.head_dim);
  return p.dtype == DType::kBFloat16
             ? InstanceHeadDims::run<cutlass::bfloat16_t>(a, instance, sm_count, stream)
             : InstanceHeadDims::run<cutlass::half_t>(a, instance, sm_count, stream);
}

}  // namespace sm90
}  // namespace cuda
}  // namespace attention
