// attention_sm90_fwd.cuh: the Hopper (sm_90a) attention forward. Design:
//   - persistent CTAs (one per SM) take the (query block, head, batch) tiles in TileOrder, each
//     its next one from a global counter (or round robin without one); a CTA owns kBlockM query
//     rows of a tile: one producer warpgroup and kBlockM / 64 consumer warpgroups, 64 rows each
//     (the M of one wgmma);
//   - the producer's first thread loads Q (double-buffered across tiles up to head dim 128) and
//     K / V tiles of kBlockN keys through a kStages-deep TMA pipeline (cutlass::PipelineTmaAsync:
//     full / empty barriers per stage), running ahead into the next tile;
//   - consumers: S = Q K^T by wgmma from shared memory, online softmax in registers (each thread
//     holds two rows, reduced across the four threads of a quad), P converted to the input type
//     in registers and O += P V by wgmma with P from registers and V from shared memory read
//     MN-major (V is stored as it is laid out in memory, keys x head_dim);
//   - registers move from the producer warpgroup to the consumers (setmaxnreg);
//   - the epilogue divides by the row sums, stages O in the tile's Q buffer and writes it in
//     16-byte chunks; the log-sum-exp from registers.
// Covered: fp16 / bf16, head_dim 64 / 96 / 128 / 192 / 256, fixed-length batches with any strides
// (16-byte aligned) and varlen batches (packed q and k / v), MQA / GQA, non-causal, causal
// (bottom-right) and sliding windows, softcap and ALiBi, any seqlen_q / seqlen_k.
#pragma once

#include <cuda_runtime.h>

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

struct FwdArgs {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;  // lse[b * lse_batch + h * lse_head + row] (row stride 1), or null
  int64_t lse_batch, lse_head;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  // The tensors' head dim: the kernel's, or (a multiple of 8) below it, read as zero-padded to
  // it (tma_gmem_tensor) and written up to it.
  int head_dim;
  int64_t q_row, q_head, q_batch;
  int64_t k_row, k_head, k_batch;
  int64_t v_row, v_head, v_batch;
  int64_t o_row, o_head, o_batch;
  float softmax_scale;
  // Causal: the query tiles' work is unequal, so they go longest first (TileOrder).
  bool causal;
  // The visible band (attention_params.h): key j is seen by query i iff i + diag - window_left <=
  // j <= i + diag + window_right, diag = seqlen_k - seqlen_q; -1 leaves a side unbounded (causal
  // carries window_right 0). Both below seqlen_q + seqlen_k.
  int window_left, window_right;
  // Score modifiers (attention_params.h): softcap 0 for none; alibi null for none, else the
  // slope of (batch b, head h) at alibi[b * alibi_batch + h].
  float softcap;
  const float* alibi;
  int64_t alibi_batch;
  // (head, batch) pairs of a tile group (TileOrder), chosen by the host: divides heads_q * batch.
  int tile_group;
  // Varlen (both null for a fixed-length batch): sequence b is rows [cu_seqlens_q[b],
  // cu_seqlens_q[b + 1]) of the packed q and out and rows [cu_seqlens_k[b], cu_seqlens_k[b + 1])
  // of the packed k and v (batch extent 1; total_q / total_k rows each); seqlen_q and seqlen_k
  // are the longest lengths. The lse is then [heads_q, total_q].
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  int total_q, total_k;
  // Zeroed by the caller before each launch: CTAs take their next tile from it (atomicAdd), so
  // unequal causal tiles balance across SMs. Null: a static round robin over the tiles.
  int* tile_counter;
};

// Where tile t lies: query block, head, batch. Tiles go in groups of tile_group consecutive
// (head, batch) pairs; within a group, by query block rank first (every pair's block of rank r
// before any pair's r + 1), and causal ranks count from the last query block, which reads every
// key block. So with tiles handed out in order (tile_counter) the long ones go first and the
// short ones fill the tail (longest processing time first), while the pairs running at one time
// are those of one group, whose K / V the host sizes to stay in L2. tile_group 1 is head by head.
struct TileCoord {
  int m_block, head, head_kv, batch;
};
// The sequence of a tile: its lengths, and where its rows start in the packed tensors (varlen;
// 0 otherwise).
struct SeqInfo {
  int seqlen_q, seqlen_k, q_offset, k_offset;
};
// What the producer hands the consumers with each Q buffer (m_block -1: no tile left).
struct Tile {
  TileCoord c;
  SeqInfo seq;
};

