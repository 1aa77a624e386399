// attention_sm90_bwd_dq.cuh: the dQ pass of the Hopper attention backward at head dim 256.
// There the main kernel (attention_sm90_bwd.cuh) holds 64 keys a CTA, and adding each CTA's dQ
// into an fp32 workspace would move 64 KB through the L2's reduction units per 64 x 64 block:
// their throughput, not the tensor cores, set the time (probe of benchmarks/NOTES.md). So at
// 256 the main kernel computes dK and dV only, and this pass computes dQ on its own, with no
// reduction at all (the same bits on every run):
//   - one CTA per (block of kBlockM queries, query head, batch), last query block first (causal
//     blocks near the end see the most keys); it keeps the block's Q and dO in shared memory and
//     dQ in registers across the key blocks it sees;
//   - a producer warpgroup's first thread loads Q, dO and their rows of lse (log2 domain) and
//     D = rowsum(dO * O) once, then K and V tiles of kBlockN keys through TMA pipelines (K two
//     deep, V one: V is free as soon as dP has run);
//   - two consumer warpgroups, 64 queries each, compute per key block
//       dP = dO V^T, S = Q K^T          (SS wgmma, queries x keys)
//       P = exp2(S scale log2(e) - lse_log2), dS = P (dP - D)
//       dQ += dS K                      (RS wgmma: dS from registers)
//     and write dQ * softmax_scale in the input type at the end.
// Recomputing S and dP costs two GEMMs of the five; at head dim 256 that is cheaper than the
// reductions it saves. Keys past seqlen_k (zeros past a fixed-length tensor, the next sequence's
// rows in a varlen batch) are masked to P = 0, as are keys outside the band; queries past
// seqlen_q have lse +inf (the preprocess pass), so P = 0, and are not written.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention_sm90_cute.h"  // first: it configures CuTe

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "attention_sm90_bwd.cuh"
#include "attention_sm90_fragments.cuh"

namespace attention {
namespace sm90 {

using namespace cute;

template <class Element_, int kHeadDim_>
struct BwdDqKernel {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_, kBlockM = 128, kBlockN = 64;
  static constexpr int kStagesK = 2;
  static constexpr int kThreads = 128 + 256;
  // 24 + 2 x 240 = 3 x 168: each consumer thread holds 128 fp32 of dQ, 32 of S and 32 of dP.
  static constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;

