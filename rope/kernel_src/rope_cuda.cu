// rope_cuda.cu: CUDA kernel and host launcher of the rotary position embedding (rope_cuda.h).
//
// What it computes (rope_params.h): for every token (b, s) of up to two 4-D strided tensors q and
// k ([batch, seqlen, heads, head_dim]) and every head, the first rot_dim channels are rotated in
// rot_dim / 2 pairs (a, b) by coefficients read from the row of a cos/sin table that the token's
// position selects:
//   forward:    a' = a * ca - b * sa     b' = b * cb + a * sb
//   transpose:  a' = a * ca + b * sb     b' = b * cb - a * sa
// in fp32, two rounded products and a rounded sum or difference (never contracted into an FMA:
// the same bits as rope_cpu.cpp and as PyTorch's eager fp32 formula), then rounded once to the
// output dtype, to nearest even. Pairs are NeoX halves (a = x[i], b = x[i + rot/2]) or
// interleaved (x[2i], x[2i + 1]); a half table has one (cos, sin) per pair, a full table one per
// channel. The row of a token is positions[b, s], s + seqlen_offset (+ seqlen_offsets[b]), or,
// for packed varlen batches, the token's index inside its cu_seqlens sequence plus the offsets.
// Channels [rot_dim, head_dim) are copied when out != in and left alone in place.
// Dtypes: q, k and their outputs fp32/fp16/bf16; cos/sin fp32 or the activation dtype (5
// combinations, one template instance each per pair layout, table kind and access width: 40
// kernels); all math in fp32. bf16 only goes through conversions (emulated on sm_75), so it
// builds for sm_75 .. sm_120.
// Layout: unit stride along head_dim, any batch/seq/head strides (elements, 64-bit offsets), so
// q and k may be head-strided views of a fused qkv buffer, and any table strides (per batch, row
// and head). Up to 65535^2 token blocks per launch (more take several launches), heads up to
// 2^31 - 1 CTAs along x.
// Rows: every token's row is checked against [0, table_rows) before the table is read. On a bad
// row the token's first thread prints the value and where it came from (positions[b, s], or
// seqlen_offset, seqlen_offsets[.] and cu_seqlens) and stops the kernel with a device-side
// assertion whose message names them as well (cudaErrorAssert at the next synchronization; a
// trap on Windows); no thread reads the table for that token. A varlen token that lies in no
// sequence (cu_seqlens[0] > t or t >= cu_seqlens[num_seqs]) is reported the same way; the binary
// search over cu_seqlens reads only entries 0 .. num_seqs, whatever the array holds.
//
// Design (memory-bound: q and k are read and written once, plus a table row of 256-512 bytes and
// a position per token; the goals are the device copy bandwidth for prefill and one short wave
// for decode):
// - A "unit" is the work of one thread on one head of one token. A rotation unit owns two chunks
//   of kVec elements, A at channel oA and B at channel oB. On the vector path kVec fills 16
//   bytes (8 x fp16/bf16, 4 x fp32) and oA = u kVec, oB = rot/2 + u kVec for both layouts (NeoX:
//   pairs (A[j], B[j]); interleaved: pairs inside each chunk, (A[2j], A[2j+1]) and (B[2j],
//   B[2j+1])): a thread rotates kVec pairs with two 16-byte loads and two 16-byte stores, and
//   consecutive threads touch consecutive 16-byte vectors of both halves of a head, so every
//   warp-wide access is contiguous per head. Its table chunks are at the same columns (full
//   table), at column u kVec (NeoX half table: kVec coefficients) or at oA / 2 and oB / 2
//   (interleaved half table: kVec / 2 each); an fp32 table next to 16-bit activations takes two
//   16-byte loads per chunk. Copy units (out != in only) move one chunk of pass-through channels
//   each. The scalar path is the same kernel with kVec = 1 (one pair per thread: channels u and
//   rot/2 + u, or 2u and 2u + 1), taken when a pointer or stride of q, k, their outputs or the
//   table is not aligned to its chunk, when rot/2 is not a multiple of kVec, or when copied
//   pass-through channels are not. Example, vLLM Llama-3-8B: q [T, 32 x 128] and k [T, 8 x 128]
//   bf16 in a fused qkv buffer, rot 128 NeoX, fp32 half table: 8 units per head, 320 threads per
//   token in 2 CTAs of 160, each thread reading 2 x 16 B of q or k and 2 x 32 B of table (L1 hits
//   after the token's first warp).
// - Index space without divisions: CTA = (units, heads, tokens) threads: x the unit within the
//   head, y the head, counted across q then k (head < q.heads: q, else k, picked per thread), z
//   the token when one CTA holds all heads of a token; grid x = head blocks (a token's heads split
//   evenly over the fewest CTAs of at most kMaxThreads threads), grid y and z = token blocks. The
//   CTAs of a token are adjacent in launch order, so its table row and position come from DRAM
//   once and are reused from L1/L2; q and k share the launch. Every thread does one unit of one
//   token: no loop, no 64-bit division (token -> (b, s) is a multiply-high, and only when
//   batch > 1). A head of more than kMaxThreads units spreads over several CTAs along x (a 32-bit
//   division per thread, that case only).
// - Per thread: the q/k loads are issued first, then the row (one position load, or the offsets,
//   or a binary search over cu_seqlens), then the table loads, which depend on it: the activation
//   loads overlap the row -> table chain, the two dependent round trips a decode call waits for.
//   q/k loads are coherent (out may alias in) and do not allocate in L1, which is left to the
//   table rows; tables and indices go through the read-only path; stores are evict-first
//   (st.global.cs). Accesses: rope_cuda_utils.cuh.
// - The transpose is a uniform branch around the math only (both forms compiled in).
// - Programmatic dependent launch on sm_90+ (pdl.cuh) only with enable_pdl=True (for a token
//   chunk after the first by default; False: none): the kernel waits for its predecessor before its first
//   global access and releases its dependents, so a decode-sized launch after a kernel that
//   releases its dependents overlaps its launch latency with that kernel's tail.
// - Registers (ptxas -v, sm_90a, nvcc 13.0; benchmarks/NOTES.md): 38-40 for the vector instances
//   (48 for fp16 NeoX with a full fp16 table), 64 for full fp32 tables next to 16-bit data, 32 for
//   the scalar path; no spills. The only local memory is printf's argument buffer, on error paths.
// - Launch heuristics live in LaunchConfig and plan_launch only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <type_traits>

