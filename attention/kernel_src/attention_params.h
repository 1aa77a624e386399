// attention_params.h: the torch-free contract between the Torch-facing layer (torch-ext/) and the
// CPU and CUDA implementations of the attention forward (kernel_src/). One parameter struct and
// one entry point per backend; the CUDA side dispatches to kernels per architecture behind it
// (stage 1: an sm_80+ mma.sync kernel for every capability 8.0 .. 12.0; on capability 9.0 a
// Hopper wgmma/TMA kernel for the params attention_sm90.h's rule admits). The backward
// (AttnBwdParams, below): the CPU, and mma.sync kernels on sm_80+ (attention_bwd_kernel.cuh).
//
// Semantics (flash-attn 2 forward), per batch b, query head h, query row i:
//   hk = h / (heads_q / heads_kv)                                       (MQA / GQA)
//   s_j = softmax_scale * <q_i, k_j>                                   j < len_k(b)
//   softcap > 0:  s_j = softcap * tanh(s_j / softcap)                   (applied before the bias)
//   alibi:        s_j += -slope[b][h] * |i + len_k - len_q - j|  (flash-attn's alibi, with causal
//                 the same as slope * (j - (i + len_k - len_q)) for the visible j)
//   masks (bottom-right aligned, flash-attn >= 2.1): let d = i + len_k(b) - len_q(b):
//     causal:                  j <= d
//     window (left, right):    d - left <= j <= d + right   (a negative side is unbounded;
//                              causal is window (left, 0))
//   p = softmax over the visible j (fp32, online, max-subtracted);  out_i = sum_j p_j v_j
//   lse_i = log(sum_j exp(s_j)) in natural log over the visible j (the score scale included);
//   a row with no visible key (possible with windows or len_k = 0) gives out_i = 0 and
//   lse_i = +inf (flash-attn's convention). NaN propagates as in PyTorch's SDPA: a NaN in q_i or
//   in a visible k_j makes out_i and lse_i NaN, a NaN in a visible v_j makes out_i NaN.
// All accumulation in fp32; q/k/v/out fp16 or bf16 on CUDA (fp32 too on CPU), out rounded once.
//
// Layout: q, k, v, out are strided views with unit stride along the head dim:
//   q   [batch, seqlen_q, heads_q, head_dim]     (varlen: batch = 1 view of [total_q, H, D] packed
//                                                 rows, sequences delimited by cu_seqlens_q)
//   k/v [batch_k, seqlen_k, heads_kv, head_dim]  (varlen: packed by cu_seqlens_k; paged: the
//                                                 cache [num_blocks, page_block_size, heads_kv, D])
// Key length of batch b: seqused_k[b] if given, else cu_seqlens_k[b+1] - cu_seqlens_k[b]
// (varlen), else seqlen_k. Query length: cu_seqlens_q[b+1] - cu_seqlens_q[b] (varlen) or seqlen_q.
// K/V row j of batch b lives at:
//   paged:   block block_table[b * block_table_batch_stride + j / page_block_size], row
//            j % page_block_size of that block (k_batch_stride = stride between blocks)
//   varlen:  row cu_seqlens_k[b] + j of the packed tensor
//   else:    batch kv_batch_idx ? kv_batch_idx[b] : b, row j      (cache_batch_idx)
//   leftpad_k[b] (optional, not with paged or varlen): rows start at leftpad_k[b]; len_k(b) then
//            counts from there (flash-attn's cache_leftpad)
// Every index read from an int32 array (cu_seqlens, seqused_k, block_table, kv_batch_idx,
// leftpad_k) is range-checked by the torch layer where it can be without a device sync (shapes,
// dtypes); values are trusted by the kernels except where noted in the backend headers. One
// value is checked by every backend: a key length past the rows the sequence has (seqlen_k -
// leftpad_k[b], the cu_seqlens_k difference, or the max_blocks * page_block_size rows of its
// block-table row; seqlen_k is that bound when paged). The CPU raises; the CUDA kernel reads no
// key of that sequence, writes NaN into its out and lse rows and reports it to `errors`
// (device_errors.h).
//
// Split-KV (flash-decoding): num_splits > 1 divides each (b, hk) key range into num_splits
// chunks computed independently into out_accum [num_splits, batch, heads_q, seqlen_q, head_dim]
// fp32 and lse_accum [num_splits, batch, heads_q, seqlen_q] fp32 (workspaces of the caller, laid
// out contiguously with max seqlen_q for varlen), then combined into out / lse. num_splits = 0
// lets the backend choose (CUDA: by occupancy; CPU: 1). The caller allocates the workspaces for
// the splits its backend asks for (CUDA: attn_fwd_accum_splits, 0 when the splits merge inside a
// thread-block cluster; CPU: attn_fwd_num_splits, always 1).
#pragma once

#include <cstdint>

#include "device_errors.h"
#include "pdl_request.h"

