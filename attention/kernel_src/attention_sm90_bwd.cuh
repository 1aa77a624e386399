// attention_sm90_bwd.cuh: the Hopper (sm_90a) attention backward. Design:
//   - one CTA per (key block of kBlockN keys, kv head, batch, share of the group's query heads),
//     launched longest first (causal key blocks near the start see the most queries); it keeps the
//     block's K and V in shared memory and its dK / dV in registers across every query block of
//     its query heads. With the whole group in one CTA (group_splits 1, the usual case) GQA needs
//     no reduction afterwards; when that leaves too few CTAs to fill the GPU evenly, the group is
//     split and each share writes an fp32 partial of dK / dV, which a last pass sums in order
//     (group_splits());
//   - a producer warpgroup's first thread loads K / V once, then Q and dO tiles of kBlockM rows
//     through a kStages-deep TMA pipeline, with their rows of lse (log2 domain) and D = rowsum(dO
//     * O) by bulk copy, from buffers that the preprocess pass padded to whole tiles;
//   - kBlockN / 64 consumer warpgroups, 64 keys each, compute per query block
//       S^T = K Q^T, dP^T = V dO^T                 (SS wgmma, keys x queries)
//       P^T = exp2(S^T scale log2(e) - lse_log2),  dS^T = P^T (dP^T - D)
//       dV += P^T dO                               (RS wgmma: P^T from registers)
//       dQ^T = K^T dS^T, dK += dS^T Q              (SS wgmma: dS^T staged in shared memory by
//                                                   both warpgroups, read by both GEMMs)
//     and stage dQ^T in shared memory, from where the producer warpgroup's second warp adds it
//     into an fp32 workspace by a bulk reduction (not deterministic: the order of the adds
//     varies; the mma.sync path serves deterministic calls), which a last pass scales and
//     rounds into dq;
//   - the epilogue scales dK by the softmax scale and writes dK / dV in the input type.
// Keys past seqlen_k load as zeros (TMA), so they add nothing to dQ; their dK / dV rows are not
// written (varlen: they are the next sequence's rows, and their P is masked to 0). Queries past
// seqlen_q load as zeros (varlen: the next sequence's rows) with lse +inf, so their P and dS
// are 0. Columns
// past a narrower tensor's head dim load as zeros too: they add nothing to S or dP, their dK, dV
// and dQ columns are zero and not written.
// Head dim 256 shares a block differently and leaves dQ to a pass of its own (BwdKernel's
// kSplitHeadDim, attention_sm90_bwd_dq.cuh).
// Covered: fp16 / bf16, head dims 64, 128 and 256 (and the multiples of 8 from 40 below them),
// fixed-length batches with any 16-byte-aligned strides and varlen ones, MQA / GQA, non-causal, causal
// (bottom-right) and sliding windows (any left / right band).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "attention_sm90_cute.h"  // first: it configures CuTe

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "attention_sm90_fragments.cuh"
#include "attention_sm90_tma.cuh"

namespace attention {
namespace sm90 {

using namespace cute;

struct BwdArgs {
  const void* q;
  const void* k;
  const void* v;
  const void* dout;
  // [batch][heads_q][seqlen_q_padded] fp32, from the preprocess pass: lse * log2(e) (+inf past
  // seqlen_q) and D = rowsum(dO * O) (0 past seqlen_q).
  const float* lse_log2;
  const float* dsum;
  // fp32, zeroed: dQ / softmax_scale, one tile of kHeadDim x kBlockM floats per (batch, query
  // head, query block), each tile in the order of the dQ^T fragments: float j * 4 + e of dQ
  // thread t at ((j * BwdKernel::kDqThreads) + t) * 4 + e. So the consumers stage a tile in
  // shared memory with conflict-free 16-byte stores, it is added by one bulk reduction, and the
  // dq pass (attn_bwd_sm90_dq_kernel) reorders.
  float* dq_accum;
  // fp32 partials of dK * softmax_scale and dV when group_splits > 1: dK's
  // [group_splits][batch][heads_kv][seqlen_k][kHeadDim], then dV's in the same layout.
  float* dkv_partial;
  void* dq;
  void* dk;
  void* dv;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k, seqlen_q_padded;
  // The tensors' head dim: the kernel's, or (a multiple of 8) below it, read as zero-padded to
  // it (tma_gmem_tensor), their gradients written up to it. The workspace tiles and partials keep
  // the kernel's head dim.
  int head_dim;
  int group_splits;  // CTAs sharing the query heads of one kv head's group: a divisor of the group
  int64_t q_row, q_head, q_batch;
  int64_t k_row, k_head, k_batch;
  int64_t v_row, v_head, v_batch;
  int64_t do_row, do_head, do_batch;
  int64_t dq_row, dq_head, dq_batch;
  int64_t dk_row, dk_head, dk_batch;
  int64_t dv_row, dv_head, dv_batch;
  float softmax_scale;
  // The visible band: key j is seen by query i iff i + diag - window_left <= j <= i + diag +
  // window_right, diag = seqlen_k - seqlen_q; a negative side is unbounded (causal: right 0).
  int window_left, window_right;
  // Varlen (both null for a fixed-length batch): sequence b is rows [cu_seqlens_q[b],
  // cu_seqlens_q[b + 1]) of the packed q, dout and dq and rows [cu_seqlens_k[b],
  // cu_seqlens_k[b + 1]) of the packed k, v, dk and dv (batch extent 1; total_q / total_k rows
  // each). seqlen_q / seqlen_k are the longest lengths, which size the workspace as for a
  // fixed-length batch of them; the lse is [heads_q, total_q].
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  int total_q, total_k;
};

// One sequence's lengths, and where its rows start in the packed tensors (0 without varlen).
struct BwdSeq {
  int seqlen_q, seqlen_k, q_offset, k_offset;
};
CUTE_DEVICE BwdSeq bwd_seq(const BwdArgs& a, int batch) {
  if (a.cu_seqlens_q == nullptr) return {a.seqlen_q, a.seqlen_k, 0, 0};
  const int q0 = a.cu_seqlens_q[batch], k0 = a.cu_seqlens_k[batch];
  return {a.cu_seqlens_q[batch + 1] - q0, a.cu_seqlens_k[batch + 1] - k0, q0, k0};
}
// The longest lengths (the host's view of a varlen batch: it reads no device memory).
CUTE_HOST_DEVICE BwdSeq longest_seq(const BwdArgs& a) { return {a.seqlen_q, a.seqlen_k, 0, 0}; }

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_>
struct BwdKernel {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  // Two ways to share a block between the two consumer warpgroups:
  //  - up to head dim 128, 128 keys, 64 per warpgroup in every GEMM but dQ^T; P^T stays in
  //    registers (the A operand of dV) and dQ^T is staged in shared memory for one bulk reduction;
  //  - at head dim 256, 64 keys: one warpgroup's dK and dV of 64 keys would take 256 fp32
  //    registers a thread, so the warpgroups split the head dim of dK / dV (and the queries of S^T
  //    and dP^T). P^T then goes through shared memory as dS^T does. dQ is left to a pass of its
  //    own (attention_sm90_bwd_dq.cuh): adding 64 KB of it per block of 64 x 64 into the
  //    workspace would take longer than the GEMMs.
  static constexpr bool kSplitHeadDim = kHeadDim > 128;
  static_assert(
      kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256,
      "dQ^T: 64 rows of the head dim a warpgroup; dK / dV: whole 64-column swizzle atoms");
  static_assert(kBlockM == 64 && kBlockN == (kSplitHeadDim ? 64 : 128));
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kThreads = 128 + kConsumerThreads;
  // dQ^T = K^T dS^T (kHeadDim x kBlockM; not at 256, which has its dQ pass) is split between the
  // two consumer warpgroups: along the head dim at 128 (64 rows each), along the queries at 64 (32
  // columns each), so that both issue it and no wgmma sits in a branch (ptxas serializes the
  // wgmmas of a kernel where one does: C7520).
  static constexpr int kDqThreads = kConsumerThreads;
  using DqWarpgroups =
      std::conditional_t<kHeadDim == 64, Layout<Shape<_1, _2, _1>>, Layout<Shape<_2, _1, _1>>>;
  // setmaxnreg within what the launch gives (65536 / 384 = 168 a thread): 24 + 2 x 240 = 3 x 168
  // from head dim 128, whose consumers hold 128 fp32 of dK / dV a thread; at head dim 64 the
  // producer warpgroup keeps 56 (ptxas spilled its loops' state at 24), 56 + 2 x 224.
  static constexpr int kProducerRegisters = kHeadDim == 64 ? 56 : 24;
  static constexpr int kConsumerRegisters = kHeadDim == 64 ? 224 : 240;