// The tiles of a varlen batch, sequence by sequence (query block rank, then head, within one;
// causal ranks count from the last block), walked by a cursor that only moves forward: each CTA
// takes increasing tile indices (round robin, or in counter order), so finding the sequence of
// each costs one step per sequence passed over the whole launch.
struct VarlenCursor {
  int batch = 0, first_tile = 0, tiles = -1, m_blocks = 0;
  SeqInfo seq{};
  // Moves to the sequence of tile t and returns its coordinates; false when t is past the last.
  template <int kBlockM>
  CUTE_DEVICE bool seek(const FwdArgs& a, int t, TileCoord& c) {
    while (t >= first_tile + max(tiles, 0)) {
      if (tiles >= 0) {
        first_tile += tiles;
        ++batch;
      }
      if (batch >= a.batch) return false;
      seq.q_offset = a.cu_seqlens_q[batch];
      seq.seqlen_q = a.cu_seqlens_q[batch + 1] - seq.q_offset;
      seq.k_offset = a.cu_seqlens_k[batch];
      seq.seqlen_k = a.cu_seqlens_k[batch + 1] - seq.k_offset;
      m_blocks = (seq.seqlen_q + kBlockM - 1) / kBlockM;
      tiles = m_blocks * a.heads_q;
    }
    const int local = t - first_tile, rank = local / a.heads_q;
    c.head = local - rank * a.heads_q;
    c.m_block = a.causal ? m_blocks - 1 - rank : rank;
    c.batch = batch;
    c.head_kv = c.head / (a.heads_q / a.heads_kv);
    return true;
  }
};
struct TileOrder {
  int tiles, m_blocks, heads_q, group;  // group: query heads per K / V head
  int tile_group;                       // pairs of a group: divides heads_q * batch
  bool longest_first;
  CUTE_HOST_DEVICE TileCoord at(int t) const {
    const int group_tiles = tile_group * m_blocks;
    const int g = t / group_tiles, in_group = t - g * group_tiles;
    const int rank = in_group / tile_group;
    const int bh = g * tile_group + (in_group - rank * tile_group);
    TileCoord c;
    c.m_block = longest_first ? m_blocks - 1 - rank : rank;
    c.head = bh % heads_q;
    c.batch = bh / heads_q;
    c.head_kv = c.head / group;
    return c;
  }
};

// kPingpong: the two consumer warpgroups take turns on the tensor cores (named barriers), and
// each overlaps its softmax with its own next GEMMs: S(n+1) = Q K(n+1)^T and O += P(n) V(n) are
// issued together, the exponentials of S(n+1) computed while O += P(n) V(n) runs. Otherwise one
// block at a time: S, wait, softmax, O += P V, wait.
// kQBuffers: Q tiles in shared memory, 2 to load the next tile's Q during this one, 1 where the
// larger head dims leave no room for a second.
template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_,
          bool kPingpong_ = false, int kQBuffers_ = 2>
struct FwdKernel {
  using Element = Element_;
  static constexpr bool kPingpong = kPingpong_;
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kStages = kStages_, kQBuffers = kQBuffers_;
  static_assert(kQBuffers == 1 || kQBuffers == 2);
  static_assert(kHeadDim % 32 == 0 && kBlockN % 16 == 0);
  static constexpr int kConsumerWarpgroups = kBlockM / 64;
  static_assert(kConsumerWarpgroups == 2 || kConsumerWarpgroups == 3);
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
  // setmaxnreg moves registers from the producer to the consumers, within what the launch gave
  // the block (65536 / kThreads a thread, rounded down to 8): asking for more waits forever.
  // Two consumers: 24 + 2 x 240 = 3 x 168. Three: 32 + 3 x 160 = 4 x 128 (with 24 ptxas spilled
  // the producer's tile hand-out, 60 bytes at head dim 128; at two consumers that spill stays).
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegisters = kConsumerWarpgroups == 2 ? 24 : 32;
  static constexpr int kConsumerRegisters = kConsumerWarpgroups == 2 ? 240 : 160;
  static_assert(kProducerRegisters + kConsumerWarpgroups * kConsumerRegisters <=
                    (1 + kConsumerWarpgroups) * kLaunchRegisters,
                "setmaxnreg would wait for registers the block was not given");

  // One consumer warpgroup's GEMMs: S (64 x kBlockN) = Q (64 x d) K^T, O (64 x d) += P V.
  using AtomQK = decltype(GMMA::ss_op_selector<Element, Element, float,
                                               Shape<_64, Int<kBlockN>, Int<kHeadDim>>>());
  using AtomPV = decltype(GMMA::rs_op_selector<Element, Element, float,
                                               Shape<_64, Int<kHeadDim>, Int<kBlockN>>,
                                               GMMA::Major::K, GMMA::Major::MN>());
  using MmaQK = decltype(make_tiled_mma(AtomQK{}));
  using MmaPV = decltype(make_tiled_mma(AtomPV{}));
  static_assert(size<1>(typename MmaQK::AtomShape_MNK{}) == kBlockN &&
                    size<1>(typename MmaPV::AtomShape_MNK{}) == kHeadDim,
                "one wgmma across N per k step: include CuTe through attention_sm90_cute.h");