namespace attention {

// kFloat64: the CPU only (float64 gradient checks); the GPU paths take kFloat16 and kBFloat16.
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };

struct AttnFwdParams {
  DType dtype = DType::kBFloat16;  // q, k, v, out
  int64_t batch = 0;               // sequences (varlen: number of sequences)
  int64_t heads_q = 0;
  int64_t heads_kv = 0;  // divides heads_q
  int64_t head_dim = 0;  // CUDA: a multiple of 8 in [8, 256]; CPU: any > 0
  int64_t seqlen_q = 0;  // padded length, or max over sequences (varlen)
  int64_t seqlen_k = 0;  // padded length, or max (varlen / paged: an upper bound)

  const void* q = nullptr;
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  const void* k = nullptr;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  const void* v = nullptr;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  void* out = nullptr;
  int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;
  float* lse = nullptr;  // optional: [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q])
  int64_t lse_batch_stride = 0, lse_head_stride = 0;  // row stride 1

  const int32_t* cu_seqlens_q = nullptr;  // varlen: [batch + 1]
  const int32_t* cu_seqlens_k = nullptr;  // varlen K/V (not with paged)
  int64_t total_q = 0;                    // varlen: rows of the packed q (and out)
  int64_t total_k = 0;                    // varlen K/V: rows of the packed k and v
  const int32_t* seqused_k = nullptr;     // [batch] keys used per sequence (cache_seqlens)
  const int32_t* kv_batch_idx = nullptr;  // [batch] cache_batch_idx
  const int32_t* leftpad_k = nullptr;     // [batch] cache_leftpad

  const int32_t* block_table = nullptr;  // paged: [batch, max_blocks_per_seq]
  int64_t block_table_batch_stride = 0;
  int64_t page_block_size = 0;  // rows per cache block
  int64_t num_blocks = 0;       // blocks in the cache (for range checks)

  float softmax_scale = 1.0f;
  float softcap = 0.0f;  // 0: none
  bool causal = false;
  int64_t window_left = -1;  // -1: unbounded
  int64_t window_right = -1;
  const float* alibi_slopes = nullptr;  // [heads_q] or [batch, heads_q] fp32
  int64_t alibi_batch_stride = 0;       // 0 for [heads_q]

  int64_t num_splits = 1;  // see above; 0: backend's choice
  float* out_accum = nullptr;
  float* lse_accum = nullptr;

  pdl::Request pdl_request = pdl::Request::kDefault;  // enable_pdl (pdl_request.h; CUDA only)
  // false: split-KV partials always merge in the combine kernel, never in a thread-block cluster
  // (CUDA sm_90+ only; an A/B switch for benchmarks and tests, same results either way).
  bool allow_cluster_merge = true;
  // One int32, zeroed, where attn_fwd_tile_counter_needed(params) asks for it (attention_cuda.h):
  // the Hopper kernel's CTAs take their tiles from it in order, which balances causal tiles of
  // unequal length. Null runs the same tiles in a fixed round robin.
  int32_t* tile_counter = nullptr;
  // false: the stage-1 kernels run every call, also those the Hopper kernel would take on
  // capability 9.0 (attention_sm90.h); an A/B switch for benchmarks and tests. The two paths agree
  // within the error bound of the tests, not bit for bit.
  bool allow_hopper = true;

  DeviceErrorRecord* errors = nullptr;  // CUDA: where a bad key length is reported (null: nowhere)
  DeviceErrorOp error_op = DeviceErrorOp::kNone;
};

// The backward of the forward above: the gradients dq, dk, dv of a loss whose gradient with
// respect to out is dout, given the forward's out and lse (fwd.lse must be set). fwd carries the
// forward's tensors and options; the backward takes dense and varlen batches (cu_seqlens_q / _k)
// without paging, seqused_k, kv_batch_idx, leftpad_k or splits. dout has out's layout, dq q's,
// dk and dv those of k and v (for GQA / MQA, dk and dv sum over the query heads of each kv head).
// Written in full (rows no query sees get zeros); accumulation in fp32, each gradient rounded
// once.
struct AttnBwdParams {
  AttnFwdParams fwd;
  const void* dout = nullptr;
  int64_t dout_batch_stride = 0, dout_row_stride = 0, dout_head_stride = 0;
  void* dq = nullptr;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  void* dk = nullptr;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  void* dv = nullptr;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;
  // CUDA: null runs dQ in a pass of its own, without atomics (flash-attn's deterministic = true:
  // the same bits on every run). Set, dQ is added into this fp32 workspace of [q_rows][heads_q]
  // [head_dim] (zeroed by the caller; q_rows = batch * seqlen_q, or total_q for varlen) with
  // atomics during the dK/dV pass and then converted into dq (deterministic = false): 5 GEMMs
  // instead of 7, but dq may differ in its last bits from run to run, since the order of the
  // adds varies. dk and dv are the same bits either way. The CPU ignores it (always
  // deterministic).
  float* dq_accum = nullptr;
};

}  // namespace attention