  // Up to head dim 128 the consumer warpgroups split the M of every GEMM: keys for S^T, dP^T, dV
  // and dK, the head dim for dQ^T. At 256 they split the N of S^T, dP^T (queries), dV and dK
  // (head dim).
  using WarpgroupsAlongM = Layout<Shape<_2, _1, _1>>;
  using WarpgroupsAlongN = Layout<Shape<_1, _2, _1>>;
  using Warpgroups = std::conditional_t<kSplitHeadDim, WarpgroupsAlongN, WarpgroupsAlongM>;
  static constexpr int kWarpgroupsN = size<1>(Warpgroups{});
  using MmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<_64, Int<kBlockM / kWarpgroupsN>, Int<kHeadDim>>>(),
      Warpgroups{}));
  // dV += P^T dO: P^T from registers, or from shared memory where each warpgroup has half of it.
  using DkvAtomShape = Shape<_64, Int<kHeadDim / kWarpgroupsN>, Int<kBlockM>>;
  using MmaDv = std::conditional_t<
      kSplitHeadDim,
      decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, DkvAtomShape,
                                                   GMMA::Major::K, GMMA::Major::MN>(),
                              Warpgroups{})),
      decltype(make_tiled_mma(GMMA::rs_op_selector<Element, Element, float, DkvAtomShape,
                                                   GMMA::Major::K, GMMA::Major::MN>(),
                              Warpgroups{}))>;
  // dK += dS^T Q with dS^T from shared memory, where dQ^T reads it too: no dS registers live
  // across the GEMMs.
  using MmaDk = decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, DkvAtomShape,
                                                             GMMA::Major::K, GMMA::Major::MN>(),
                                        Warpgroups{}));
  using MmaDq = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<_64, Int<kBlockM / size<1>(DqWarpgroups{})>, Int<kBlockN>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      DqWarpgroups{}));
  static_assert(size<1>(typename MmaSdP::AtomShape_MNK{}) == kBlockM / kWarpgroupsN &&
                    size<1>(typename MmaDv::AtomShape_MNK{}) == kHeadDim / kWarpgroupsN &&
                    size<1>(typename MmaDk::AtomShape_MNK{}) == kHeadDim / kWarpgroupsN &&
                    size<1>(typename MmaDq::AtomShape_MNK{}) == kBlockM / size<1>(DqWarpgroups{}),
                "one wgmma across N per k step: include CuTe through attention_sm90_cute.h");

  // Tiles as they lie in memory (rows x head dim, head dim contiguous) in 128-byte swizzle atoms;
  // the transposed views read them MN-major.
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // Q and dO as the B operands of dK += dS^T Q and dV += P^T dO: (head dim, queries, stage).
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{},
      make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  // K as the A operand of dQ^T = K^T dS^T: (head dim, keys).
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{})));
  // dS^T as the B operand of dQ^T: (queries, keys, buffer), queries contiguous, so each thread
  // stores its pairs of adjacent queries as one word. Two buffers: a warpgroup may write the next
  // block's while the other still reads this one.
  using SmemLayoutDs = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{},
                                              Shape<Int<kBlockM>, Int<kBlockN>, _2>{}));
  // The same as the A operand of dK += dS^T Q: (keys, queries, buffer), queries contiguous.
  using SmemLayoutDsT = decltype(composition(
      SmemLayoutDs{},
      make_ordered_layout(Shape<Int<kBlockN>, Int<kBlockM>, _2>{}, Step<_2, _1, _3>{})));

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename cutlass::PipelineState<kStages>;

  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> v;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> dout;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutDs>> ds;
    // P^T where dV reads it from shared memory (kSplitHeadDim), in dS^T's layout.
    alignas(1024) cute::array_aligned<Element, kSplitHeadDim ? cosize_v<SmemLayoutDs> : 8> p;
    // This block's dQ^T fragments (BwdArgs::dq_accum's tile order), added to the workspace by
    // one bulk reduction (none with kSplitHeadDim).
    alignas(128) float dq[kSplitHeadDim ? 4 : kHeadDim * kBlockM];
    alignas(16) float lse_log2[kStages][kBlockM];
    alignas(16) float dsum[kStages][kBlockM];
    typename Pipeline::SharedStorage pipe_q;
    typename Pipeline::SharedStorage pipe_do;
    alignas(8) uint64_t kv_full;
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "beyond the shared memory of an SM");

  static constexpr auto gmem_tensor = tma_gmem_tensor<Element, int>;
  using GTensor = decltype(gmem_tensor(nullptr, 0, 0, 0, 0, 0, 0, 0));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GTensor{}, take<0, 2>(SmemLayoutQ{})));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GTensor{}, SmemLayoutK{}));

  struct Params {
    BwdArgs args;
    TmaQ tma_q;
    TmaQ tma_do;
    TmaK tma_k;
    TmaK tma_v;
    float scale_log2;  // softmax_scale * log2(e)
  };

  static Params make_params(const BwdArgs& a) {
    // A TMA descriptor needs a row even where a dimension is empty (nothing is loaded then).
    const int rows_q = max(q_rows(a), 1), rows_k = max(k_rows(a), 1), batch = batches(a);
    const int d = a.head_dim;
    auto gq = gmem_tensor(a.q, d, rows_q, a.heads_q, batch, a.q_row, a.q_head, a.q_batch);
    auto gdo = gmem_tensor(a.dout, d, rows_q, a.heads_q, batch, a.do_row, a.do_head, a.do_batch);
    auto gk = gmem_tensor(a.k, d, rows_k, a.heads_kv, batch, a.k_row, a.k_head, a.k_batch);
    auto gv = gmem_tensor(a.v, d, rows_k, a.heads_kv, batch, a.v_row, a.v_head, a.v_batch);
    return {a,
            make_tma_copy(SM90_TMA_LOAD{}, gq, take<0, 2>(SmemLayoutQ{})),
            make_tma_copy(SM90_TMA_LOAD{}, gdo, take<0, 2>(SmemLayoutQ{})),
            make_tma_copy(SM90_TMA_LOAD{}, gk, SmemLayoutK{}),
            make_tma_copy(SM90_TMA_LOAD{}, gv, SmemLayoutK{}),
            a.softmax_scale * 1.44269504088896340736f};
  }

  // The rows and batch extent of the descriptors: varlen tensors are one batch of packed rows.
  CUTE_HOST_DEVICE static int q_rows(const BwdArgs& a) {
    return a.cu_seqlens_q != nullptr ? a.total_q : a.seqlen_q;
  }
  CUTE_HOST_DEVICE static int k_rows(const BwdArgs& a) {
    return a.cu_seqlens_q != nullptr ? a.total_k : a.seqlen_k;
  }
  CUTE_HOST_DEVICE static int batches(const BwdArgs& a) {
    return a.cu_seqlens_q != nullptr ? 1 : a.batch;
  }

  // The query blocks key block n_block of sequence `s` meets, per query head: [first, end). The
  // band's right side (causal: bottom-right) skips the blocks before the first row that sees one
  // of its keys, its left side the blocks after the last.
  CUTE_HOST_DEVICE static int first_query_block(const BwdArgs& a, const BwdSeq& s, int n_block) {
    if (a.window_right < 0) return 0;
    const int first_row = n_block * kBlockN - (s.seqlen_k - s.seqlen_q) - a.window_right;
    return first_row <= 0 ? 0 : first_row / kBlockM;
  }
  CUTE_HOST_DEVICE static int end_query_block(const BwdArgs& a, const BwdSeq& s, int n_block) {
    const int blocks = (s.seqlen_q + kBlockM - 1) / kBlockM;
    if (a.window_left < 0) return blocks;
    const int key_last = min((n_block + 1) * kBlockN, s.seqlen_k) - 1;
    const int last_row = key_last - (s.seqlen_k - s.seqlen_q) + a.window_left;
    return last_row < 0 ? 0 : min(blocks, last_row / kBlockM + 1);
  }
  // Query blocks of the longest sequence: the workspace's tiles per (batch, query head).
  CUTE_HOST_DEVICE static int query_blocks(const BwdArgs& a) {
    return (a.seqlen_q + kBlockM - 1) / kBlockM;
  }
};