  // Rows of head_dim elements in 128-byte swizzle atoms where the head dim is a multiple of 64,
  // else (96) in 64-byte ones. Read as (head_dim, keys), the K-major atom is the MN-major one of
  // the same swizzle, which V's GEMM needs.
  using SmemAtom = std::conditional_t<kHeadDim % 64 == 0, GMMA::Layout_K_SW128_Atom<Element>,
                                      GMMA::Layout_K_SW64_Atom<Element>>;
  using SmemLayoutQ =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kQBuffers>>{}));
  using SmemLayoutK =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV = SmemLayoutK;
  // V seen as the B operand of O += P V: (head_dim, keys, stage), head_dim contiguous (MN-major).
  using SmemLayoutVt = decltype(composition(
      SmemLayoutV{},
      make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename cutlass::PipelineState<kStages>;

  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    typename Pipeline::SharedStorage pipe_k;
    typename Pipeline::SharedStorage pipe_v;
    alignas(8) uint64_t q_full[kQBuffers];
    uint64_t q_empty[kQBuffers];
    Tile tile[kQBuffers];  // the tile of each Q buffer, written before q_full
    // The producer's, kept here rather than in its 24-32 registers (it moves once per tile).
    VarlenCursor cursor;
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);

  static constexpr auto gmem_tensor = tma_gmem_tensor<Element, int>;
  using GTensor = decltype(gmem_tensor(nullptr, 0, 0, 0, 0, 0, 0, 0));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GTensor{}, take<0, 2>(SmemLayoutQ{})));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GTensor{}, take<0, 2>(SmemLayoutK{})));

  struct Params {
    FwdArgs args;
    TmaQ tma_q;
    TmaK tma_k;
    TmaK tma_v;
    // The softmax takes scores x in the registers to exp2(x * scale_log2 - max * scale_log2), and
    // the lse is max * lse_scale + log(sum). Raw dot products: softmax_scale * log2(e) and
    // softmax_scale. With a score modifier (softcap or ALiBi) the scores are turned into log2
    // units first (apply_score_mod): 1 and ln(2).
    float scale_log2, lse_scale;
    bool score_mod;
    // softcap: softmax_scale / softcap and softcap * log2(e); else softmax_scale * log2(e), 0.
    float softcap_scale, softcap_log2;
  };

  static Params make_params(const FwdArgs& a) {
    const int d = a.head_dim;
    const bool varlen = a.cu_seqlens_q != nullptr;
    const int queries = varlen ? a.total_q : a.seqlen_q, batch = varlen ? 1 : a.batch;
    auto gq = gmem_tensor(a.q, d, queries, a.heads_q, batch, a.q_row, a.q_head, a.q_batch);
    // No key at all: nothing is loaded (every tile has 0 key blocks), but a TMA descriptor needs
    // a row.
    const int keys = cute::max(varlen ? a.total_k : a.seqlen_k, 1);
    auto gk = gmem_tensor(a.k, d, keys, a.heads_kv, batch, a.k_row, a.k_head, a.k_batch);
    auto gv = gmem_tensor(a.v, d, keys, a.heads_kv, batch, a.v_row, a.v_head, a.v_batch);
    const bool score_mod = a.softcap != 0.0f || a.alibi != nullptr;
    return {a,
            make_tma_copy(SM90_TMA_LOAD{}, gq, take<0, 2>(SmemLayoutQ{})),
            make_tma_copy(SM90_TMA_LOAD{}, gk, take<0, 2>(SmemLayoutK{})),
            make_tma_copy(SM90_TMA_LOAD{}, gv, take<0, 2>(SmemLayoutV{})),
            score_mod ? 1.0f : a.softmax_scale * kLog2e,
            score_mod ? kLn2 : a.softmax_scale,
            score_mod,
            a.softcap != 0.0f ? a.softmax_scale / a.softcap : a.softmax_scale * kLog2e,
            a.softcap * kLog2e};
  }

  // Calls the plain kernel computes: a fixed-length batch, causal or not, no window or modifier.
  static bool is_plain(const FwdArgs& a) {
    return a.cu_seqlens_q == nullptr && a.window_left < 0 && (a.causal || a.window_right < 0) &&
           a.softcap == 0.0f && a.alibi == nullptr;
  }

  CUTE_HOST_DEVICE static TileOrder tile_order(const FwdArgs& a) {
    const int m_blocks = (a.seqlen_q + kBlockM - 1) / kBlockM;
    return {m_blocks * a.heads_q * a.batch, m_blocks, a.heads_q, a.heads_q / a.heads_kv,
            a.causal ? a.tile_group : 1,    a.causal};
  }

  // The key blocks [begin, end) a query block reads: those holding a key of the band of one of
  // its rows (all of them without a window); none when no row sees a key.
  struct KeyBlocks {
    int begin, end;
  };
  // The band's sides (FwdArgs::window_left / _right). The plain kernel has no left side, and
  // its right one is the causal diagonal, so the compiler drops the left edge's code.
  template <bool kGeneral>
  CUTE_DEVICE static int window_left(const FwdArgs& a) {
    return kGeneral ? a.window_left : -1;
  }
  template <bool kGeneral>
  CUTE_DEVICE static int window_right(const FwdArgs& a) {
    return kGeneral ? a.window_right : (a.causal ? 0 : -1);
  }
  template <bool kGeneral>
  CUTE_DEVICE static KeyBlocks key_blocks(const FwdArgs& a, const SeqInfo& seq, int m_block) {
    const int diag = seq.seqlen_k - seq.seqlen_q;
    const int first_row = m_block * kBlockM;
    const int last_row = min(first_row + kBlockM, seq.seqlen_q) - 1;
    const int left = window_left<kGeneral>(a), right = window_right<kGeneral>(a);
    int lo = 0, hi = seq.seqlen_k;  // keys [lo, hi)
    if (right >= 0) hi = min(hi, last_row + diag + right + 1);
    if (left >= 0) lo = max(lo, first_row + diag - left);
    if (hi <= lo) return {0, 0};
    return {lo / kBlockN, (hi + kBlockN - 1) / kBlockN};
  }
};