#include "dispatch.cuh"
#include "pdl.cuh"
#include "rope_cuda.h"
#include "rope_cuda_utils.cuh"
#include "rope_params.h"

namespace rope {
namespace cuda {
namespace {

using detail::Chunk;
using detail::chunk_from_float;
using detail::FastDivU64;
using detail::Ld;
using detail::load_chunk;
using detail::load_i32;
using detail::load_index;
using detail::St;
using detail::store_chunk;

// ---------------------------------------------------------------------------------------------
// Launch configuration: the only place where the launch heuristics live.
// ---------------------------------------------------------------------------------------------
struct LaunchConfig {
  static constexpr int kVectorBytes = 16;
  // Threads per CTA at most. The heads of a token are spread evenly over the fewest CTAs of at
  // most this many threads (Llama-3-8B bf16: 40 heads x 8 units = 320 threads -> 2 CTAs of 160),
  // and CTAs that hold all heads of a token take several tokens (blockDim.z <= 64) up to it.
  // At 40 registers, 10 such CTAs (1600 threads) are resident per SM: 51 KB of q/k loads in
  // flight, more than Little's law asks of the DRAM (benchmarks/NOTES.md, "Sizing the bytes in
  // flight"); at 64 registers (full fp32 tables with 16-bit data) 1024 threads, 32 KB.
  static constexpr int kMaxThreads = 256;
  static constexpr int kMaxTokensPerCta = 64;  // blockDim.z limit
  static constexpr int64_t kMaxGridYZ = 65535;
  // q/k loads: L1::no_allocate keeps L1 for the table rows that all heads of a token reuse.
  // For a pure stream plain loads beat ld.global.nc.L1::no_allocate (activation/benchmarks/
  // NOTES.md, "Loads"); Ld::kCached is the plain form if a measurement here favours it.
  static constexpr Ld kActivationLoad = Ld::kStream;
};

__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// ---------------------------------------------------------------------------------------------
// Kernel arguments.
// ---------------------------------------------------------------------------------------------
struct TensorArgs {
  const void* in;  // [batch, seqlen, heads, head_dim], unit stride along head_dim
  void* out;       // same shape; may be `in`
  int64_t in_batch_stride, in_seq_stride, in_head_stride;
  int64_t out_batch_stride, out_seq_stride, out_head_stride;
  bool copy;  // out != in and rot_dim < head_dim: the pass-through channels are copied
};

struct RopeArgs {
  TensorArgs q, k;
  int64_t q_heads;  // heads [0, q_heads) of the flat head index are q's
  int64_t heads;    // q_heads + k's heads
  int64_t tokens;   // batch x seqlen
  int64_t seqlen;
  FastDivU64 seq_div;  // t / seqlen, used when batched
  bool batched;        // batch > 1
  const void* cos;
  const void* sin;
  int64_t table_batch_stride;  // 0 when table_batch == 1
  int64_t row_stride;
  int64_t head_stride;
  int64_t table_rows;
  RowMode row_mode;
  const void* positions;  // kPositions: int64 or int32
  bool positions_int32;
  int64_t positions_batch_stride, positions_seq_stride;
  int64_t seqlen_offset;          // kSequence, kVarlen
  const int32_t* seqlen_offsets;  // [batch] (kSequence), [num_seqs] (kVarlen) or null
  const int32_t* cu_seqlens;      // kVarlen: [num_seqs + 1]
  int64_t num_seqs;
  int half_rot;  // rot_dim / 2
  int rot_dim;
  int rot_units;             // units [0, rot_units) of a head rotate
  int units;                 // [rot_units, units) copy pass-through chunks
  int unit_blocks;           // CTAs per head along x (1 unless units > kMaxThreads)
  int64_t token_block_base;  // token blocks of earlier launches (more than 65535^2)
  bool transpose;
};

// q's or k's description, selected field by field (registers, no indexing into the params).
__device__ __forceinline__ TensorArgs pick_tensor(bool second, const TensorArgs& q,
                                                  const TensorArgs& k) {
  TensorArgs r;
  r.in = second ? k.in : q.in;
  r.out = second ? k.out : q.out;
  r.in_batch_stride = second ? k.in_batch_stride : q.in_batch_stride;
  r.in_seq_stride = second ? k.in_seq_stride : q.in_seq_stride;
  r.in_head_stride = second ? k.in_head_stride : q.in_head_stride;
  r.out_batch_stride = second ? k.out_batch_stride : q.out_batch_stride;
  r.out_seq_stride = second ? k.out_seq_stride : q.out_seq_stride;
  r.out_head_stride = second ? k.out_head_stride : q.out_head_stride;
  r.copy = second ? k.copy : q.copy;
  return r;
}

// ---------------------------------------------------------------------------------------------
// Rows. The first thread of a token (head 0, unit 0) reports a row outside the table and stops
// the kernel; the other threads of the token only skip it (one message per bad token).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void stop_kernel(const char* what) {
#if defined(__CUDA_ARCH__) && !defined(_WIN32)
  __assert_fail(what, __FILE__, __LINE__, __func__);  // cudaErrorAssert, as assert() gives
#else
  (void)what;
  __trap();
#endif
}

// The values are printed by the token's first thread; the assertion message names the argument
// as well, so that the error raised at the next synchronization says where to look.
__device__ __noinline__ void report_bad_position(long long b, long long s, long long row,
                                                 long long table_rows) {
  printf("rope: positions[%lld, %lld] = %lld is outside the cos/sin table of %lld rows\n", b, s,
         row, table_rows);
  stop_kernel("rope: positions must lie in [0, rows of the cos/sin table)");
}

// kSequence: idx = b, pos = s; kVarlen: idx = the sequence q, pos = t - cu_seqlens[q].
__device__ __noinline__ void report_bad_offset_row(bool varlen, long long t, long long idx,
                                                   long long pos, long long seqlen_offset,
                                                   bool has_offsets, long long offset,
                                                   long long row, long long table_rows) {
  if (varlen && has_offsets) {
    printf(
        "rope: token %lld, position %lld of sequence %lld of cu_seqlens: row = %lld + "
        "seqlen_offset (%lld) + seqlen_offsets[%lld] (%lld) = %lld is outside the cos/sin "
        "table of %lld rows\n",
        t, pos, idx, pos, seqlen_offset, idx, offset, row, table_rows);
    stop_kernel(
        "rope: (t - cu_seqlens[q]) + seqlen_offset + seqlen_offsets[q] is outside the "
        "cos/sin table");
  } else if (varlen) {
    printf(
        "rope: token %lld, position %lld of sequence %lld of cu_seqlens: row = %lld + "
        "seqlen_offset (%lld) = %lld is outside the cos/sin table of %lld rows\n",
        t, pos, idx, pos, seqlen_offset, row, table_rows);
    stop_kernel("rope: (t - cu_seqlens[q]) + seqlen_offset is outside the cos/sin table");
  } else if (has_offsets) {
    printf(
        "rope: token (%lld, %lld): row = %lld + seqlen_offset (%lld) + seqlen_offsets[%lld] "
        "(%lld) = %lld is outside the cos/sin table of %lld rows\n",
        idx, pos, pos, seqlen_offset, idx, offset, row, table_rows);
    stop_kernel("rope: s + seqlen_offset + seqlen_offsets[b] is outside the cos/sin table");
  } else {
    printf(
        "rope: token (%lld, %lld): row = %lld + seqlen_offset (%lld) = %lld is outside the "
        "cos/sin table of %lld rows\n",
        idx, pos, pos, seqlen_offset, row, table_rows);
    stop_kernel("rope: s + seqlen_offset is outside the cos/sin table");
  }
}

__device__ __noinline__ void report_bad_cu_seqlens(long long t, long long seq, long long begin,
                                                   long long end) {
  printf(
      "rope: token %lld lies in no sequence of cu_seqlens (the search ended at sequence %lld: "
      "cu_seqlens[%lld] = %lld, cu_seqlens[%lld] = %lld); cu_seqlens must rise from 0 to the "
      "token count\n",
      t, seq, seq, begin, seq + 1, end);
  stop_kernel("rope: malformed cu_seqlens (a token lies in no sequence)");
}

// The sequence q of packed token t: the largest q in [0, num_seqs) with cu_seqlens[q] <= t
// (the last of equal entries, so empty sequences are skipped). Only cu_seqlens[1 .. num_seqs-1]
// is read, whatever the array holds; the caller checks cu[q] <= t < cu[q + 1].
__device__ __forceinline__ int64_t find_sequence(const int32_t* cu, int64_t num_seqs, int64_t t) {
  int64_t lo = 0, hi = num_seqs;  // the answer is in [lo, hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + ((hi - lo) >> 1);
    if (load_i32(cu + mid) <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Table row of token t = (b, s); false when it is outside the table (or t in no varlen
// sequence), after the token's lead thread has reported it.
__device__ __forceinline__ bool token_row(const RopeArgs& a, int64_t t, int64_t b, int64_t s,
                                          bool lead, int64_t* row_out) {
  int64_t row;
  if (a.row_mode == RowMode::kPositions) {
    const int64_t i = b * a.positions_batch_stride + s * a.positions_seq_stride;
    const char* p = static_cast<const char*>(a.positions) + i * (a.positions_int32 ? 4 : 8);
    row = load_index(p, a.positions_int32);
    if (row < 0 || row >= a.table_rows) {
      if (lead) report_bad_position(b, s, row, a.table_rows);
      return false;
    }
  } else {
    const bool varlen = a.row_mode == RowMode::kVarlen;
    int64_t idx = b, pos = s;  // kSequence: (b, s)
    if (varlen) {              // batch 1, s == t
      idx = find_sequence(a.cu_seqlens, a.num_seqs, t);
      const int64_t begin = load_i32(a.cu_seqlens + idx);
      const int64_t end = load_i32(a.cu_seqlens + idx + 1);
      if (t < begin || t >= end) {
        if (lead) report_bad_cu_seqlens(t, idx, begin, end);
        return false;
      }
      pos = t - begin;
    }
    const bool has_offsets = a.seqlen_offsets != nullptr;
    const int64_t offset = has_offsets ? load_i32(a.seqlen_offsets + idx) : 0;
    row = pos + a.seqlen_offset + offset;
    if (row < 0 || row >= a.table_rows) {
      if (lead) {
        report_bad_offset_row(varlen, t, idx, pos, a.seqlen_offset, has_offsets, offset, row,
                              a.table_rows);
      }
      return false;
    }
  }
  *row_out = row;
  return true;
}

// ---------------------------------------------------------------------------------------------
// One rotation unit: the chunks, their table columns, the math.
// ---------------------------------------------------------------------------------------------
template <PairLayout kLayout, TableKind kKind, int kVec>
struct UnitShape {
  // Pairs (A[j], B[j]) across the two chunks (NeoX; interleaved with one pair per thread), or
  // (X[2j], X[2j + 1]) inside each chunk X (interleaved vectors).
  static constexpr bool kSplit = kLayout == PairLayout::kNeox || kVec == 1;
  static constexpr bool kHalf = kKind == TableKind::kHalf;
  // Table entries per table chunk, and table chunks per unit (each for cos and for sin).
  static constexpr int kTabN = kHalf && !kSplit ? kVec / 2 : kVec;
  static constexpr int kTabChunks = kHalf && kSplit ? 1 : 2;
  static_assert(kSplit || kVec % 2 == 0, "interleaved vectors hold whole pairs");

  static __device__ __forceinline__ int off_a(int unit, int) {
    return kLayout == PairLayout::kInterleaved && kVec == 1 ? 2 * unit : unit * kVec;
  }
  static __device__ __forceinline__ int off_b(int unit, int half_rot) {
    return kLayout == PairLayout::kInterleaved && kVec == 1 ? 2 * unit + 1 : half_rot + unit * kVec;
  }
  // Column of table chunk i (0: for A, 1: for B) within the table row.
  static __device__ __forceinline__ int table_col(int i, int unit, int half_rot) {
    if constexpr (kHalf && kSplit) {
      return unit * kVec;  // pair index of A[0] (= of B[0])
    } else if constexpr (kHalf) {
      return (i == 0 ? off_a(unit, half_rot) : off_b(unit, half_rot)) / 2;
    } else {
      return i == 0 ? off_a(unit, half_rot) : off_b(unit, half_rot);
    }
  }
};

// The rotation of one pair (rope_params.h); the transpose is the adjoint. Two fp32 products and
// one fp32 sum or difference per output, never contracted into an FMA (the _rn intrinsics), as
// rope_cpu.cpp computes them: CPU and CUDA agree bit for bit, and with PyTorch's eager fp32
// formula. One FMUL more per output than an FMA form, in a memory-bound kernel.
template <bool kTranspose>
__device__ __forceinline__ void rotate_pair(float a, float b, float ca, float sa, float cb,
                                            float sb, float& a_out, float& b_out) {
  if constexpr (!kTranspose) {
    a_out = __fsub_rn(__fmul_rn(a, ca), __fmul_rn(b, sa));
    b_out = __fadd_rn(__fmul_rn(b, cb), __fmul_rn(a, sb));
  } else {
    a_out = __fadd_rn(__fmul_rn(a, ca), __fmul_rn(b, sb));
    b_out = __fsub_rn(__fmul_rn(b, cb), __fmul_rn(a, sa));
  }
}

template <bool kTranspose, PairLayout kLayout, TableKind kKind, typename T, typename Tt, int kVec,
          int kTabN, int kTabChunks>
__device__ __forceinline__ void rotate_chunks(const Chunk<T, kVec>& xa, const Chunk<T, kVec>& xb,
                                              const Chunk<Tt, kTabN> (&c)[kTabChunks],
                                              const Chunk<Tt, kTabN> (&sn)[kTabChunks],
                                              float (&ya)[kVec], float (&yb)[kVec]) {
  using S = UnitShape<kLayout, kKind, kVec>;
  if constexpr (S::kSplit) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float ca = c[0].get(j);
      const float sa = sn[0].get(j);
      float cb = ca, sb = sa;
      if constexpr (!S::kHalf) {
        cb = c[1].get(j);
        sb = sn[1].get(j);
      }
      rotate_pair<kTranspose>(xa.get(j), xb.get(j), ca, sa, cb, sb, ya[j], yb[j]);
    }
  } else {
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const Chunk<T, kVec>& v = x == 0 ? xa : xb;
      float (&y)[kVec] = x == 0 ? ya : yb;
#pragma unroll
      for (int j = 0; j < kVec / 2; ++j) {
        float ca, sa, cb, sb;
        if constexpr (S::kHalf) {
          ca = cb = c[x].get(j);
          sa = sb = sn[x].get(j);
        } else {
          ca = c[x].get(2 * j);
          cb = c[x].get(2 * j + 1);
          sa = sn[x].get(2 * j);
          sb = sn[x].get(2 * j + 1);
        }
        rotate_pair<kTranspose>(v.get(2 * j), v.get(2 * j + 1), ca, sa, cb, sb, y[2 * j],
                                y[2 * j + 1]);
      }
    }
  }
}

template <PairLayout kLayout, TableKind kKind, typename T, typename Tt, int kVec>
__device__ __forceinline__ void rotate_unit(const RopeArgs& a, const T* in, T* out_base,
                                            int64_t out_offset, int64_t t, int64_t b, int64_t s,
                                            int64_t h, int unit, bool lead) {
  using S = UnitShape<kLayout, kKind, kVec>;
  constexpr int kTabN = S::kTabN;
  constexpr int kTabChunks = S::kTabChunks;
  const int oa = S::off_a(unit, a.half_rot);
  const int ob = S::off_b(unit, a.half_rot);
  // q/k first: their latency overlaps the row -> table chain below.
  const Chunk<T, kVec> xa = load_chunk<LaunchConfig::kActivationLoad, T, kVec>(in + oa);
  const Chunk<T, kVec> xb = load_chunk<LaunchConfig::kActivationLoad, T, kVec>(in + ob);
  int64_t row;
  if (!token_row(a, t, b, s, lead, &row)) return;
  const int64_t base = b * a.table_batch_stride + row * a.row_stride + h * a.head_stride;
  const Tt* cos_row = static_cast<const Tt*>(a.cos) + base;
  const Tt* sin_row = static_cast<const Tt*>(a.sin) + base;
  Chunk<Tt, kTabN> c[kTabChunks], sn[kTabChunks];
#pragma unroll
  for (int i = 0; i < kTabChunks; ++i) {
    const int col = S::table_col(i, unit, a.half_rot);
    c[i] = load_chunk<Ld::kReadOnly, Tt, kTabN>(cos_row + col);
    sn[i] = load_chunk<Ld::kReadOnly, Tt, kTabN>(sin_row + col);
  }
  float ya[kVec], yb[kVec];
  if (a.transpose) {
    rotate_chunks<true, kLayout, kKind>(xa, xb, c, sn, ya, yb);
  } else {
    rotate_chunks<false, kLayout, kKind>(xa, xb, c, sn, ya, yb);
  }
  T* out = out_base + out_offset;
  store_chunk<St::kStream>(out + oa, chunk_from_float<T, kVec>(ya));
  store_chunk<St::kStream>(out + ob, chunk_from_float<T, kVec>(yb));
}

// ---------------------------------------------------------------------------------------------
// The kernel: one unit of one head of one token per thread (see the file header).
// ---------------------------------------------------------------------------------------------
template <typename T, typename Tt, PairLayout kLayout, TableKind kKind, int kVec>
__global__ void __launch_bounds__(LaunchConfig::kMaxThreads) rope_kernel(const RopeArgs a) {
  pdl::wait_and_release();
  int64_t head;
  int unit;
  if (a.unit_blocks == 1) {
    head = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
    unit = static_cast<int>(threadIdx.x);
  } else {  // blockDim.y == 1: CTA x covers a slice of the units of one head
    const unsigned head_block = blockIdx.x / static_cast<unsigned>(a.unit_blocks);
    head = head_block;
    unit = static_cast<int>((blockIdx.x - head_block * static_cast<unsigned>(a.unit_blocks)) *
                                blockDim.x +
                            threadIdx.x);
  }
  if (head >= a.heads || unit >= a.units) return;
  const bool is_k = head >= a.q_heads;
  const TensorArgs x = pick_tensor(is_k, a.q, a.k);
  const int64_t h = is_k ? head - a.q_heads : head;  // head within its tensor
  const bool rotates = unit < a.rot_units;
  if (!rotates && !x.copy) return;  // pass-through channels in place: untouched
  const bool lead = head == 0 && unit == 0;
  const int64_t token_block =
      a.token_block_base + blockIdx.y + static_cast<int64_t>(gridDim.y) * blockIdx.z;
  const int64_t t = token_block * blockDim.z + threadIdx.z;
  if (t >= a.tokens) return;
  int64_t b = 0, s = t;
  if (a.batched) {
    b = a.seq_div.div(t);
    s = t - b * a.seqlen;
  }
  const T* in = static_cast<const T*>(x.in) +
                (b * x.in_batch_stride + s * x.in_seq_stride + h * x.in_head_stride);
  const int64_t out_offset = b * x.out_batch_stride + s * x.out_seq_stride + h * x.out_head_stride;
  if (rotates) {
    rotate_unit<kLayout, kKind, T, Tt, kVec>(a, in, static_cast<T*>(x.out), out_offset, t, b, s, h,
                                             unit, lead);
  } else {
    const int off = a.rot_dim + (unit - a.rot_units) * kVec;
    const Chunk<T, kVec> v = load_chunk<LaunchConfig::kActivationLoad, T, kVec>(in + off);
    store_chunk<St::kStream>(static_cast<T*>(x.out) + out_offset + off, v);
  }
}

// ---------------------------------------------------------------------------------------------
// Host side: validation (a backstop; torch-ext/ checks user input), the access width, the
// launch plan, dispatch.
// ---------------------------------------------------------------------------------------------
bool aligned_to(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}
// Every start along a dimension keeps the alignment (irrelevant for an extent of one).
bool stride_keeps(int64_t stride, int64_t extent, int64_t elem_bytes, int64_t bytes) {
  return extent <= 1 || (stride * elem_bytes) % bytes == 0;
}

bool tensor_present(const RopeTensor& x) { return x.in != nullptr && x.heads > 0; }
bool tensor_copies(const RopeParams& p, const RopeTensor& x) {
  return tensor_present(x) && x.out != x.in && p.rot_dim < p.head_dim;
}

// The 16-byte path: every chunk start of every access 16-byte aligned (tables: aligned to their
// chunk, 8 bytes for the 16-bit interleaved half tables), whole chunks in the rotary halves and
// in the pass-through channels that are copied.
template <typename T, typename Tt>
bool vector_path_ok(const RopeParams& p, bool any_copy) {
  constexpr int64_t V = LaunchConfig::kVectorBytes / static_cast<int64_t>(sizeof(T));
  if ((p.rot_dim / 2) % V != 0) return false;
  if (any_copy && (p.head_dim - p.rot_dim) % V != 0) return false;
  const int64_t t_bytes = sizeof(T);
  for (const RopeTensor* x : {&p.q, &p.k}) {
    if (!tensor_present(*x)) continue;
    const int64_t a = LaunchConfig::kVectorBytes;
    if (!aligned_to(x->in, a) || !aligned_to(x->out, a) ||
        !stride_keeps(x->in_batch_stride, p.batch, t_bytes, a) ||
        !stride_keeps(x->in_seq_stride, p.seqlen, t_bytes, a) ||
        !stride_keeps(x->in_head_stride, x->heads, t_bytes, a) ||
        !stride_keeps(x->out_batch_stride, p.batch, t_bytes, a) ||
        !stride_keeps(x->out_seq_stride, p.seqlen, t_bytes, a) ||
        !stride_keeps(x->out_head_stride, x->heads, t_bytes, a)) {
      return false;
    }
  }
  const bool packed_half = p.table_kind == TableKind::kHalf && p.layout == PairLayout::kInterleaved;
  const int64_t tt_bytes = sizeof(Tt);
  const int64_t tab_bytes = (packed_half ? V / 2 : V) * tt_bytes;  // one table chunk
  const int64_t ta = tab_bytes < 16 ? tab_bytes : 16;              // 8, 16, or 2 x 16 bytes
  return aligned_to(p.cos, ta) && aligned_to(p.sin, ta) &&
         stride_keeps(p.table_batch_stride, p.table_batch, tt_bytes, ta) &&
         stride_keeps(p.row_stride, p.table_rows, tt_bytes, ta) &&
         stride_keeps(p.head_stride, p.head_stride != 0 ? p.table_heads : 1, tt_bytes, ta);
}

struct Plan {
  unsigned grid_x;
  dim3 block;
  int unit_blocks;
  int64_t token_blocks;
};

// CTA = (units of a head, heads, tokens) threads; see LaunchConfig. False when the grid cannot
// hold the heads (more than 2^31 - 1 CTAs along x).
bool plan_launch(int64_t heads, int units, int64_t tokens, Plan* plan) {
  const int64_t max_threads = LaunchConfig::kMaxThreads;
  int64_t grid_x, tx, ty = 1, tz = 1;
  if (units > max_threads) {
    plan->unit_blocks = static_cast<int>(ceil_div(units, max_threads));
    tx = ceil_div(units, plan->unit_blocks);
    grid_x = heads * plan->unit_blocks;
  } else {
    plan->unit_blocks = 1;
    tx = units;
    const int64_t head_blocks = ceil_div(heads, max_threads / units);
    ty = ceil_div(heads, head_blocks);  // spread evenly over the head blocks
    grid_x = head_blocks;
    if (head_blocks == 1) {
      int64_t tz_max = max_threads / (tx * ty);
      if (tz_max > LaunchConfig::kMaxTokensPerCta) tz_max = LaunchConfig::kMaxTokensPerCta;
      if (tz_max > tokens) tz_max = tokens;
      tz = ceil_div(tokens, ceil_div(tokens, tz_max));  // spread evenly over the token blocks
    }
  }
  if (grid_x > std::numeric_limits<int32_t>::max()) return false;
  plan->token_blocks = ceil_div(tokens, tz);
  plan->grid_x = static_cast<unsigned>(grid_x);
  plan->block =
      dim3(static_cast<unsigned>(tx), static_cast<unsigned>(ty), static_cast<unsigned>(tz));
  return true;
}

template <typename T, typename Tt, PairLayout kLayout, TableKind kKind, int kVec>
cudaError_t launch_rope(RopeArgs args, int64_t pass_through, pdl::Request pdl_request,
                        cudaStream_t stream) {
  args.rot_units = args.half_rot / kVec;
  args.units =
      args.rot_units + (args.q.copy || args.k.copy ? static_cast<int>(pass_through / kVec) : 0);
  Plan plan;
  if (!plan_launch(args.heads, args.units, args.tokens, &plan)) {
    return cudaErrorInvalidConfiguration;
  }
  args.unit_blocks = plan.unit_blocks;
  // One launch covers up to 65535^2 token blocks (grid y x z); more take several launches.
  const int64_t per_launch = LaunchConfig::kMaxGridYZ * LaunchConfig::kMaxGridYZ;
  for (int64_t base = 0; base < plan.token_blocks; base += per_launch) {
    const int64_t left = plan.token_blocks - base;
    const int64_t blocks = left < per_launch ? left : per_launch;
    // The fewest z planes, then y as even as they allow: fewer than gz blocks of the grid are
    // past the last token block. (y = 65535 with a second, nearly empty z plane launched 65534
    // idle blocks at 65536 tokens; benchmarks/NOTES.md, "Grid shape past 65535 token blocks".)
    const int64_t gz = ceil_div(blocks, LaunchConfig::kMaxGridYZ);
    const int64_t gy = ceil_div(blocks, gz);
    const dim3 grid(plan.grid_x, static_cast<unsigned>(gy), static_cast<unsigned>(gz));
    args.token_block_base = base;
    // A launch after the first follows the previous token chunk's kernel.
    const pdl::ByDefault pdl_default = base == 0 ? pdl::ByDefault::kPlain : pdl::ByDefault::kPdl;
    const cudaError_t err =
        pdl::launch(pdl_request, pdl_default, rope_kernel<T, Tt, kLayout, kKind, kVec>, grid,
                    plan.block, 0, stream, args);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <typename T, typename Tt, PairLayout kLayout, TableKind kKind>
cudaError_t run(const RopeParams& p, const RopeArgs& args, cudaStream_t stream) {
  constexpr int V = LaunchConfig::kVectorBytes / static_cast<int>(sizeof(T));
  const int64_t pass_through = p.head_dim - p.rot_dim;
  if (vector_path_ok<T, Tt>(p, args.q.copy || args.k.copy)) {
    return launch_rope<T, Tt, kLayout, kKind, V>(args, pass_through, p.pdl_request, stream);
  }
  return launch_rope<T, Tt, kLayout, kKind, 1>(args, pass_through, p.pdl_request, stream);
}

TensorArgs tensor_args(const RopeParams& p, const RopeTensor& x) {
  TensorArgs r{};
  if (!tensor_present(x)) return r;
  r.in = x.in;
  r.out = x.out;
  r.in_batch_stride = x.in_batch_stride;
  r.in_seq_stride = x.in_seq_stride;
  r.in_head_stride = x.in_head_stride;
  r.out_batch_stride = x.out_batch_stride;
  r.out_seq_stride = x.out_seq_stride;
  r.out_head_stride = x.out_head_stride;
  r.copy = tensor_copies(p, x);
  return r;
}

// Internal consistency of a tensor (rope_params.h): q with heads has an input, a present tensor
// has an output, with the same strides when in place. k.in == nullptr: k is absent.
bool tensor_ok(const RopeTensor& x, bool is_q) {
  if (x.heads < 0) return false;
  if (!tensor_present(x)) return !(is_q && x.heads > 0);
  if (x.out == nullptr) return false;
  return x.out != x.in ||
         (x.in_batch_stride == x.out_batch_stride && x.in_seq_stride == x.out_seq_stride &&
          x.in_head_stride == x.out_head_stride);
}

bool enums_ok(const RopeParams& p) {
  const bool dtype_ok =
      p.dtype == DType::kFloat32 || p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16;
  return dtype_ok && (p.table_dtype == DType::kFloat32 || p.table_dtype == p.dtype) &&
         (p.layout == PairLayout::kNeox || p.layout == PairLayout::kInterleaved) &&
         (p.table_kind == TableKind::kHalf || p.table_kind == TableKind::kFull) &&
         (p.row_mode == RowMode::kPositions || p.row_mode == RowMode::kSequence ||
          p.row_mode == RowMode::kVarlen);
}

// The shape rules that do not depend on data (checked before the empty-launch shortcut).
bool shape_ok(const RopeParams& p) {
  constexpr int64_t kMaxHeadDim = int64_t(1) << 30;  // channel offsets are 32-bit
  // Rows are computed in int64: position + seqlen_offset + an int32 offset cannot overflow.
  constexpr int64_t kMaxSeqlenOffset = int64_t(1) << 60;
  return p.batch >= 0 && p.seqlen >= 0 && p.rot_dim > 0 && p.rot_dim % 2 == 0 &&
         p.head_dim >= p.rot_dim && p.head_dim <= kMaxHeadDim && tensor_ok(p.q, true) &&
         tensor_ok(p.k, false) &&
         (p.seqlen == 0 || p.batch <= std::numeric_limits<int64_t>::max() / p.seqlen) &&
         p.seqlen <= kMaxSeqlenOffset && p.seqlen_offset >= -kMaxSeqlenOffset &&
         p.seqlen_offset <= kMaxSeqlenOffset;
}

// The table and row-mode rules, for a launch with tokens and heads.
bool table_ok(const RopeParams& p) {
  if (p.table_rows < 0 || (p.table_rows > 0 && (p.cos == nullptr || p.sin == nullptr))) {
    return false;
  }
  if (p.table_batch != 1 && p.table_batch != p.batch) return false;
  if (p.table_heads < 1) return false;
  if (p.head_stride != 0) {  // one table entry per head of each tensor rotated
    for (const RopeTensor* x : {&p.q, &p.k}) {
      if (tensor_present(*x) && x->heads != p.table_heads) return false;
    }
  }
  switch (p.row_mode) {
    case RowMode::kPositions:
      return p.positions != nullptr;
    case RowMode::kSequence:
      return true;
    case RowMode::kVarlen:
      return p.batch == 1 && p.cu_seqlens != nullptr && p.num_seqs >= 1 &&
             p.num_seqs < std::numeric_limits<int32_t>::max();
    default:
      return false;
  }
}

// Calls f(TypeTag<T>, TypeTag<Tt>) for the 5 supported (activation, table) dtype pairs: T
// fp32/fp16/bf16, Tt T or fp32.
template <typename F>
cudaError_t dispatch_types(DType dtype, DType table_dtype, F&& f) {
  return dispatch::floats(dtype, [&](auto t) {
    return dispatch::same_or_float(table_dtype, dtype, t, [&](auto tt) { return f(t, tt); });
  });
}

template <typename T, typename Tt>
cudaError_t dispatch_shape(const RopeParams& p, const RopeArgs& args, cudaStream_t stream) {
  const bool neox = p.layout == PairLayout::kNeox;
  if (p.table_kind == TableKind::kHalf) {
    return neox ? run<T, Tt, PairLayout::kNeox, TableKind::kHalf>(p, args, stream)
                : run<T, Tt, PairLayout::kInterleaved, TableKind::kHalf>(p, args, stream);
  }
  return neox ? run<T, Tt, PairLayout::kNeox, TableKind::kFull>(p, args, stream)
              : run<T, Tt, PairLayout::kInterleaved, TableKind::kFull>(p, args, stream);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public launcher (rope_cuda.h).
// ---------------------------------------------------------------------------------------------
cudaError_t rope_forward(const RopeParams& p, cudaStream_t stream) {
  if (!enums_ok(p) || !shape_ok(p)) return cudaErrorInvalidValue;
  const int64_t tokens = p.batch * p.seqlen;
  const int64_t q_heads = tensor_present(p.q) ? p.q.heads : 0;
  const int64_t k_heads = tensor_present(p.k) ? p.k.heads : 0;
  if (tokens == 0 || q_heads + k_heads == 0) return cudaSuccess;
  if (!table_ok(p)) return cudaErrorInvalidValue;

  RopeArgs args{};
  args.q = tensor_args(p, p.q);
  args.k = tensor_args(p, p.k);
  args.q_heads = q_heads;
  args.heads = q_heads + k_heads;
  args.tokens = tokens;
  args.seqlen = p.seqlen;
  args.batched = p.batch > 1;
  args.seq_div = FastDivU64::make(static_cast<uint64_t>(p.seqlen));
  args.cos = p.cos;
  args.sin = p.sin;
  args.table_batch_stride = p.table_batch == 1 ? 0 : p.table_batch_stride;
  args.row_stride = p.row_stride;
  args.head_stride = p.head_stride;
  args.table_rows = p.table_rows;
  args.row_mode = p.row_mode;
  args.positions = p.positions;
  args.positions_int32 = p.positions_int32;
  args.positions_batch_stride = p.positions_batch_stride;
  args.positions_seq_stride = p.positions_seq_stride;
  args.seqlen_offset = p.seqlen_offset;
  args.seqlen_offsets = p.seqlen_offsets;
  args.cu_seqlens = p.cu_seqlens;
  args.num_seqs = p.num_seqs;
  args.half_rot = static_cast<int>(p.rot_dim / 2);
  args.rot_dim = static_cast<int>(p.rot_dim);
  args.transpose = p.transpose;
  return dispatch_types(p.dtype, p.table_dtype, [&](auto t, auto tt) {
    return dispatch_shape<typename decltype(t)::type, typename decltype(tt)::type>(p, args, stream);
  });
}

}  // namespace cuda
}  // namespace rope