// Adds `bytes` (a multiple of 16) of fp32 values from shared to global memory (both 16-byte
// aligned) by one asynchronous bulk reduction of the TMA unit, in the thread's bulk group.
CUTE_DEVICE void bulk_reduce_add(float* gmem, const float* smem, int bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(gmem),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem))), "r"(bytes)
      : "memory");
}

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1)
    attn_bwd_sm90_kernel(const __grid_constant__ typename Kernel::Params params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Element = typename Kernel::Element;
  constexpr int kBlockM = Kernel::kBlockM, kBlockN = Kernel::kBlockN;
  constexpr int kHeadDim = Kernel::kHeadDim;
  constexpr int kConsumerThreads = Kernel::kConsumerThreads;
  using SharedStorage = typename Kernel::SharedStorage;
  using Pipeline = typename Kernel::Pipeline;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  extern __shared__ __align__(1024) char smem_raw[];  // the 128-byte swizzle needs 1024
  SharedStorage& shared = *reinterpret_cast<SharedStorage*>(smem_raw);
  const BwdArgs& a = params.args;

  // Longest first: blockIdx.y is the key block, blockIdx.x the (kv head, batch, split) triple.
  const int n_block = blockIdx.y;
  const int pairs = a.heads_kv * a.batch;
  const int split = blockIdx.x / pairs;
  const int head_kv = blockIdx.x % pairs % a.heads_kv, batch = blockIdx.x % pairs / a.heads_kv;
  const int heads_per_cta = a.heads_q / a.heads_kv / a.group_splits;
  const int head_first = head_kv * (a.heads_q / a.heads_kv) + split * heads_per_cta;
  const bool varlen = a.cu_seqlens_q != nullptr;
  const BwdSeq seq = bwd_seq(a, batch);
  // Varlen: the grid has the longest sequence's key blocks; a shorter one's extra CTAs leave
  // before any barrier (the whole CTA at once), writing nothing.
  if (varlen && n_block * kBlockN >= seq.seqlen_k) return;
  const int b = varlen ? 0 : batch;  // the descriptors' batch coordinate
  const int m_first = Kernel::first_query_block(a, seq, n_block);
  const int m_count = max(0, Kernel::end_query_block(a, seq, n_block) - m_first);
  const int iterations = heads_per_cta * m_count;  // (query head, query block) pairs, head outer

  Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename Kernel::SmemLayoutQ{});
  Tensor sDo = make_tensor(make_smem_ptr(shared.dout.data()), typename Kernel::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(shared.q.data()), typename Kernel::SmemLayoutQt{});
  Tensor sDot = make_tensor(make_smem_ptr(shared.dout.data()), typename Kernel::SmemLayoutQt{});
  Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename Kernel::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(shared.v.data()), typename Kernel::SmemLayoutK{});
  Tensor sKt = make_tensor(make_smem_ptr(shared.k.data()), typename Kernel::SmemLayoutKt{});
  Tensor sDs = make_tensor(make_smem_ptr(shared.ds.data()), typename Kernel::SmemLayoutDs{});
  Tensor sDsT = make_tensor(make_smem_ptr(shared.ds.data()), typename Kernel::SmemLayoutDsT{});
  Tensor sPt = make_tensor(make_smem_ptr(shared.p.data()), typename Kernel::SmemLayoutDsT{});

  // Q / dO pipelines: the producer's one thread arrives with the transaction bytes (the tile and
  // its lse / D row); every consumer thread releases.
  typename Pipeline::Params pipe_params;
  pipe_params.transaction_bytes = kBlockM * kHeadDim * sizeof(Element) + kBlockM * sizeof(float);
  pipe_params.role =
      threadIdx.x < 128 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pipe_params.is_leader = threadIdx.x == 0;
  pipe_params.num_consumers = kConsumerThreads;
  Pipeline pipe_q(shared.pipe_q, pipe_params, Shape<_1, _1, _1>{});
  Pipeline pipe_do(shared.pipe_do, pipe_params, Shape<_1, _1, _1>{});
  if (threadIdx.x == 0) TxBarrier::init(&shared.kv_full, 1);
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  // The dQ tile in shared memory: consumers wait until it is empty (the last reduction has read
  // it), fill it, and mark it full; the producer warpgroup's second warp reduces it into the
  // workspace.
  using cutlass::arch::NamedBarrier;
  constexpr int kDsWritten = 1;  // both warpgroups' dS^T is in shared memory
  constexpr int kDqEmpty = 2, kDqFull = 3;
  constexpr int kPWritten = 4;  // kSplitHeadDim: both warpgroups' P^T is in shared memory
  constexpr int kDqBarrierThreads = Kernel::kDqThreads + 32;

  if (threadIdx.x < 128) {  // producer
    cutlass::arch::warpgroup_reg_dealloc<Kernel::kProducerRegisters>();
    if (iterations == 0) return;
    if (!Kernel::kSplitHeadDim && threadIdx.x / 32 == 1) {  // the dQ reducer
      NamedBarrier::arrive(kDqBarrierThreads, kDqEmpty);
      for (int it = 0; it < iterations; ++it) {
        const int head = head_first + it / m_count, m_block = m_first + it % m_count;
        NamedBarrier::sync(kDqBarrierThreads, kDqFull);
        if (threadIdx.x == 32) {
          bulk_reduce_add(
              a.dq_accum +
                  ((int64_t(batch) * a.heads_q + head) * Kernel::query_blocks(a) + m_block) *
                      (kHeadDim * kBlockM),
              shared.dq, kHeadDim * kBlockM * sizeof(float));
          tma_store_arrive();
          tma_store_wait<0>();  // the reduction has read the tile
        }
        __syncwarp();
        if (it + 1 < iterations) NamedBarrier::arrive(kDqBarrierThreads, kDqEmpty);
      }
      if (threadIdx.x == 32) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
      return;
    }
    if (threadIdx.x != 0) return;
    const int rows_q = max(Kernel::q_rows(a), 1), rows_k = max(Kernel::k_rows(a), 1);
    const int batch_extent = Kernel::batches(a);
    Tensor mQ =
        params.tma_q.get_tma_tensor(make_shape(rows_q, Int<kHeadDim>{}, a.heads_q, batch_extent));
    Tensor mDo =
        params.tma_do.get_tma_tensor(make_shape(rows_q, Int<kHeadDim>{}, a.heads_q, batch_extent));
    Tensor mK =
        params.tma_k.get_tma_tensor(make_shape(rows_k, Int<kHeadDim>{}, a.heads_kv, batch_extent));
    Tensor mV =
        params.tma_v.get_tma_tensor(make_shape(rows_k, Int<kHeadDim>{}, a.heads_kv, batch_extent));
    Tensor gK = local_tile(domain_offset(make_coord(seq.k_offset, _0{}), mK(_, _, head_kv, b)),
                           Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(n_block, 0));
    Tensor gV = local_tile(domain_offset(make_coord(seq.k_offset, _0{}), mV(_, _, head_kv, b)),
                           Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(n_block, 0));
    auto [tKg, tKs] = tma_partition(params.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                    group_modes<0, 2>(gK));
    auto [tVg, tVs] = tma_partition(params.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                    group_modes<0, 2>(gV));
    TxBarrier::arrive_and_expect_tx(&shared.kv_full, 2 * kBlockN * kHeadDim * sizeof(Element));
    copy(params.tma_k.with(shared.kv_full), tKg, tKs);
    copy(params.tma_v.with(shared.kv_full), tVg, tVs);

    auto state = cutlass::make_producer_start_state<Pipeline>();
    for (int it = 0; it < iterations; ++it) {
      const int head = head_first + it / m_count, m_block = m_first + it % m_count;
      Tensor gQ = local_tile(domain_offset(make_coord(seq.q_offset, _0{}), mQ(_, _, head, b)),
                             Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, 0));
      Tensor gDo = local_tile(domain_offset(make_coord(seq.q_offset, _0{}), mDo(_, _, head, b)),
                              Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, 0));
      auto [tQg, tQs] = tma_partition(params.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                      group_modes<0, 2>(gQ));
      auto [tDog, tDos] = tma_partition(params.tma_do, Int<0>{}, Layout<_1>{},
                                        group_modes<0, 2>(sDo), group_modes<0, 2>(gDo));
      const int64_t row0 =
          (int64_t(batch) * a.heads_q + head) * a.seqlen_q_padded + int64_t(m_block) * kBlockM;
      const int stage = state.index();
      pipe_q.producer_acquire(state);
      copy(params.tma_q.with(*pipe_q.producer_get_barrier(state)), tQg, tQs(_, stage));
      SM90_BULK_COPY_G2S::copy(a.lse_log2 + row0, pipe_q.producer_get_barrier(state),
                               shared.lse_log2[stage], kBlockM * sizeof(float));
      pipe_do.producer_acquire(state);
      copy(params.tma_do.with(*pipe_do.producer_get_barrier(state)), tDog, tDos(_, stage));
      SM90_BULK_COPY_G2S::copy(a.dsum + row0, pipe_do.producer_get_barrier(state),
                               shared.dsum[stage], kBlockM * sizeof(float));
      ++state;
    }
    return;
  }

  // consumers
  cutlass::arch::warpgroup_reg_alloc<Kernel::kConsumerRegisters>();
  const int tid = threadIdx.x - 128;  // 0 .. kConsumerThreads - 1
  typename Kernel::MmaSdP mma_sdp;
  typename Kernel::MmaDv mma_dv;
  typename Kernel::MmaDk mma_dk;
  typename Kernel::MmaDq mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dv = mma_dv.get_thread_slice(tid);
  auto thr_dk = mma_dk.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);

  Tensor tSrK = thr_sdp.partition_fragment_A(sK);      // (MMA, M, K)
  Tensor tSrV = thr_sdp.partition_fragment_A(sV);      // (MMA, M, K)
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);      // (MMA, N, K, stage)
  Tensor tSrDo = thr_sdp.partition_fragment_B(sDo);    // (MMA, N, K, stage)
  Tensor tDkrDsT = thr_dk.partition_fragment_A(sDsT);  // (MMA, M, K, buffer)
  Tensor tDkrQt = thr_dk.partition_fragment_B(sQt);    // (MMA, N, K, stage)
  Tensor tDvrDot = thr_dv.partition_fragment_B(sDot);
  Tensor tDvrPt = thr_dv.partition_fragment_A(sPt);  // (MMA, M, K, buffer): kSplitHeadDim
  Tensor tDqrKt = thr_dq.partition_fragment_A(sKt);  // (MMA, M, K)
  Tensor tDqrDs = thr_dq.partition_fragment_B(sDs);  // (MMA, N, K, buffer)

  Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
  Tensor tSrDp = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
  Tensor s_rc = make_tensor(tSrS.data(), acc_rows_cols(tSrS.layout()));  // (key, query)
  Tensor dp_rc = make_tensor(tSrDp.data(), acc_rows_cols(tSrDp.layout()));
  Tensor tDvrDv = partition_fragment_C(mma_dv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  Tensor tDkrDk = partition_fragment_C(mma_dk, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  Tensor tDqrDq = partition_fragment_C(mma_dq, Shape<Int<kHeadDim>, Int<kBlockM>>{});

  // (key, query) of every element of S^T / dP^T; (key, head dim) of dK / dV.
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rows_cols(tScS.layout()));
  Tensor tDkcDk = thr_dv.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));

  // P^T in the input type: the A operand of dV += P^T dO.
  Tensor p = make_tensor_like<Element>(tSrS);
  Tensor tDvrP = make_tensor(p.data(), acc_as_a_operand(p.layout()));
  Tensor p_pairs = recast<uint32_t>(p);
  // dS^T into its shared tile by stmatrix: each 8 x 8 piece of the accumulator (8 keys, 8
  // adjacent queries, 16 contiguous bytes a key in sDs) in one instruction.
  Tensor ds = make_tensor_like<Element>(tSrS);
  Tensor ds_pairs = recast<uint32_t>(ds);
  auto ds_store = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
  auto thr_ds_store = ds_store.get_thread_slice(tid);
  Tensor tDsR = thr_ds_store.retile_S(ds);       // (CPY, CPY_M, CPY_N)
  Tensor tDsS = thr_ds_store.partition_D(sDsT);  // (CPY, CPY_M, CPY_N, buffer)
  Tensor tPR = thr_ds_store.retile_S(p);
  Tensor tPS = thr_ds_store.partition_D(sPt);

  clear(tDvrDv);
  clear(tDkrDk);
  const int diag = seq.seqlen_k - seq.seqlen_q;  // key j visible to query i around j = i + diag
  const int key0 = n_block * kBlockN;
  // Keys of the block past the sequence's end: zeros past a fixed-length tensor (TMA), which
  // add nothing to dQ, but the next sequence's rows in a varlen batch, whose P must be 0.
  const int keys_in_block = varlen ? seq.seqlen_k - key0 : kBlockN;
  typename Kernel::PipelineState state;

  if (iterations > 0) TxBarrier::wait(&shared.kv_full, 0);
  for (int it = 0; it < iterations; ++it) {
    const int m_block = m_first + it % m_count;
    const int stage = state.index(), buf = it & 1;

    // S^T = K Q^T and dP^T = V dO^T, issued together: each an SS GEMM over the head dim into a
    // zeroed accumulator, a commit batch of its own.
    const auto issue_sdp = [&](auto const& t_a, auto const& t_b, auto& t_c) {
      warpgroup_fence_operand(t_c);
      warpgroup_arrive();
      mma_sdp.accumulate_ = GMMA::ScaleOut::Zero;
      for (int k = 0; k < size<2>(t_a); ++k) {
        gemm(mma_sdp, t_a(_, _, k), t_b(_, _, k, stage), t_c);
        mma_sdp.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
    };
    pipe_q.consumer_wait(state);
    issue_sdp(tSrK, tSrQ, tSrS);
    pipe_do.consumer_wait(state);
    issue_sdp(tSrV, tSrDo, tSrDp);

    // P^T while dP^T runs. Only blocks that cross an edge of the band need the mask.
    warpgroup_wait<1>();
    warpgroup_fence_operand(tSrS);
    // Key key0 + r is visible from query m0 + c iff r + lo <= c <= r + hi; where the block lies
    // inside the band on a side, that side's bound is moved out of reach.
    const int m0 = m_block * kBlockM;
    constexpr int kFar = 1 << 28;
    const int lo = a.window_right >= 0 && key0 + kBlockN - 1 > m0 + diag + a.window_right
                       ? key0 - m0 - diag - a.window_right
                       : -kFar;
    const int hi = a.window_left >= 0 && key0 < m0 + kBlockM - 1 + diag - a.window_left
                       ? key0 - m0 - diag + a.window_left
                       : kFar;
    // Two copies of the loop, so that the blocks inside the band (most of them) pay nothing for
    // the mask's compares and selects: the softmax recompute is on the critical path.
    const auto p_from_s = [&](auto hidden) {
      for (int c = 0; c < size<1>(s_rc); ++c) {
        const int col = get<1>(tScS_rc(0, c));
        const float lse = shared.lse_log2[stage][col];
        for (int r = 0; r < size<0>(s_rc); ++r) {
          const float e = exp2_ftz(s_rc(r, c) * params.scale_log2 - lse);
          s_rc(r, c) = hidden(get<0>(tScS_rc(r, 0)), col) ? 0.0f : e;
        }
      }
    };
    if (lo != -kFar || hi != kFar || keys_in_block < kBlockN) {
      p_from_s([&](int row, int col) {
        return col < row + lo || col > row + hi || row >= keys_in_block;
      });
    } else {
      p_from_s([](int, int) { return false; });
    }
    for (int i = 0; i < size(p_pairs); ++i) {
      p_pairs(i) = pack_pair<Element>(tSrS(2 * i), tSrS(2 * i + 1));
    }

    // dV += P^T dO now, so that it runs while dS^T is computed.
    if constexpr (Kernel::kSplitHeadDim) {
      copy(ds_store, tPR, tPS(_, _, _, buf));
      cutlass::arch::fence_view_async_shared();
      NamedBarrier::sync(kConsumerThreads, kPWritten);
      warpgroup_fence_operand(tDvrDv);
      warpgroup_arrive();
      for (int k = 0; k < size<2>(tDvrPt); ++k) {
        gemm(mma_dv, tDvrPt(_, _, k, buf), tDvrDot(_, _, k, stage), tDvrDv);
      }
      warpgroup_commit_batch();
    } else {
      warpgroup_fence_operand(tDvrDv);
      warpgroup_fence_operand(tDvrP);
      warpgroup_arrive();
      for (int k = 0; k < size<2>(tDvrP); ++k) {
        gemm(mma_dv, tDvrP(_, _, k), tDvrDot(_, _, k, stage), tDvrDv);
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(tDvrP);
    }
    warpgroup_wait<1>();  // dP^T; dV may still run
    warpgroup_fence_operand(tSrDp);
    for (int c = 0; c < size<1>(s_rc); ++c) {
      const float dsum = shared.dsum[stage][get<1>(tScS_rc(0, c))];
      for (int r = 0; r < size<0>(s_rc); ++r) dp_rc(r, c) = s_rc(r, c) * (dp_rc(r, c) - dsum);
    }
    for (int i = 0; i < size(ds_pairs); ++i) {
      ds_pairs(i) = pack_pair<Element>(tSrDp(2 * i), tSrDp(2 * i + 1));
    }
    copy(ds_store, tDsR, tDsS(_, _, _, buf));
    cutlass::arch::fence_view_async_shared();  // generic-proxy stores, read by wgmma
    NamedBarrier::sync(kConsumerThreads, kDsWritten);

    // dQ^T = K^T dS^T over the block's keys (each warpgroup half of it: DqWarpgroups), then
    // dK += dS^T Q, which runs while dQ^T is added to the workspace.
    if constexpr (!Kernel::kSplitHeadDim) {
      warpgroup_fence_operand(tDqrDq);
      warpgroup_arrive();
      mma_dq.accumulate_ = GMMA::ScaleOut::Zero;
      for (int k = 0; k < size<2>(tDqrKt); ++k) {
        gemm(mma_dq, tDqrKt(_, _, k), tDqrDs(_, _, k, buf), tDqrDq);
        mma_dq.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
    }
    warpgroup_fence_operand(tDkrDk);
    warpgroup_arrive();
    for (int k = 0; k < size<2>(tDkrDsT); ++k) {
      gemm(mma_dk, tDkrDsT(_, _, k, buf), tDkrQt(_, _, k, stage), tDkrDk);
    }
    warpgroup_commit_batch();
    warpgroup_wait<1>();  // dV and dQ^T; dK may still run
    warpgroup_fence_operand(tDvrDv);
    warpgroup_fence_operand(tDvrP);
    warpgroup_fence_operand(tDqrDq);
    pipe_do.consumer_release(state);

    if constexpr (!Kernel::kSplitHeadDim) {
      NamedBarrier::sync(kDqBarrierThreads, kDqEmpty);
      float4* dq = reinterpret_cast<float4*>(shared.dq) + tid;
      for (int j = 0; j < size(tDqrDq) / 4; ++j) {
        dq[j * Kernel::kDqThreads] =
            make_float4(tDqrDq(4 * j), tDqrDq(4 * j + 1), tDqrDq(4 * j + 2), tDqrDq(4 * j + 3));
      }
      cutlass::arch::fence_view_async_shared();  // read by the bulk reduction (async proxy)
      NamedBarrier::arrive(kDqBarrierThreads, kDqFull);
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(tDkrDk);
    pipe_q.consumer_release(state);
    ++state;
  }

  // Epilogue: dK * softmax_scale and dV for the block's keys below seqlen_k (zeros where no
  // query saw them): rounded into dk / dv, or with a split group into this split's fp32 partial.
  if (a.group_splits > 1) {
    const int64_t plane = int64_t(a.batch) * a.heads_kv * a.seqlen_k * kHeadDim;
    float* dk = a.dkv_partial + int64_t(split) * plane +
                (int64_t(batch) * a.heads_kv + head_kv) * a.seqlen_k * kHeadDim;
    float* dv = dk + int64_t(a.group_splits) * plane;
    for (int i = 0; i < size(tDkrDk); i += 2) {
      const int key = key0 + get<0>(tDkcDk(i)), col = get<1>(tDkcDk(i));
      if (key < seq.seqlen_k) {
        const int64_t at = int64_t(key) * kHeadDim + col;
        *reinterpret_cast<float2*>(dk + at) =
            make_float2(tDkrDk(i) * a.softmax_scale, tDkrDk(i + 1) * a.softmax_scale);
        *reinterpret_cast<float2*>(dv + at) = make_float2(tDvrDv(i), tDvrDv(i + 1));
      }
    }
    return;
  }
  Element* dk = static_cast<Element*>(a.dk) + b * a.dk_batch + head_kv * a.dk_head +
                int64_t(seq.k_offset) * a.dk_row;
  Element* dv = static_cast<Element*>(a.dv) + b * a.dv_batch + head_kv * a.dv_head +
                int64_t(seq.k_offset) * a.dv_row;
  for (int i = 0; i < size(tDkrDk); i += 2) {
    const int key = key0 + get<0>(tDkcDk(i)), col = get<1>(tDkcDk(i));
    if (key < seq.seqlen_k && col < a.head_dim) {
      *reinterpret_cast<uint32_t*>(dk + key * a.dk_row + col) =
          pack_pair<Element>(tDkrDk(i) * a.softmax_scale, tDkrDk(i + 1) * a.softmax_scale);
      *reinterpret_cast<uint32_t*>(dv + key * a.dv_row + col) =
          pack_pair<Element>(tDvrDv(i), tDvrDv(i + 1));
    }
  }
#endif
}

// dq = dq_accum * softmax_scale, rounded once: one block per (query block, batch x query head),
// a thread per consumer thread of the main kernel reading its fragments back (coalesced), placed
// by their (head dim, query) coordinates into a shared tile that leaves in rows.
template <class Kernel>
__global__ void __launch_bounds__(Kernel::kDqThreads)
    attn_bwd_sm90_dq_kernel(const __grid_constant__ BwdArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Element = typename Kernel::Element;
  constexpr int kBlockM = Kernel::kBlockM, kHeadDim = Kernel::kHeadDim;
  // Rounded on the way in: kBlockM x kHeadDim floats would not fit the static 48 KB at head dim
  // 256. + 2: the column writes spread over the banks, each row's pairs stay 4-byte aligned.
  __shared__ alignas(4) Element tile[kBlockM][kHeadDim + 2];
  const int tid = threadIdx.x, m_block = blockIdx.x;
  const int head = blockIdx.y % a.heads_q, batch = blockIdx.y / a.heads_q;
  typename Kernel::MmaDq mma_dq;
  Tensor coord = mma_dq.get_thread_slice(tid).partition_C(
      make_identity_tensor(Shape<Int<kHeadDim>, Int<kBlockM>>{}));
  const float* src =
      a.dq_accum + (int64_t(blockIdx.y) * Kernel::query_blocks(a) + m_block) * (kHeadDim * kBlockM);
  for (int j = 0; j < size(coord) / 4; ++j) {
    const float4 v = *reinterpret_cast<const float4*>(src + (j * Kernel::kDqThreads + tid) * 4);
    const float e[4] = {v.x, v.y, v.z, v.w};
    for (int i = 0; i < 4; ++i) {
      tile[get<1>(coord(4 * j + i))][get<0>(coord(4 * j + i))] = Element(e[i] * a.softmax_scale);
    }
  }
  __syncthreads();
  const BwdSeq seq = bwd_seq(a, batch);
  const int b = a.cu_seqlens_q != nullptr ? 0 : batch;
  Element* dq = static_cast<Element*>(a.dq) + b * a.dq_batch + head * a.dq_head +
                int64_t(seq.q_offset) * a.dq_row;
  for (int idx = tid; idx < kBlockM * kHeadDim / 2; idx += Kernel::kDqThreads) {
    const int r = idx / (kHeadDim / 2), d = idx % (kHeadDim / 2) * 2;
    const int row = m_block * kBlockM + r;
    if (row < seq.seqlen_q && d < a.head_dim) {
      *reinterpret_cast<uint32_t*>(dq + int64_t(row) * a.dq_row + d) =
          *reinterpret_cast<const uint32_t*>(&tile[r][d]);
    }
  }
#endif
}

// dk / dv = the sum of the group_splits partials, in split order (the same bits on every run),
// rounded once: a thread per 4 consecutive values of one key's row.
template <class Kernel>
__global__ void __launch_bounds__(256) attn_bwd_sm90_dkv_reduce_kernel(const BwdArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Element = typename Kernel::Element;
  constexpr int kHeadDim = Kernel::kHeadDim;
  const int64_t plane = int64_t(a.batch) * a.heads_kv * a.seqlen_k * kHeadDim;
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i >= 2 * plane) return;
  const bool is_dv = i >= plane;
  const int64_t at = is_dv ? i - plane : i;
  const float* src = a.dkv_partial + (is_dv ? int64_t(a.group_splits) * plane : 0) + at;
  float4 sum = *reinterpret_cast<const float4*>(src);
  for (int s = 1; s < a.group_splits; ++s) {
    const float4 v = *reinterpret_cast<const float4*>(src + s * plane);
    sum.x += v.x;
    sum.y += v.y;
    sum.z += v.z;
    sum.w += v.w;
  }
  const int col = at % kHeadDim;
  if (col >= a.head_dim) return;      // padding columns (4 at a time: head_dim is a multiple of 8)
  const int64_t row = at / kHeadDim;  // (batch, kv head, key)
  const int key = row % a.seqlen_k;
  const int64_t bh = row / a.seqlen_k;
  const int head_kv = bh % a.heads_kv, batch = bh / a.heads_kv;
  const BwdSeq seq = bwd_seq(a, batch);
  if (key >= seq.seqlen_k) return;  // varlen: past a shorter sequence (no partial was written)
  const int b = a.cu_seqlens_q != nullptr ? 0 : batch;
  const int64_t k_row = int64_t(seq.k_offset) + key;
  Element* dst = is_dv ? static_cast<Element*>(a.dv) + b * a.dv_batch + head_kv * a.dv_head +
                             k_row * a.dv_row + col
                       : static_cast<Element*>(a.dk) + b * a.dk_batch + head_kv * a.dk_head +
                             k_row * a.dk_row + col;
  reinterpret_cast<uint32_t*>(dst)[0] = pack_pair<Element>(sum.x, sum.y);
  reinterpret_cast<uint32_t*>(dst)[1] = pack_pair<Element>(sum.z, sum.w);
#endif
}

// How many CTAs share the query heads of one kv head's group (a divisor of the group). One CTA
// per (key block, kv head, batch) keeps the whole group's dK / dV in registers; but when those
// CTAs are few, the causal key blocks near the start (which meet the most queries) outlast the
// rest. One Llama-3-8B layer at 1 x 2048 tokens (32 / 8 heads) gives 128 CTAs on 132 SMs, the
// longest 4 heads x 32 query blocks against a mean of 4 x 17: the SMs idle half the time. So the
// group is split, the fewest ways that bring the longest CTA within 15% of an even share of the
// work; each split then costs a partial of dK / dV (fp32) and the pass that sums them.
template <class Kernel>
int group_splits(const BwdArgs& a, int sm_count) {
  const int group = a.heads_kv > 0 ? a.heads_q / a.heads_kv : 1;
  const int64_t n_blocks = (int64_t(a.seqlen_k) + Kernel::kBlockN - 1) / Kernel::kBlockN;
  const int64_t ctas = int64_t(a.batch) * a.heads_kv * n_blocks;
  // Four CTAs an SM or more balance themselves when launched longest first.
  if (group <= 1 || ctas == 0 || sm_count <= 0 || ctas >= 4 * int64_t(sm_count)) return 1;
  int64_t longest = 0, total = 0;     // query blocks met by one key block: the most, the sum
  const BwdSeq seq = longest_seq(a);  // varlen: the longest sequence stands for all
  for (int n = 0; n < n_blocks; ++n) {
    const int64_t met =
        std::max(0, Kernel::end_query_block(a, seq, n) - Kernel::first_query_block(a, seq, n));
    longest = std::max(longest, met);
    total += met;
  }
  const double even_share = double(total) * group * a.batch * a.heads_kv / sm_count;
  for (int splits = 1; splits < group; ++splits) {
    if (group % splits == 0 && double(longest) * (group / splits) <= 1.15 * even_share) {
      return splits;
    }
  }
  return group;
}

// The configuration each (element type, head dim) runs.
template <class Element, int kHeadDim>
using BwdKernelFor = BwdKernel<Element, kHeadDim, 64, kHeadDim <= 128 ? 128 : 64, 2>;

// Launches the kernel for `args` on `stream` (grid: kv heads x batch x group splits, key blocks),
// then the dk / dv reduction of a split group, then the dq pass (also without keys: dq is then
// the zeroed workspace, rounded).
template <class Kernel>
cudaError_t run_bwd(const BwdArgs& args, cudaStream_t stream) {
  if (args.batch == 0 || args.heads_kv == 0) return cudaSuccess;
  const int64_t pairs = int64_t(args.heads_kv) * args.batch * args.group_splits;
  const int64_t n_blocks = (args.seqlen_k + Kernel::kBlockN - 1) / Kernel::kBlockN;
  if (pairs > INT32_MAX || n_blocks > 65535) return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  if (n_blocks > 0) {
    const auto params = Kernel::make_params(args);
    auto* kernel = attn_bwd_sm90_kernel<Kernel>;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               Kernel::kSmemBytes);
    if (err != cudaSuccess) return err;
    const dim3 grid(static_cast<unsigned>(pairs), static_cast<unsigned>(n_blocks));
    kernel<<<grid, Kernel::kThreads, Kernel::kSmemBytes, stream>>>(params);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    if (args.group_splits > 1) {
      const int64_t quads = int64_t(args.batch) * args.heads_kv * args.seqlen_k * Kernel::kHeadDim /
                            2;  // dk and dv, 4 values each
      attn_bwd_sm90_dkv_reduce_kernel<Kernel>
          <<<static_cast<unsigned>((quads + 255) / 256), 256, 0, stream>>>(args);
      if ((err = cudaGetLastError()) != cudaSuccess) return err;
    }
  }
  // With kSplitHeadDim the caller runs the dQ pass (attention_sm90_bwd_dq.cuh) instead.
  if (args.seqlen_q == 0 || Kernel::kSplitHeadDim) return cudaSuccess;
  const dim3 dq_grid(static_cast<unsigned>(Kernel::query_blocks(args)),
                     static_cast<unsigned>(int64_t(args.batch) * args.heads_q));
  attn_bwd_sm90_dq_kernel<Kernel><<<dq_grid, Kernel::kDqThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace attention
