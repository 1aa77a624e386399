// rope_params.h: the torch-free contract between the Torch-facing layer (torch-ext/) and the CPU
// and CUDA implementations of the rotary embedding (kernel_src/). Plain pointers, element strides
// and sizes only; every public calling convention (vLLM, sgl, flash-attn, transformers,
// kernels-community, LTX-Video) is mapped onto this one description by the Python layer, with
// views and no copies.
//
// Activations. Up to two tensors (q and k) are rotated in one call. Each is a 4-D strided view
// [batch, seqlen, heads, head_dim] with unit stride along head_dim; q and k share batch and
// seqlen (and therefore the table rows) but not heads or strides. The output of a tensor has its
// own strides and may be the input itself (in place; every element is written only by the thread
// that read it, after it read it).
//
// Rotation. The first rot_dim channels of each head are rotated in rot_dim / 2 pairs (a_i, b_i),
// i < rot_dim / 2; channels [rot_dim, head_dim) pass through (copied when out != in, untouched in
// place). Pair layouts:
//   kNeox (half split, rotate_half):  a_i = x[i],      b_i = x[i + rot_dim / 2]
//   kInterleaved (GPT-J):             a_i = x[2 i],    b_i = x[2 i + 1]
// With coefficients (ca, sa) for a_i's output and (cb, sb) for b_i's (all math in fp32, rounded
// once to the output dtype):
//   forward:    a' = a * ca - b * sa        b' = b * cb + a * sb
//   transpose:  a' = a * ca + b * sb        b' = b * cb - a * sa
// Both implementations evaluate each output as two rounded fp32 products and one rounded fp32
// sum or difference (no FMA contraction), so CPU and CUDA results agree bit for bit.
// `transpose` is the adjoint (the backward) of the forward; with a half table (ca = cb, sa = sb)
// it is the rotation by -theta, flash-attn's `conjugate`.
//
// Tables (cos and sin: two pointers with the same strides, dtype fp32 or the activation dtype):
//   kHalf: one coefficient per pair: ca = cb = cos[row][i], sa = sb = sin[row][i], i < rot/2
//          (vLLM's cos_sin_cache halves, flash-attn's cos/sin [seqlen_ro, rot/2]).
//   kFull: one coefficient per channel: ca = cos[row][c(a_i)], cb = cos[row][c(b_i)] (and the
//          same for sin) where c(.) is the channel index within the head; transformers' cos/sin
//          [B, S, head_dim] and LTX-Video's per-channel [B, S, heads * head_dim] tables (the
//          latter through head_stride = head_dim).
// The entry of token (b, s), head h, column j is
//   cos + table_batch_stride * tb + row * row_stride + h * head_stride + j
// with tb = (table_batch == 1 ? 0 : b) and row from the row mode:
//   kPositions:  row = positions[b * positions_batch_stride + s * positions_seq_stride]
//                (int64 or int32; vLLM / sgl)
//   kSequence:   row = s + seqlen_offset + (seqlen_offsets ? seqlen_offsets[b] : 0)
//                (flash-attn padded batches, transformers / LTX with row = s)
//   kVarlen:     tokens are packed: batch = 1, seqlen = total tokens; the token t belongs to the
//                sequence q with cu_seqlens[q] <= t < cu_seqlens[q + 1] (num_seqs sequences,
//                cu_seqlens int32, non-decreasing, cu_seqlens[0] = 0, cu_seqlens[num_seqs] =
//                seqlen), and row = t - cu_seqlens[q] + seqlen_offset
//                + (seqlen_offsets ? seqlen_offsets[q] : 0)   (flash-attn varlen)
// Every row must satisfy 0 <= row < table_rows. The implementations never read outside the
// table: the CPU one throws (naming `positions` or the offsets), the CUDA one stops the kernel
// with a device-side assertion message that names them. A varlen token outside
// [cu_seqlens[0], cu_seqlens[num_seqs]) is reported the same way (naming cu_seqlens); the CUDA
// kernel checks nothing else of cu_seqlens' form (the CPU one does), but never reads outside it.
// head_stride may be 0 (one table for all heads; heads of q and k then share it); with
// head_stride != 0 the table has one entry per head of the tensor being rotated (table_heads must
// equal that tensor's heads).
#pragma once

#include <cstdint>

#include "pdl_request.h"

namespace rope {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
enum class PairLayout : int { kNeox = 0, kInterleaved = 1 };
enum class TableKind : int { kHalf = 0, kFull = 1 };
enum class RowMode : int { kPositions = 0, kSequence = 1, kVarlen = 2 };

// One activation tensor to rotate (q or k). Unused (k absent): in == nullptr.
struct RopeTensor {
  const void* in = nullptr;  // [batch, seqlen, heads, head_dim], unit stride along head_dim
  void* out = nullptr;       // same shape; may equal `in` (in place, then the same strides)
  int64_t heads = 0;
  int64_t in_batch_stride = 0, in_seq_stride = 0, in_head_stride = 0;
  int64_t out_batch_stride = 0, out_seq_stride = 0, out_head_stride = 0;
};

struct RopeParams {
  int64_t batch = 0;
  int64_t seqlen = 0;
  int64_t head_dim = 0;                 // channels per head, >= rot_dim
  int64_t rot_dim = 0;                  // rotated channels per head: even, > 0
  DType dtype = DType::kFloat32;        // q, k and their outputs
  DType table_dtype = DType::kFloat32;  // cos and sin: kFloat32 or `dtype`
  PairLayout layout = PairLayout::kNeox;
  TableKind table_kind = TableKind::kHalf;
  bool transpose = false;

  RopeTensor q;
  RopeTensor k;  // k.in == nullptr: q only

  // Tables: width rot_dim / 2 (kHalf) or rot_dim (kFull) columns from the row start.
  const void* cos = nullptr;
  const void* sin = nullptr;  // same strides as cos
  int64_t table_batch = 1;    // 1 (shared by all b) or batch
  int64_t table_rows = 0;
  int64_t table_heads = 1;  // 1 when head_stride == 0
  int64_t table_batch_stride = 0, row_stride = 0, head_stride = 0;

  RowMode row_mode = RowMode::kSequence;
  const void* positions = nullptr;  // kPositions
  bool positions_int32 = false;
  int64_t positions_batch_stride = 0, positions_seq_stride = 0;
  int64_t seqlen_offset = 0;                // kSequence, kVarlen
  const int32_t* seqlen_offsets = nullptr;  // [batch] (kSequence) or [num_seqs] (kVarlen), or null
  const int32_t* cu_seqlens = nullptr;      // kVarlen: [num_seqs + 1]
  int64_t num_seqs = 0;

  pdl::Request pdl_request = pdl::Request::kDefault;  // enable_pdl (pdl_request.h)
};

}  // namespace rope