// kGeneral: windows, softcap, ALiBi and varlen batches; without it (Kernel::is_plain) those are
// compiled out, and the plain calls run the code they ran before the general path existed.
template <class Kernel, bool kGeneral>
__global__ void __launch_bounds__(Kernel::kThreads, 1)
    attn_fwd_sm90_kernel(const __grid_constant__ typename Kernel::Params params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Element = typename Kernel::Element;
  constexpr int kBlockM = Kernel::kBlockM, kBlockN = Kernel::kBlockN;
  constexpr int kHeadDim = Kernel::kHeadDim;
  constexpr int kConsumerThreads = 128 * Kernel::kConsumerWarpgroups;
  using SharedStorage = typename Kernel::SharedStorage;
  using Pipeline = typename Kernel::Pipeline;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  using Barrier = cutlass::arch::ClusterBarrier;
  extern __shared__ __align__(1024) char smem_raw[];  // the 128-byte swizzle needs 1024
  SharedStorage& shared = *reinterpret_cast<SharedStorage*>(smem_raw);
  const FwdArgs& a = params.args;
  const TileOrder order = Kernel::tile_order(a);
  const int warpgroup = threadIdx.x / 128;

  Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename Kernel::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename Kernel::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(shared.v.data()), typename Kernel::SmemLayoutV{});
  Tensor sVt = make_tensor(make_smem_ptr(shared.v.data()), typename Kernel::SmemLayoutVt{});

  // K / V pipelines: the producer's one thread arrives with the transaction bytes; every consumer
  // thread releases. Q has kQBuffers buffers across tiles: q_full[b] (the load, or the producer's
  // plain arrival for a tile without keys), q_empty[b] (every consumer thread, once its output
  // has left the buffer: the epilogue stages O in the Q slice it no longer reads).
  typename Pipeline::Params pipe_params;
  pipe_params.transaction_bytes = kBlockN * kHeadDim * sizeof(Element);
  pipe_params.role =
      warpgroup == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pipe_params.is_leader = threadIdx.x == 0;
  pipe_params.num_consumers = kConsumerThreads;
  Pipeline pipe_k(shared.pipe_k, pipe_params, Shape<_1, _1, _1>{});
  Pipeline pipe_v(shared.pipe_v, pipe_params, Shape<_1, _1, _1>{});
  if (threadIdx.x == 0) {
    for (int b = 0; b < Kernel::kQBuffers; ++b) {
      TxBarrier::init(&shared.q_full[b], 1);
      Barrier::init(&shared.q_empty[b], kConsumerThreads);
    }
  }
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  if (warpgroup == 0) {  // producer
    cutlass::arch::warpgroup_reg_dealloc<Kernel::kProducerRegisters>();
    if (threadIdx.x != 0) return;
    // Varlen: rows of the packed tensors, batch extent 1.
    const bool varlen = kGeneral && a.cu_seqlens_q != nullptr;
    const int q_rows = varlen ? a.total_q : a.seqlen_q, k_rows = varlen ? a.total_k : a.seqlen_k;
    const int batches = varlen ? 1 : a.batch;
    Tensor mQ =
        params.tma_q.get_tma_tensor(make_shape(q_rows, Int<kHeadDim>{}, a.heads_q, batches));
    Tensor mK =
        params.tma_k.get_tma_tensor(make_shape(k_rows, Int<kHeadDim>{}, a.heads_kv, batches));
    Tensor mV =
        params.tma_v.get_tma_tensor(make_shape(k_rows, Int<kHeadDim>{}, a.heads_kv, batches));
    auto state = cutlass::make_producer_start_state<Pipeline>();
    VarlenCursor& cursor = shared.cursor;
    cursor = VarlenCursor{};
    int t = blockIdx.x;
    for (int q_iter = 0;; ++q_iter) {
      const int buf = q_iter % Kernel::kQBuffers, use = q_iter / Kernel::kQBuffers;
      if (use > 0) Barrier::wait(&shared.q_empty[buf], (use - 1) & 1);
      Tile tile;
      const bool found = varlen ? cursor.seek<kBlockM>(a, t, tile.c) : t < order.tiles;
      if (!found) {  // tell the consumers: no tile left
        shared.tile[buf].c.m_block = -1;
        Barrier::arrive(&shared.q_full[buf]);
        break;
      }
      if (varlen) {
        tile.seq = cursor.seq;
      } else {
        tile.c = order.at(t);
        tile.seq = {a.seqlen_q, a.seqlen_k, 0, 0};
      }
      shared.tile[buf] = tile;
      // The next tile's index, asked for now: its latency hides behind this tile's loads.
      const int next = a.tile_counter != nullptr
                           ? static_cast<int>(gridDim.x) + atomicAdd(a.tile_counter, 1)
                           : t + static_cast<int>(gridDim.x);
      const TileCoord& c = tile.c;
      const auto blocks = Kernel::template key_blocks<kGeneral>(a, tile.seq, c.m_block);
      t = next;
      if (blocks.end == blocks.begin) {  // nothing to load; the consumers write zeros
        Barrier::arrive(&shared.q_full[buf]);
        continue;
      }
      const int b = varlen ? 0 : c.batch;
      Tensor gQ =
          local_tile(domain_offset(make_coord(tile.seq.q_offset, _0{}), mQ(_, _, c.head, b)),
                     Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(c.m_block, 0));
      // (kBlockN, d, n)
      Tensor gK =
          local_tile(domain_offset(make_coord(tile.seq.k_offset, _0{}), mK(_, _, c.head_kv, b)),
                     Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));
      Tensor gV =
          local_tile(domain_offset(make_coord(tile.seq.k_offset, _0{}), mV(_, _, c.head_kv, b)),
                     Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));
      auto [tQg, tQs] = tma_partition(params.tma_q, Int<0>{}, Layout<_1>{},
                                      group_modes<0, 2>(sQ(_, _, buf)), group_modes<0, 2>(gQ));
      auto [tKg, tKs] = tma_partition(params.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                      group_modes<0, 2>(gK));
      auto [tVg, tVs] = tma_partition(params.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                      group_modes<0, 2>(gV));
      TxBarrier::arrive_and_expect_tx(&shared.q_full[buf], kBlockM * kHeadDim * sizeof(Element));
      copy(params.tma_q.with(shared.q_full[buf]), tQg, tQs);
      // Key blocks from the last (the diagonal block of a causal tile, which needs masking)
      // down to the first, so causal consumers mask only their first iteration (and, with a
      // left window edge, their last ones).
      for (int n = blocks.end - 1; n >= blocks.begin; --n) {
        pipe_k.producer_acquire(state);
        copy(params.tma_k.with(*pipe_k.producer_get_barrier(state)), tKg(_, n),
             tKs(_, state.index()));
        pipe_v.producer_acquire(state);
        copy(params.tma_v.with(*pipe_v.producer_get_barrier(state)), tVg(_, n),
             tVs(_, state.index()));
        ++state;
      }
    }
    return;
  }

  // consumers
  cutlass::arch::warpgroup_reg_alloc<Kernel::kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  const int tid = threadIdx.x % 128;
  typename Kernel::MmaQK mma_qk;
  typename Kernel::MmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tid);
  auto thr_pv = mma_pv.get_thread_slice(tid);

  Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA, N, K, stage)
  Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA, N, K, stage)
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<_64, Int<kHeadDim>>{});
  Tensor o = make_tensor(tOrO.data(), acc_rows_cols(tOrO.layout()));

  // (row, column) of every accumulator element of S within the 64 x kBlockN tile, and of O.
  Tensor cS = make_identity_tensor(Shape<_64, Int<kBlockN>>{});
  Tensor tScS = thr_qk.partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rows_cols(tScS.layout()));
  constexpr int kRows = size<0>(decltype(acc_rows_cols(tScS.layout())){});
  constexpr int kCols = size<1>(decltype(acc_rows_cols(tScS.layout())){});
  Tensor cO = make_identity_tensor(Shape<_64, Int<kHeadDim>>{});
  Tensor tOcO = thr_pv.partition_C(cO);
  Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rows_cols(tOcO.layout()));
  float row_max[kRows], row_sum[kRows];

  Tensor tSrS = partition_fragment_C(mma_qk, Shape<_64, Int<kBlockN>>{});
  Tensor s_rc = make_tensor(tSrS.data(), acc_rows_cols(tSrS.layout()));
  Tensor p = make_tensor_like<Element>(tSrS);  // P in the input type: the A operand of P V
  Tensor tOrP = make_tensor(p.data(), acc_as_a_operand(p.layout()));
  Tensor p_pairs = recast<uint32_t>(p);
  // Adjacent accumulator registers hold adjacent columns: one packed conversion per pair.
  const auto convert_p = [&] {
    for (int i = 0; i < size(p_pairs); ++i) {
      p_pairs(i) = pack_pair<Element>(tSrS(2 * i), tSrS(2 * i + 1));
    }
  };
  cute::array<float, kRows> correction;
  typename Kernel::PipelineState state;

  // Pingpong turns on the tensor cores, in a ring: warpgroup c issues after warpgroup c - 1 has
  // arrived on barrier c (256 threads: the one arriving, the one waiting); consumer 0 goes
  // first, and every issue section ends by handing the turn to the next. All warpgroups of a
  // tile issue the same number of sections, so the turns stay in step across tiles.
  using cutlass::arch::NamedBarrier;
  constexpr int kWarpgroups = Kernel::kConsumerWarpgroups;
  const auto my_turn = [&] { NamedBarrier::sync(256, consumer); };
  const auto their_turn = [&] { NamedBarrier::arrive(256, (consumer + 1) % kWarpgroups); };
  if constexpr (Kernel::kPingpong) {
    if (consumer == kWarpgroups - 1) NamedBarrier::arrive(256, 0);
  }

  for (int q_iter = 0;; ++q_iter) {
    const int buf = q_iter % Kernel::kQBuffers;
    Barrier::wait(&shared.q_full[buf], (q_iter / Kernel::kQBuffers) & 1);
    const Tile tile = shared.tile[buf];
    if (tile.c.m_block < 0) break;
    const TileCoord& c = tile.c;
    // The plain kernel's sequence is the batch's (offsets 0, folded into the addresses).
    const SeqInfo seq = kGeneral ? tile.seq : SeqInfo{a.seqlen_q, a.seqlen_k, 0, 0};
    const auto blocks = Kernel::template key_blocks<kGeneral>(a, seq, c.m_block);
    const int window_left = Kernel::template window_left<kGeneral>(a);
    const int window_right = Kernel::template window_right<kGeneral>(a);
    const int n_blocks = blocks.end - blocks.begin;
    Tensor sQw = local_tile(sQ(_, _, buf), Shape<_64, Int<kHeadDim>>{}, make_coord(consumer, 0));
    Tensor tSrQ = thr_qk.partition_fragment_A(sQw);
    const int row0 = c.m_block * kBlockM + consumer * 64;
    const int diag = seq.seqlen_k - seq.seqlen_q;  // the band: [i + diag - left, i + diag + right]
    for (int i = 0; i < kRows; ++i) {
      row_max[i] = -INFINITY;
      row_sum[i] = 0.0f;
    }
    clear(tOrO);

    // S = Q K(stage)^T, issued and committed (not waited for).
    const auto issue_s = [&](int stage) {
      warpgroup_fence_operand(tSrS);
      warpgroup_arrive();
      mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
      for (int k = 0; k < size<2>(tSrQ); ++k) {
        gemm(mma_qk, tSrQ(_, _, k), tSrK(_, _, k, stage), tSrS);
        mma_qk.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
    };
    // O += P V(stage), issued and committed. P's registers are read by the wgmma after the
    // issuing instruction: the fences keep the compiler from reusing them (or moving their
    // writes) until the GEMM has been waited for.
    const auto issue_pv = [&](int stage) {
      warpgroup_fence_operand(tOrO);
      warpgroup_fence_operand(tOrP);
      warpgroup_arrive();
      for (int k = 0; k < size<2>(tOrP); ++k) {
        gemm(mma_pv, tOrP(_, _, k), tOrV(_, _, k, stage), tOrO);
      }
      warpgroup_commit_batch();
    };
    // Softcap and ALiBi (params.score_mod): the scores of key block n in log2 units,
    //   softcap: softcap * log2(e) * tanh(x * softmax_scale / softcap), else x * softmax_scale *
    //            log2(e);
    //   ALiBi:   minus slope * log2(e) * |i + diag - j|.
    // Each is one uniform branch around its loop; the plain path skips the function.
    const float slope_log2 =
        kGeneral && a.alibi != nullptr ? a.alibi[c.batch * a.alibi_batch + c.head] * kLog2e : 0.0f;
    const auto apply_score_mod = [&](int n) {
      if (a.softcap != 0.0f) {
        for (int i = 0; i < size(tSrS); ++i) {
          tSrS(i) = params.softcap_log2 * tanh_approx(tSrS(i) * params.softcap_scale);
        }
      } else {
        for (int i = 0; i < size(tSrS); ++i) tSrS(i) *= params.softcap_scale;
      }
      if (a.alibi != nullptr) {
        for (int i = 0; i < kRows; ++i) {
          for (int j = 0; j < kCols; ++j) {
            const int row = row0 + get<0>(tScS_rc(i, j));
            const int col = n * kBlockN + get<1>(tScS_rc(i, j));
            s_rc(i, j) -= slope_log2 * static_cast<float>(abs(row + diag - col));
          }
        }
      }
    };
    // Masks keys beyond seqlen_k (the last block) and those outside the band; only blocks that
    // cross one of those edges for a row of this warpgroup have any.
    const auto mask = [&](int n) {
      const int key0 = n * kBlockN;
      const bool right_edge = window_right >= 0 && key0 + kBlockN - 1 > row0 + diag + window_right;
      const bool left_edge = window_left >= 0 && key0 < row0 + 63 + diag - window_left;
      if (key0 + kBlockN <= seq.seqlen_k && !right_edge && !left_edge) return;
      // Key key0 + c is visible from row0 + r iff c - r lies in [lo, hi]; a side the block lies
      // inside is moved out of reach.
      constexpr int kFar = 1 << 30;
      const int lo = left_edge ? row0 + diag - window_left - key0 : -kFar;
      const int hi = right_edge ? row0 + diag + window_right - key0 : kFar;
      const int cols = seq.seqlen_k - key0;
      for (int i = 0; i < kRows; ++i) {
        for (int j = 0; j < kCols; ++j) {
          const int r = get<0>(tScS_rc(i, j)), col = get<1>(tScS_rc(i, j));
          if (col >= cols || col - r < lo || col - r > hi) s_rc(i, j) = -INFINITY;
        }
      }
    };
    const auto score_mod_and_mask = [&](int n) {
      if (kGeneral && params.score_mod) apply_score_mod(n);
      mask(n);
    };
    // Online softmax of one block in place (S becomes P); correction[i] = exp2(old max - new
    // max) for the rows' O and sums.
    const auto softmax = [&] {
      for (int i = 0; i < kRows; ++i) {
        float mx = row_max[i];
        for (int j = 0; j < kCols; ++j) mx = fmaxf(mx, s_rc(i, j));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // A row without a visible key so far keeps max -inf: exp2 of (-inf) - (-inf) is NaN,
        // so scale against 0 instead.
        const float base = mx == -INFINITY ? 0.0f : mx * params.scale_log2;
        correction[i] = exp2_ftz(row_max[i] * params.scale_log2 - base);
        row_max[i] = mx;
        float sum = 0.0f;
        for (int j = 0; j < kCols; ++j) {
          const float e = exp2_ftz(s_rc(i, j) * params.scale_log2 - base);
          s_rc(i, j) = e;
          sum += e;
        }
        row_sum[i] = row_sum[i] * correction[i] + sum;
      }
    };
    const auto rescale_o = [&] {
      for (int i = 0; i < kRows; ++i) {
        for (int j = 0; j < size<1>(o); ++j) o(i, j) *= correction[i];
      }
    };

    if constexpr (!Kernel::kPingpong) {
      for (int it = 0; it < n_blocks; ++it) {
        pipe_k.consumer_wait(state);
        issue_s(state.index());
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrS);
        pipe_k.consumer_release(state);
        score_mod_and_mask(blocks.end - 1 - it);
        softmax();
        rescale_o();
        convert_p();
        pipe_v.consumer_wait(state);
        issue_pv(state.index());
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        warpgroup_fence_operand(tOrP);
        pipe_v.consumer_release(state);
        ++state;
      }
    } else if (n_blocks > 0) {
      // The first block: S only.
      pipe_k.consumer_wait(state);
      my_turn();
      issue_s(state.index());
      their_turn();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      pipe_k.consumer_release(state);
      score_mod_and_mask(blocks.end - 1);
      softmax();  // O is still 0: no rescale
      convert_p();
      auto state_v = state;  // V of the block whose P is in registers
      ++state;
      // Then S(n + 1) with O += P(n) V(n) per turn: the exponentials of S(n + 1) run while
      // P(n) V(n) does.
      for (int it = 1; it < n_blocks; ++it) {
        pipe_k.consumer_wait(state);
        pipe_v.consumer_wait(state_v);
        my_turn();
        issue_s(state.index());
        issue_pv(state_v.index());
        their_turn();
        warpgroup_wait<1>();  // S of this block; P V of the previous one may still run
        warpgroup_fence_operand(tSrS);
        pipe_k.consumer_release(state);
        score_mod_and_mask(blocks.end - 1 - it);
        softmax();
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        warpgroup_fence_operand(tOrP);
        pipe_v.consumer_release(state_v);
        rescale_o();
        convert_p();
        state_v = state;
        ++state;
      }
      pipe_v.consumer_wait(state_v);
      my_turn();
      issue_pv(state_v.index());
      their_turn();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      warpgroup_fence_operand(tOrP);
      pipe_v.consumer_release(state_v);
    }

    // Epilogue: O / row sum (rows without keys: 0) into this warpgroup's Q slice as pairs, then
    // out in 16-byte rows-contiguous chunks; the log-sum-exp from registers.
    const int64_t lse_base = c.batch * a.lse_batch + c.head * a.lse_head + seq.q_offset;
    for (int i = 0; i < kRows; ++i) {
      float sum = row_sum[i];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      // A row that saw no key has sum 0: out 0, lse +inf. A NaN score or value makes the sum or
      // O NaN, and both stay NaN (attention_params.h).
      const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
      for (int j = 0; j < size<1>(o); j += 2) {
        const int r = get<0>(tOcO_rc(i, j)), col = get<1>(tOcO_rc(i, j));
        // sQw(r, col) and sQw(r, col + 1) are adjacent (the swizzle moves 16-byte chunks).
        *reinterpret_cast<uint32_t*>(&sQw(r, col)) =
            pack_pair<Element>(o(i, j) * inv, o(i, j + 1) * inv);
      }
      const int row = row0 + get<0>(tOcO_rc(i, 0));
      if (a.lse != nullptr && (tid & 3) == 0 && row < seq.seqlen_q) {
        a.lse[lse_base + row] = sum == 0.0f ? INFINITY : row_max[i] * params.lse_scale + logf(sum);
      }
    }
    NamedBarrier::sync(128, kWarpgroups + consumer);  // this warpgroup's slice is written
    constexpr int kChunks = kHeadDim / 8;             // 16-byte chunks per row
    const int out_chunks = a.head_dim / 8;            // the tensor's: the rest are padding
    Element* out = static_cast<Element*>(a.out) + c.batch * a.o_batch + c.head * a.o_head +
                   int64_t{seq.q_offset} * a.o_row;
    for (int idx = tid; idx < 64 * kChunks; idx += 128) {
      const int r = idx / kChunks, chunk = idx % kChunks;
      const int row = row0 + r;
      if (row < seq.seqlen_q && chunk < out_chunks) {
        *reinterpret_cast<uint4*>(out + row * a.o_row + chunk * 8) =
            *reinterpret_cast<const uint4*>(&sQw(r, chunk * 8));
      }
    }
    Barrier::arrive(&shared.q_empty[buf]);
  }