  using Warpgroups = Layout<Shape<_2, _1, _1>>;  // 64 queries each
  using MmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(),
      Warpgroups{}));
  using MmaDq = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      Warpgroups{}));

  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStagesK>>{}));
  using SmemLayoutV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, _1>{}));
  // K as the B operand of dQ += dS K: (head dim, keys, stage), head dim contiguous.
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStagesK>>{},
                                         Step<_2, _1, _3>{})));

  using PipelineK = cutlass::PipelineTmaAsync<kStagesK>;
  using PipelineV = cutlass::PipelineTmaAsync<1>;

  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> dout;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    alignas(16) float lse_log2[kBlockM];
    alignas(16) float dsum[kBlockM];
    typename PipelineK::SharedStorage pipe_k;
    typename PipelineV::SharedStorage pipe_v;
    alignas(8) uint64_t q_full;
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "beyond the shared memory of an SM");

  static constexpr auto gmem_tensor = tma_gmem_tensor<Element, int>;
  using GTensor = decltype(gmem_tensor(nullptr, 0, 0, 0, 0, 0, 0, 0));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GTensor{}, SmemLayoutQ{}));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GTensor{}, take<0, 2>(SmemLayoutK{})));

  struct Params {
    BwdArgs args;
    TmaQ tma_q;
    TmaQ tma_do;
    TmaK tma_k;
    TmaK tma_v;
    float scale_log2;  // softmax_scale * log2(e)
  };

  // The main kernel's row and batch extents (its descriptors see the tensors the same way).
  using Main = BwdKernel<Element, kHeadDim, 64, 64, 2>;

  static Params make_params(const BwdArgs& a) {
    const int rows_q = max(Main::q_rows(a), 1), rows_k = max(Main::k_rows(a), 1);
    const int batch = Main::batches(a), d = a.head_dim;
    auto gq = gmem_tensor(a.q, d, rows_q, a.heads_q, batch, a.q_row, a.q_head, a.q_batch);
    auto gdo = gmem_tensor(a.dout, d, rows_q, a.heads_q, batch, a.do_row, a.do_head, a.do_batch);
    auto gk = gmem_tensor(a.k, d, rows_k, a.heads_kv, batch, a.k_row, a.k_head, a.k_batch);
    auto gv = gmem_tensor(a.v, d, rows_k, a.heads_kv, batch, a.v_row, a.v_head, a.v_batch);
    return {a,
            make_tma_copy(SM90_TMA_LOAD{}, gq, SmemLayoutQ{}),
            make_tma_copy(SM90_TMA_LOAD{}, gdo, SmemLayoutQ{}),
            make_tma_copy(SM90_TMA_LOAD{}, gk, take<0, 2>(SmemLayoutK{})),
            make_tma_copy(SM90_TMA_LOAD{}, gv, take<0, 2>(SmemLayoutK{})),
            a.softmax_scale * 1.44269504088896340736f};
  }

  // The key blocks query block m_block of sequence `s` sees: [first, end).
  CUTE_HOST_DEVICE static int first_key_block(const BwdArgs& a, const BwdSeq& s, int m_block) {
    if (a.window_left < 0) return 0;
    const int key = m_block * kBlockM + (s.seqlen_k - s.seqlen_q) - a.window_left;
    return key <= 0 ? 0 : key / kBlockN;
  }
  CUTE_HOST_DEVICE static int end_key_block(const BwdArgs& a, const BwdSeq& s, int m_block) {
    const int blocks = (s.seqlen_k + kBlockN - 1) / kBlockN;
    if (a.window_right < 0) return blocks;
    const int row_last = min((m_block + 1) * kBlockM, s.seqlen_q) - 1;
    const int key_last = row_last + (s.seqlen_k - s.seqlen_q) + a.window_right;
    return key_last < 0 ? 0 : min(blocks, key_last / kBlockN + 1);
  }
  CUTE_HOST_DEVICE static int query_blocks(const BwdArgs& a) {
    return (a.seqlen_q + kBlockM - 1) / kBlockM;
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1)
    attn_bwd_sm90_dq_pass_kernel(const __grid_constant__ typename Kernel::Params params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Element = typename Kernel::Element;
  constexpr int kBlockM = Kernel::kBlockM, kBlockN = Kernel::kBlockN;
  constexpr int kHeadDim = Kernel::kHeadDim;
  using SharedStorage = typename Kernel::SharedStorage;
  using PipelineK = typename Kernel::PipelineK;
  using PipelineV = typename Kernel::PipelineV;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  extern __shared__ __align__(1024) char smem_raw[];  // the 128-byte swizzle needs 1024
  SharedStorage& shared = *reinterpret_cast<SharedStorage*>(smem_raw);
  const BwdArgs& a = params.args;

  // Last query block first: blockIdx.y counts down the query blocks, blockIdx.x is (head, batch).
  const int m_block = gridDim.y - 1 - blockIdx.y;
  const int head = blockIdx.x % a.heads_q, batch = blockIdx.x / a.heads_q;
  const int head_kv = head / (a.heads_q / a.heads_kv);
  const bool varlen = a.cu_seqlens_q != nullptr;
  const BwdSeq seq = bwd_seq(a, batch);
  // Varlen: the grid has the longest sequence's query blocks; a shorter one's extra CTAs leave
  // before any barrier, writing nothing.
  if (varlen && m_block * kBlockM >= seq.seqlen_q) return;
  const int b = varlen ? 0 : batch;
  const int n_first = Kernel::first_key_block(a, seq, m_block);
  const int n_count = max(0, Kernel::end_key_block(a, seq, m_block) - n_first);

  Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename Kernel::SmemLayoutQ{});
  Tensor sDo = make_tensor(make_smem_ptr(shared.dout.data()), typename Kernel::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename Kernel::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(shared.v.data()), typename Kernel::SmemLayoutV{});
  Tensor sKt = make_tensor(make_smem_ptr(shared.k.data()), typename Kernel::SmemLayoutKt{});

  constexpr uint32_t kTileBytes = kBlockN * kHeadDim * sizeof(Element);
  typename PipelineK::Params pk;
  pk.transaction_bytes = kTileBytes;
  pk.role =
      threadIdx.x < 128 ? PipelineK::ThreadCategory::Producer : PipelineK::ThreadCategory::Consumer;
  pk.is_leader = threadIdx.x == 0;
  pk.num_consumers = 256;
  PipelineK pipe_k(shared.pipe_k, pk, Shape<_1, _1, _1>{});
  typename PipelineV::Params pv;
  pv.transaction_bytes = kTileBytes;
  pv.role =
      threadIdx.x < 128 ? PipelineV::ThreadCategory::Producer : PipelineV::ThreadCategory::Consumer;
  pv.is_leader = threadIdx.x == 0;
  pv.num_consumers = 256;
  PipelineV pipe_v(shared.pipe_v, pv, Shape<_1, _1, _1>{});
  if (threadIdx.x == 0) TxBarrier::init(&shared.q_full, 1);
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  if (threadIdx.x < 128) {  // producer
    cutlass::arch::warpgroup_reg_dealloc<Kernel::kProducerRegisters>();
    if (threadIdx.x != 0 || n_count == 0) return;
    const int rows_q = max(Kernel::Main::q_rows(a), 1), rows_k = max(Kernel::Main::k_rows(a), 1);
    const int batch_extent = Kernel::Main::batches(a);
    Tensor mQ =
        params.tma_q.get_tma_tensor(make_shape(rows_q, Int<kHeadDim>{}, a.heads_q, batch_extent));
    Tensor mDo =
        params.tma_do.get_tma_tensor(make_shape(rows_q, Int<kHeadDim>{}, a.heads_q, batch_extent));
    Tensor mK =
        params.tma_k.get_tma_tensor(make_shape(rows_k, Int<kHeadDim>{}, a.heads_kv, batch_extent));
    Tensor mV =
        params.tma_v.get_tma_tensor(make_shape(rows_k, Int<kHeadDim>{}, a.heads_kv, batch_extent));
    Tensor gQ = local_tile(domain_offset(make_coord(seq.q_offset, _0{}), mQ(_, _, head, b)),
                           Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, 0));
    Tensor gDo = local_tile(domain_offset(make_coord(seq.q_offset, _0{}), mDo(_, _, head, b)),
                            Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, 0));
    auto [tQg, tQs] = tma_partition(params.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                    group_modes<0, 2>(gQ));
    auto [tDog, tDos] = tma_partition(params.tma_do, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sDo),
                                      group_modes<0, 2>(gDo));
    const int64_t row0 =
        (int64_t(batch) * a.heads_q + head) * a.seqlen_q_padded + int64_t(m_block) * kBlockM;
    TxBarrier::arrive_and_expect_tx(
        &shared.q_full, 2 * kBlockM * kHeadDim * sizeof(Element) + 2 * kBlockM * sizeof(float));
    copy(params.tma_q.with(shared.q_full), tQg, tQs);
    copy(params.tma_do.with(shared.q_full), tDog, tDos);
    SM90_BULK_COPY_G2S::copy(a.lse_log2 + row0, &shared.q_full, shared.lse_log2,
                             kBlockM * sizeof(float));
    SM90_BULK_COPY_G2S::copy(a.dsum + row0, &shared.q_full, shared.dsum, kBlockM * sizeof(float));

    Tensor gK = local_tile(domain_offset(make_coord(seq.k_offset, _0{}), mK(_, _, head_kv, b)),
                           Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));
    Tensor gV = local_tile(domain_offset(make_coord(seq.k_offset, _0{}), mV(_, _, head_kv, b)),
                           Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, 0));
    auto [tKg, tKs] = tma_partition(params.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                    group_modes<0, 2>(gK));
    auto [tVg, tVs] = tma_partition(params.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                    group_modes<0, 2>(gV));
    auto state_k = cutlass::make_producer_start_state<PipelineK>();
    auto state_v = cutlass::make_producer_start_state<PipelineV>();
    for (int i = 0; i < n_count; ++i) {
      const int n_block = n_first + i;
      pipe_k.producer_acquire(state_k);
      copy(params.tma_k.with(*pipe_k.producer_get_barrier(state_k)), tKg(_, n_block),
           tKs(_, state_k.index()));
      pipe_v.producer_acquire(state_v);
      copy(params.tma_v.with(*pipe_v.producer_get_barrier(state_v)), tVg(_, n_block), tVs(_, 0));
      ++state_k;
      ++state_v;
    }
    return;
  }

  // consumers
  cutlass::arch::warpgroup_reg_alloc<Kernel::kConsumerRegisters>();
  const int tid = threadIdx.x - 128;
  typename Kernel::MmaSdP mma_sdp;
  typename Kernel::MmaDq mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);

  Tensor tSrQ = thr_sdp.partition_fragment_A(sQ);    // (MMA, M, K)
  Tensor tSrDo = thr_sdp.partition_fragment_A(sDo);  // (MMA, M, K)
  Tensor tSrK = thr_sdp.partition_fragment_B(sK);    // (MMA, N, K, stage)
  Tensor tSrV = thr_sdp.partition_fragment_B(sV);    // (MMA, N, K, 1)
  Tensor tDqrKt = thr_dq.partition_fragment_B(sKt);  // (MMA, N, K, stage)

  Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tSrDp = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor s_rc = make_tensor(tSrS.data(), acc_rows_cols(tSrS.layout()));  // (query, key)
  Tensor dp_rc = make_tensor(tSrDp.data(), acc_rows_cols(tSrDp.layout()));
  Tensor tDqrDq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rows_cols(tScS.layout()));
  // dS in the input type: the A operand of dQ += dS K.
  Tensor ds = make_tensor_like<Element>(tSrS);
  Tensor tDqrDs = make_tensor(ds.data(), acc_as_a_operand(ds.layout()));
  Tensor ds_pairs = recast<uint32_t>(ds);

  clear(tDqrDq);
  const int diag = seq.seqlen_k - seq.seqlen_q;  // key j visible to query i around j = i + diag
  const int m0 = m_block * kBlockM;
  typename PipelineK::PipelineState state_k;
  typename PipelineV::PipelineState state_v;
  if (n_count > 0) TxBarrier::wait(&shared.q_full, 0);
  for (int i = 0; i < n_count; ++i) {
    const int n_block = n_first + i, stage = state_k.index();
    const auto issue_sdp = [&](auto const& t_a, auto const& t_b, auto& t_c) {
      warpgroup_fence_operand(t_c);
      warpgroup_arrive();
      mma_sdp.accumulate_ = GMMA::ScaleOut::Zero;
      for (int k = 0; k < size<2>(t_a); ++k) {
        gemm(mma_sdp, t_a(_, _, k), t_b(_, _, k), t_c);
        mma_sdp.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
    };
    // dP first, so that V is released as early as possible (it has one stage).
    pipe_v.consumer_wait(state_v);
    issue_sdp(tSrDo, tSrV(_, _, _, 0), tSrDp);
    pipe_k.consumer_wait(state_k);
    issue_sdp(tSrQ, tSrK(_, _, _, stage), tSrS);
    warpgroup_wait<1>();  // dP
    warpgroup_fence_operand(tSrDp);
    pipe_v.consumer_release(state_v);
    warpgroup_wait<0>();  // S
    warpgroup_fence_operand(tSrS);

    // Query m0 + r sees key key0 + c iff r + lo <= c <= r + hi (and key0 + c < seqlen_k); a side
    // the block lies inside is moved out of reach.
    const int key0 = n_block * kBlockN;
    constexpr int kFar = 1 << 28;
    const int hi = a.window_right >= 0 && key0 + kBlockN - 1 > m0 + diag + a.window_right
                       ? m0 + diag + a.window_right - key0
                       : kFar;
    const int lo = a.window_left >= 0 && key0 < m0 + kBlockM - 1 + diag - a.window_left
                       ? m0 + diag - a.window_left - key0
                       : -kFar;
    const int keys_in_block = seq.seqlen_k - key0;
    const auto ds_from = [&](auto hidden) {
      for (int r = 0; r < size<0>(s_rc); ++r) {
        const int row = get<0>(tScS_rc(r, 0));
        const float lse = shared.lse_log2[row], dsum = shared.dsum[row];
        for (int c = 0; c < size<1>(s_rc); ++c) {
          const float p = exp2_ftz(s_rc(r, c) * params.scale_log2 - lse);
          const float d = p * (dp_rc(r, c) - dsum);
          dp_rc(r, c) = hidden(row, get<1>(tScS_rc(0, c))) ? 0.0f : d;
        }
      }
    };
    if (hi != kFar || lo != -kFar || keys_in_block < kBlockN) {
      ds_from([&](int row, int col) {
        return col > row + hi || col < row + lo || col >= keys_in_block;
      });
    } else {
      ds_from([](int, int) { return false; });
    }
    for (int j = 0; j < size(ds_pairs); ++j) {
      ds_pairs(j) = pack_pair<Element>(tSrDp(2 * j), tSrDp(2 * j + 1));
    }

    warpgroup_fence_operand(tDqrDq);
    warpgroup_fence_operand(tDqrDs);
    warpgroup_arrive();
    for (int k = 0; k < size<2>(tDqrDs); ++k) {
      gemm(mma_dq, tDqrDs(_, _, k), tDqrKt(_, _, k, stage), tDqrDq);
    }
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(tDqrDq);
    warpgroup_fence_operand(tDqrDs);
    pipe_k.consumer_release(state_k);
    ++state_k;
    ++state_v;
  }

  // dQ * softmax_scale for the block's queries below seqlen_q (zeros where no key is seen).
  Tensor tDqcDq = thr_dq.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Element* dq = static_cast<Element*>(a.dq) + b * a.dq_batch + head * a.dq_head +
                int64_t(seq.q_offset) * a.dq_row;
  for (int i = 0; i < size(tDqrDq); i += 2) {
    const int row = m0 + get<0>(tDqcDq(i)), col = get<1>(tDqcDq(i));
    if (row < seq.seqlen_q && col < a.head_dim) {
      *reinterpret_cast<uint32_t*>(dq + int64_t(row) * a.dq_row + col) =
          pack_pair<Element>(tDqrDq(i) * a.softmax_scale, tDqrDq(i + 1) * a.softmax_scale);
    }
  }
#endif
}

// Launches the dQ pass for `args` on `stream`: (batch x query heads) x query blocks.
template <class Kernel>
cudaError_t run_dq_pass(const BwdArgs& args, cudaStream_t stream) {
  const int64_t bh = int64_t(args.batch) * args.heads_q;
  const int64_t m_blocks = Kernel::query_blocks(args);
  if (bh == 0 || m_blocks == 0) return cudaSuccess;
  if (bh > INT32_MAX || m_blocks > 65535) return cudaErrorInvalidValue;
  const auto params = Kernel::make_params(args);
  auto* kernel = attn_bwd_sm90_dq_pass_kernel<Kernel>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Kernel::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(bh), static_cast<unsigned>(m_blocks));
  kernel<<<grid, Kernel::kThreads, Kernel::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace attention