#endif
}

// The configuration each (element type, head dim) runs; the instance units name only this.
// Head dim 64 runs 192-row tiles: three consumer warpgroups hide its softmax, long next to
// GEMMs of 64-wide K and V, behind the other two's tensor-core turns. Key blocks and Q buffers
// fit shared memory (227 KB): 192 and 256 take one Q buffer and shorter key blocks (Q 48 / 64
// KB, K and V 2 x 42 / 2 x 40 KB each).
template <int kHeadDim>
struct FwdTile {
  static constexpr int kBlockM = kHeadDim == 64 ? 192 : 128;
  static constexpr int kBlockN = kHeadDim <= 128 ? 128 : kHeadDim <= 192 ? 112 : 80;
  static constexpr int kQBuffers = kHeadDim <= 128 ? 2 : 1;
};
template <class Element, int kHeadDim>
using FwdKernelFor = FwdKernel<Element, kHeadDim, FwdTile<kHeadDim>::kBlockM,
                               FwdTile<kHeadDim>::kBlockN, 2, true, FwdTile<kHeadDim>::kQBuffers>;

// Launches the kernel for `args` on `stream` (sm_count: the device's SMs, for the persistent
// grid).
template <class Kernel>
cudaError_t run_fwd(const FwdArgs& args, int sm_count, cudaStream_t stream) {
  if (args.batch == 0 || args.heads_q == 0 || args.seqlen_q == 0) return cudaSuccess;
  const int64_t tiles =
      int64_t((args.seqlen_q + Kernel::kBlockM - 1) / Kernel::kBlockM) * args.heads_q * args.batch;
  if (tiles > INT32_MAX || sm_count <= 0) return cudaErrorInvalidValue;
  const auto params = Kernel::make_params(args);
  auto* kernel = Kernel::is_plain(args) ? attn_fwd_sm90_kernel<Kernel, false>
                                        : attn_fwd_sm90_kernel<Kernel, true>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Kernel::kSmemBytes);
  if (err != cudaSuccess) return err;
  const unsigned grid = static_cast<unsigned>(tiles < sm_count ? tiles : sm_count);  // persistent
  kernel<<<grid, Kernel::kThreads, Kernel::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace attention
