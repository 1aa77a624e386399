// rmsnorm_cuda.cu: CUDA kernels and host launchers of the RMSNorm ops (rmsnorm_cuda.h).
//
// What it computes: the forward and backward of rmsnorm_params.h, per row of a [rows, hidden]
// matrix: r = input (+ residual, rounded to the input dtype, written to residual_out),
// rstd = rsqrtf(sum(r^2) / hidden + eps) with the sum in fp32, n = r * rstd, optionally rounded
// to norm_dtype (LlamaRMSNorm), times weight_offset + weight (Gemma: offset 1), optionally
// modulated per sample (y * (1 + scale[b]) + shift[b]), rounded once to the output dtype. The
// backward recomputes rstd from the normalized tensor and writes grad_input (+ grad_residual) and
// the column sums grad_weight, and per sample grad_scale and grad_shift.
// Dtypes: input fp32/fp16/bf16; weight and out the input dtype or fp32 (9 combinations, one
// template instance each); all math in fp32. bf16 only goes through conversions (emulated on
// sm_75), so it builds for sm_75 .. sm_120.
// Layout: unit stride along hidden, any row stride (elements), 64-bit sizes and offsets. In
// place: out may be input and residual_out may be residual (forward), grad_input may be grad_out
// or grad_residual (backward), with the same dtype and strides: every element is written only by
// the thread that read it, after it read it.
//
// Design (memory-bound: the goals are the device copy bandwidth for large shapes and one short
// wave for decode-sized ones; bytes = each tensor read once and written once):
// - A row is handled by a group of `group` consecutive threads: a power of two up to 32, or whole
//   warps up to 1024. Thread `lane` of the group owns the chunks lane + k * group, k < kChunks,
//   of the row, a chunk being one 16-byte vector of the input dtype (8 x fp16/bf16, 4 x fp32)
//   when every row start of every tensor is 16-byte aligned and hidden is a multiple of it, else
//   one element (the scalar path: the same kernels with kVec = 1). Chunks stay in registers as
//   the 32-bit words they were loaded as (r is rounded to the input dtype by definition, so this
//   is exact) between the sum of squares and the scaling: each tensor is read once, with all of
//   a thread's loads in flight at once, and unpacked to fp32 on use.
// - Row sums: fp32 per chunk, then per thread, then a warp butterfly and, for groups of several
//   warps, one shared-memory step behind a CTA barrier (group_sum says why not a named barrier
//   per row); a fixed order, so all threads of a row hold the same bits.
// - Forward (FwdPlan): rows that fill the GPU take kChunks = 4 (64 bytes of input per thread in
//   flight) and group = chunks / 4 threads, several rows per CTA below 128 threads (kChunks = 8
//   for rows that would need 256 threads or more, from 16 x SMs rows, without a residual or an
//   fp16 weight); decode-sized launches (rows <= 4 x SMs) take the smallest kChunks that fits
//   in 768 threads, so a row spreads over up to 768 threads and no thread loops over the row
//   (hidden 4096 bf16: 512 threads x 1 vector, 8192: 512 x 2). Those of one row per CTA on the
//   vector path, unmodulated, run rms_norm_fwd_row_kernel: the same arithmetic in half the
//   instructions, which is what a decode-sized launch waits on.
//   Inputs of 32 MB or more: each group prefetches into L2 the row about half a wave ahead of
//   its own (one bulk prefetch; LaunchConfig::kFwdPrefetchBytesPerSm), which a later CTA reads.
//   Up to 4096 chunks per row (32768 bf16, 16384 fp32, 4096 elements on the scalar path) stay in
//   registers; wider rows run a two-pass kernel (one CTA per row: sum, then scale, the second
//   read served by L2 for the most part).
// - Backward: 2 x SMs persistent CTAs of up to 512 threads, each over a contiguous range of rows of
//   one sample (BwdPartition), with register-resident rows of up to 16 columns per thread
//   (BwdShape: hidden up to 8192 on the vector path) and two sums per row (sum r^2 and sum gn * r).
//   That kernel is bound by instruction issue rather than by DRAM (bf16: every element converted
//   and weighted in both passes; about 26 instructions per element in the SASS even after the
//   changes that follow), so no test runs per element: the weight offset and grad_residual select
//   an instantiation of the row loop, and group_sum gets the caller's slot instead of dividing per
//   row (see benchmarks/NOTES.md, "Backward: no per-element tests"). The grad_weight column partials
//   of a CTA accumulate in shared memory ([slots, hidden], each element owned by one thread), those
//   of grad_scale / grad_shift in registers; at the end the CTA writes one row of partials per
//   reduction into the workspace ([partials, hidden] each), and a second small kernel adds the
//   partials of each column in a fixed order into grad_weight (all partials) and grad_scale /
//   grad_shift (the partials of each sample), rounded once. No atomics: results are deterministic.
//   On sm_90+ a group asks L2 for its next row while it reduces and stores the current one (one
//   bulk prefetch; LaunchConfig::kBwdPrefetchSteps), where the rows in flight fall short of the
//   device's DRAM bandwidth (plan_bwd_prefetch). Rows wider than the register path take a
//   two-pass kernel that accumulates its partials in its own workspace rows (read-modify-write
//   through L2).
// - rstd = rsqrtf(sum * (1 / hidden) + eps), the same expression forward and backward. The
//   host rounds 1 / hidden to fp32 once, so the mean is within about an ulp of sum / hidden
//   (no division per row), the same order as rsqrtf's own error (2 ulp).
// - Memory: activations are loaded with L1::no_allocate (coherent, since outputs may alias
//   them), weight / scale / shift through the read-only path (L1-resident, reused by every row),
//   outputs stored with .cs (evict-first); rmsnorm_cuda_utils.cuh.
// - Programmatic dependent launch on sm_90+ (pdl.cuh, shared with the other kernels): the
//   backward's reduce kernel is launched with PDL after the backward kernel; the first kernel of a
//   call only with enable_pdl=True (False: none). Each kernel waits for its predecessor before its first
//   global access and then releases its dependents, so a decode-sized launch after a kernel that
//   releases its dependents overlaps its launch latency with that kernel's tail.
// - Launch heuristics live in LaunchConfig, FwdPlan, BwdShape and BwdPartition only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "dispatch.cuh"
#include "rmsnorm_cuda.h"
#include "rmsnorm_cuda_utils.cuh"
#include "pdl.cuh"
#include "rmsnorm_params.h"

namespace rmsnorm {
namespace cuda {
namespace {

using detail::Chunk;
using detail::chunk_from_float;
using detail::cta_sum;
using detail::FastDivU64;
using detail::from_float;
using detail::group_sum;
using detail::launder;
using detail::Ld;
using detail::load_chunk;
using detail::NormRound;
using detail::prefetch_l2;
using detail::round_norm;
using detail::St;
using detail::store_chunk;

// ---------------------------------------------------------------------------------------------
// Launch configuration: the only place where the launch heuristics live.
// ---------------------------------------------------------------------------------------------
struct LaunchConfig {
  static constexpr int kVectorBytes = 16;

  // Forward, register-resident rows. kChunks (16-byte vectors per thread) is one of 1, 2, 4, 8.
  // 1 and 2 allow groups of 1024 threads, with at most 64 registers; 4 and 8 groups of 512, with
  // at most 64 (4: two CTAs of 512 per SM) and 128 registers (8). Widest register row: 512 x 8.
  static constexpr int kFwdMaxRegisterChunks = 512 * 8;
  // Rows that fill the GPU: 4 vectors per thread, 64 bytes of input in flight per thread and
  // 64 KB per SM at 1024 resident threads, more than Little's law asks of the DRAM (see
  // benchmarks/NOTES.md, "Sizing the bytes in flight").
  static constexpr int kFwdChunksManyRows = 4;
  // ... except rows without a residual that would take kFwdWideGroup threads or more that way:
  // 8 vectors per thread, half the group (one row over 4 warps instead of 8 at hidden 8192
  // bf16), which brings large plain forwards closer to the copy bandwidth. Not with a residual
  // (two tensors in flight per vector already) nor an fp16 weight (more registers, fewer CTAs),
  // and only from kFwdWideMinRowsPerSm x SMs rows: it lost there (see benchmarks/NOTES.md,
  // "Forward: 8 vectors per thread for wide rows").
  static constexpr int kFwdWideGroup = 256;
  static constexpr int kFwdChunksWideRows = 8;
  static constexpr int kFwdWideMinRowsPerSm = 16;
  // rows <= kFwdFewRowsPerSm x SMs: decode-sized, one wave whatever the shape; the fewest
  // vectors per thread (the widest group) minimise the serial work per thread.
  static constexpr int kFwdFewRowsPerSm = 4;
  // ... in groups of at most this many threads: a hidden-8192 bf16 decode launch is faster as
  // 512 threads x 2 vectors than as 1024 x 1, while smaller groups with more vectors were no
  // faster at other widths, so only 1024-thread groups are split (see benchmarks/NOTES.md,
  // "Forward: decode-sized groups").
  static constexpr int kFwdFewRowsMaxGroup = 768;
  // Small groups share a CTA up to this many threads (rows per CTA = 128 / group).
  static constexpr int kFwdCtaThreads = 128;
  // Inputs of at least kFwdPrefetchMinBytes (rows of kFwdChunksManyRows vectors per thread or
  // more): each group asks L2 (one bulk prefetch, sm_90+, vector path) for the input (and
  // residual) of the row kFwdPrefetchBytesPerSm x SMs bytes of those tensors ahead of its own,
  // which a CTA of a later wave reads, so that DRAM keeps streaming while resident CTAs reduce
  // and store and new ones start: about half the bytes a wave holds in flight (k = 4: 1024
  // threads x 64 B per SM). Twice as far ahead evicts lines before use; below 32 MB of input a
  // graph-replayed call finds much of it in L2 already and the prefetch only costs (see
  // benchmarks/NOTES.md, "Forward: L2 prefetch about half a wave ahead").
  static constexpr int64_t kFwdPrefetchBytesPerSm = 32 * 1024;
  static constexpr int64_t kFwdPrefetchMinBytes = int64_t(32) << 20;
  // Shared memory carveout (percent) asked for the forward of kFwdChunksManyRows vectors per
  // thread or more, on sm_90 only (where measured). The driver's own pick for these kernels (a
  // 16-32 KB shared memory configuration: they use 256 bytes) made the plain forward slower
  // than this hint, at the same occupancy (see benchmarks/NOTES.md, "Forward: shared memory
  // carveout hint").
  static constexpr int kFwdCarveoutPercent = 8;
  // Two-pass forward (rows of more than kFwdMaxRegisterChunks chunks): one CTA per row.
  static constexpr int kTwoPassThreads = 512;

  // Backward, register-resident rows (BwdShape): groups of up to kBwdMaxGroup threads in CTAs of
  // kBwdCtaThreads. 16 columns per thread on the vector path (2 vectors of fp16/bf16, 4 of fp32),
  // so the grad_weight partials of a CTA (slots x hidden <= 512 x 16 floats) fit in 32 KB of
  // shared memory, within the default 48 KB; 4 elements on the scalar path, whose every element
  // has its own address registers; fewer when the estimated data registers exceed
  // kBwdMaxDataRegs. All-16-bit tensors without modulation on the vector path (the common
  // training case) run two CTAs per SM (<= 64 registers, 1024 threads); the other forms one CTA
  // of <= 128 registers.
  static constexpr int kBwdMaxGroup = 512;
  static constexpr int kBwdColumns = 16;
  static constexpr int kBwdScalarChunks = 4;
  static constexpr int kBwdMaxDataRegs = 72;
  static constexpr int kBwdCtaThreads = 512;
  static constexpr int kBwdCtasPerSm = 2;
  // Fewer CTAs rather than fewer than 4 rows each: the partials cost 8 bytes per column per CTA
  // (write + read back), against 4-6 bytes per column per row for the row data. Unless that
  // leaves SMs without a CTA: then one row each (partition_bwd; see benchmarks/NOTES.md,
  // "Backward: one row per CTA for small batches").
  static constexpr int kBwdMinRowsPerCta = 4;
  // The register-resident backward asks L2 for a group's row this many steps ahead (sm_90+,
  // vector path, no grad_residual): DRAM keeps streaming while the CTA reduces and stores (its
  // steps are load, CTA barrier, store, with nothing in flight across the barrier). Off with
  // grad_residual (three tensors per row in flight already), where it lost. It pays only while
  // the rows a CTA has in flight are too few to keep the SM's share of DRAM busy, so a launch
  // prefetches when its rows in flight per SM (CTAs per SM x groups per CTA x input + grad_out
  // row bytes) are fewer than the SM's share of the DRAM bandwidth (from the memory clock and
  // bus width) times kBwdPrefetchWindowUs, the window that separated the cases that gained from
  // those that lost; plan_bwd_prefetch (see benchmarks/NOTES.md, "Backward: L2 prefetch").
  static constexpr int kBwdPrefetchSteps = 1;
  static constexpr double kBwdPrefetchWindowUs = 1.9;
  static constexpr int kBwdWideThreads = 512;
  // Column reduction of the partials: 16 warps of one block split the partials of 32 columns,
  // each warp with 8 loads in flight.
  static constexpr int kReduceThreads = 512;
  static constexpr int kReduceUnroll = 8;

  static constexpr int max_group(int chunks) { return chunks <= 2 ? 1024 : 512; }
};

constexpr int64_t kMaxGrid = (int64_t(1) << 31) - 1;

template <int kChunks>
struct FwdBounds {
  static constexpr int kThreads = LaunchConfig::max_group(kChunks);
  static constexpr int kMinBlocks = kChunks == 4 ? 2 : 1;
};

// Backward shape per instance: chunks per thread and CTAs per SM (LaunchConfig). data_regs
// estimates the registers of a thread's row data (x, grad_out, grad_residual, weight, scale
// chunks) and of its grad_scale / grad_shift partials (grad_weight's accumulate in shared
// memory).
template <typename Tin, typename Tw, typename Tout, int kVec, int kMode>
struct BwdShape {
  static constexpr bool kTwoCtas = kVec > 1 && sizeof(Tin) == 2 && sizeof(Tw) == 2 &&
                                   sizeof(Tout) == 2 && kMode == 0;
  template <typename T>
  static constexpr int regs(int chunks) {
    return chunks * (sizeof(T) * kVec < 4 ? 1 : static_cast<int>(sizeof(T)) * kVec / 4);
  }
  static constexpr int data_regs(int chunks) {
    return 2 * regs<Tin>(chunks) + regs<Tout>(chunks) + regs<Tw>(chunks) +
           (kMode != 0 ? regs<Tin>(chunks) : 0) + (kMode == 2 ? 2 * chunks * kVec : 0);
  }
  static constexpr int chunks() {
    int k = kVec == 1 ? LaunchConfig::kBwdScalarChunks : LaunchConfig::kBwdColumns / kVec;
    while (k > 1 && data_regs(k) > LaunchConfig::kBwdMaxDataRegs) k /= 2;
    return k;
  }
  static constexpr int kChunks = chunks();
  static constexpr int kMinBlocks = kTwoCtas ? 2 : 1;
};

template <typename T>
constexpr int kVecWidth = LaunchConfig::kVectorBytes / static_cast<int>(sizeof(T));

__host__ __device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Calls f(std::integral_constant<NormRound, R>{}) for the runtime value r (uniform branch
// outside the element loops).
template <typename F>
__device__ __forceinline__ void with_norm_round(NormRound r, F&& f) {
  switch (r) {
    case NormRound::kHalf:
      f(std::integral_constant<NormRound, NormRound::kHalf>{});
      break;
    case NormRound::kBFloat16:
      f(std::integral_constant<NormRound, NormRound::kBFloat16>{});
      break;
    default:
      f(std::integral_constant<NormRound, NormRound::kNone>{});
      break;
  }
}
template <typename F>
__device__ __forceinline__ void with_bool(bool b, F&& f) {
  if (b) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

// ---------------------------------------------------------------------------------------------
// Forward.
// ---------------------------------------------------------------------------------------------
struct FwdArgs {
  void* out;             // [rows, hidden], Tout
  const void* input;     // [rows, hidden], Tin
  const void* residual;  // [rows, hidden], Tin, or null (no fused add)
  void* residual_out;    // [rows, hidden], Tin, set with residual
  const void* weight;    // [hidden], Tw, or null (w' = 1)
  const void* scale;     // [batch, hidden], Tin, or null (not modulated)
  const void* shift;     // [batch, hidden], Tin, set with scale
  float* rstd;           // [rows] or null
  int64_t out_stride;
  int64_t input_stride;
  int64_t residual_stride;
  int64_t residual_out_stride;
  int64_t scale_stride;
  int64_t shift_stride;
  int64_t rows;
  int64_t hidden;
  int64_t chunks;            // chunks per row: hidden / kVec
  int64_t row_blocks;        // ceil(rows / rows_per_cta)
  FastDivU64 sample_of_row;  // row / rows_per_sample
  float inv_hidden;          // 1 / hidden, rounded to fp32
  float weight_offset;
  float eps;
  int group;  // threads per row
  int rows_per_cta;
  NormRound norm_round;
  int64_t prefetch_rows;  // L2 prefetch distance in rows (0: none; plan_fwd_prefetch)
};

// Bytes of weight chunks a forward thread keeps in registers from its start (loaded once, with
// its first row's loads in flight: the decode shapes, 1-2 vectors per thread); with more chunks
// the weight is read in the epilogue instead, an L1 hit for the most part, which keeps the
// 4-vector instance within 64 registers.
constexpr int kMaxPrefetchWeightBytes = 32;

// Stores y = round_norm(r * rstd) * w' (* (1 + scale) + shift) of the chunk at element `col`
// of the row: out_row[col ..], scale_row[col ..], shift_row[col ..] (the latter when modulated).
template <NormRound kRound, bool kModulated, typename Tin, typename Tw, typename Tout, int kVec>
__device__ __forceinline__ void fwd_store_chunk(Tout* out_row, int64_t col,
                                                const Chunk<Tin, kVec>& r, const Chunk<Tw, kVec>& w,
                                                bool has_weight, float weight_offset,
                                                const Tin* scale_row, const Tin* shift_row,
                                                float rstd) {
  Chunk<Tin, kVec> s{}, sh{};
  if constexpr (kModulated) {
    s = load_chunk<Ld::kReadOnly, Tin, kVec>(scale_row + col);
    sh = load_chunk<Ld::kReadOnly, Tin, kVec>(shift_row + col);
  }
  float y[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    float v = round_norm<kRound>(r.get(j) * rstd);
    if (has_weight) v *= weight_offset + w.get(j);
    if constexpr (kModulated) v = v * (1.0f + s.get(j)) + sh.get(j);
    y[j] = v;
  }
  store_chunk<St::kStream>(out_row + col, chunk_from_float<Tout, kVec>(y));
}

// The epilogue of one row of the register-resident forward: all chunks of this thread.
template <NormRound kRound, bool kModulated, bool kPrefetchedWeight, typename Tout, typename Tin,
          typename Tw, int kVec, int kChunks>
__device__ __forceinline__ void fwd_store_row(const FwdArgs& a,
                                              const Chunk<Tin, kVec> (&x)[kChunks],
                                              const Chunk<Tw, kVec> (&w)[kChunks], int64_t row,
                                              int lane, int chunks, float rstd) {
  const Tw* weight = static_cast<const Tw*>(a.weight);
  const bool has_weight = weight != nullptr;
  Tout* out = static_cast<Tout*>(a.out) + row * a.out_stride;
  const Tin* scale = nullptr;
  const Tin* shift = nullptr;
  if constexpr (kModulated) {
    const int64_t b = a.sample_of_row.div(row);
    scale = static_cast<const Tin*>(a.scale) + b * a.scale_stride;
    shift = static_cast<const Tin*>(a.shift) + b * a.shift_stride;
  }
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = lane + k * a.group;
    if (c < chunks) {
      Chunk<Tw, kVec> wk{};
      if constexpr (kPrefetchedWeight) {
        wk = w[k];
      } else if (has_weight) {
        wk = load_chunk<Ld::kReadOnly, Tw, kVec>(weight + c * kVec);
      }
      fwd_store_chunk<kRound, kModulated>(out, c * kVec, x[k], wk, has_weight, a.weight_offset,
                                          scale, shift, rstd);
    }
  }
}

// Loads the chunks of a thread (lane of a group of `group` over `chunks` chunks) from p.
template <Ld kPolicy, typename T, int kVec, int kChunks>
__device__ __forceinline__ void load_chunks(Chunk<T, kVec> (&v)[kChunks], const T* p, int lane,
                                            int group, int chunks) {
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = lane + k * group;
    if (c < chunks) v[k] = load_chunk<kPolicy, T, kVec>(p + c * kVec);
  }
}

// The fused add for the chunks of a thread (lane of a group of `group` over `chunks` chunks):
// r = x + residual, rounded to Tin, replaces x and is stored to residual_out.
template <typename Tin, int kVec, int kChunks>
__device__ __forceinline__ void add_residual(Chunk<Tin, kVec> (&x)[kChunks], const Tin* res,
                                             Tin* res_out, int lane, int group, int chunks) {
  Chunk<Tin, kVec> rv[kChunks] = {};
  load_chunks<Ld::kStream>(rv, res, lane, group, chunks);
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = lane + k * group;
    if (c < chunks) {
      float f[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) f[j] = x[k].get(j) + rv[k].get(j);
      x[k] = chunk_from_float<Tin, kVec>(f);
      store_chunk<St::kStream>(res_out + c * kVec, x[k]);
    }
  }
}

// The sum of squares of a thread's chunks, in fp32, chunk by chunk.
template <typename Tin, int kVec, int kChunks>
__device__ __forceinline__ float sum_squares(const Chunk<Tin, kVec> (&x)[kChunks], int lane,
                                             int group, int chunks) {
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = lane + k * group;
    if (c < chunks) {
      float part = 0.0f;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float f = x[k].get(j);
        part += f * f;
      }
      ss += part;
    }
  }
  return ss;
}

// Register-resident forward: each group of `group` threads normalizes one row per step.
// kPrefetchL2: the instance that prefetches rows ahead (a.prefetch_rows > 0; plan_fwd_prefetch).
template <typename Tin, typename Tw, typename Tout, int kVec, int kChunks, bool kPrefetchL2 = false>
__global__ void __launch_bounds__(FwdBounds<kChunks>::kThreads, FwdBounds<kChunks>::kMinBlocks)
    rms_norm_fwd_kernel(const __grid_constant__ FwdArgs a) {
  static_assert(!kPrefetchL2 || kVec > 1, "bulk prefetches need rows of whole 16-byte vectors");
  constexpr bool kPrefetchW =
      static_cast<int>(sizeof(Tw)) * kVec * kChunks <= kMaxPrefetchWeightBytes;
  __shared__ float red[2][1][32];
  pdl::wait_and_release_after_params(0, a);  // the parameters are read while the grid waits
  const int group = a.group;
  // Several rows per CTA only for groups of a power of two (FwdPlan): a shift, not a division.
  const int slot = a.rows_per_cta == 1 ? 0 : static_cast<int>(threadIdx.x) >> (31 - __clz(group));
  const int lane = static_cast<int>(threadIdx.x) - slot * group;
  const int chunks = static_cast<int>(a.chunks);  // <= kFwdMaxRegisterChunks
  const Tw* weight = static_cast<const Tw*>(a.weight);
  const bool fused = a.residual != nullptr;

  // The columns of a thread are the same in every row: its weight chunks are loaded once.
  Chunk<Tw, kVec> w[kChunks] = {};
  if constexpr (kPrefetchW) {
    if (weight != nullptr) load_chunks<Ld::kReadOnly>(w, weight, lane, group, chunks);
  }

  int parity = 0;
  for (int64_t block_row = blockIdx.x; block_row < a.row_blocks; block_row += gridDim.x) {
    const int64_t row = block_row * a.rows_per_cta + slot;
    const bool active = row < a.rows;
    Chunk<Tin, kVec> x[kChunks] = {};  // r, in the input dtype
    float ss[1] = {0.0f};
    if (active) {
      load_chunks<Ld::kStream>(x, static_cast<const Tin*>(a.input) + row * a.input_stride, lane,
                               group, chunks);
      // Only in the kPrefetchL2 instance: compiled into every instance, the untaken test made
      // mid-sized forwards slower (see benchmarks/NOTES.md, "Forward: L2 prefetch").
      if constexpr (kPrefetchL2) {
        const int64_t ahead = row + a.prefetch_rows;
        if (lane == 0 && ahead < a.rows) {
          const uint32_t bytes = static_cast<uint32_t>(a.hidden * sizeof(Tin));
          prefetch_l2(static_cast<const Tin*>(a.input) + ahead * a.input_stride, bytes);
          if (fused) {
            prefetch_l2(static_cast<const Tin*>(a.residual) + ahead * a.residual_stride, bytes);
          }
        }
      }
      if (fused) {
        add_residual(x, static_cast<const Tin*>(a.residual) + row * a.residual_stride,
                     static_cast<Tin*>(a.residual_out) + row * a.residual_out_stride, lane, group,
                     chunks);
      }
      ss[0] = sum_squares(x, lane, group, chunks);
    }
    group_sum<1>(ss, group, slot, red[parity]);
    parity ^= 1;
    launder(x);
    if constexpr (kPrefetchW) launder(w);
    if (!active) continue;
    const float rstd = rsqrtf(ss[0] * a.inv_hidden + a.eps);
    if (lane == 0 && a.rstd != nullptr) a.rstd[row] = rstd;

    with_norm_round(a.norm_round, [&](auto round_tag) {
      with_bool(a.scale != nullptr, [&](auto mod_tag) {
        fwd_store_row<decltype(round_tag)::value, decltype(mod_tag)::value, kPrefetchW, Tout>(
            a, x, w, row, lane, chunks, rstd);
      });
    });
  }
}

// Decode-sized rows on the vector path (FwdPlan::row_kernel): one row per CTA of
// group = blockDim.x threads (whole warps, 96 to kFwdFewRowsMaxGroup), kChunks vectors per
// thread, no modulation. There a warp's instructions are one dependent chain (load, square,
// reduce, scale, store) whose length sets the time of the launch: rms_norm_fwd_kernel spends twice
// the instructions on it (row loop, row slots, group-shape tests), and a decode-sized call took
// longer with it (see benchmarks/NOTES.md, "Forward: a row kernel for decode-sized launches").
// The same operations in the same order as that kernel with the same kChunks and group: the
// same bits.
template <typename Tin, typename Tw, typename Tout, int kVec, int kChunks>
__global__ void __launch_bounds__(kChunks <= 2 ? LaunchConfig::kFwdFewRowsMaxGroup
                                               : LaunchConfig::max_group(kChunks))
    rms_norm_fwd_row_kernel(const __grid_constant__ FwdArgs a) {
  constexpr bool kPrefetchW =
      static_cast<int>(sizeof(Tw)) * kVec * kChunks <= kMaxPrefetchWeightBytes;
  __shared__ float warp_sums[LaunchConfig::kFwdFewRowsMaxGroup / 32];
  pdl::wait_and_release_after_params(0, a);
  const int lane = static_cast<int>(threadIdx.x);
  const int group = static_cast<int>(blockDim.x);
  const int chunks = static_cast<int>(a.chunks);
  const int64_t row = blockIdx.x;
  const Tw* weight = static_cast<const Tw*>(a.weight);

  Chunk<Tin, kVec> x[kChunks] = {};  // r, in the input dtype
  load_chunks<Ld::kStream>(x, static_cast<const Tin*>(a.input) + row * a.input_stride, lane, group,
                           chunks);
  Chunk<Tw, kVec> w[kChunks] = {};
  if constexpr (kPrefetchW) {
    if (weight != nullptr) load_chunks<Ld::kReadOnly>(w, weight, lane, group, chunks);
  }
  if (a.residual != nullptr) {
    add_residual(x, static_cast<const Tin*>(a.residual) + row * a.residual_stride,
                 static_cast<Tin*>(a.residual_out) + row * a.residual_out_stride, lane, group,
                 chunks);
  }
  const float ss = cta_sum(sum_squares(x, lane, group, chunks), warp_sums);
  launder(x);
  if constexpr (kPrefetchW) launder(w);
  const float rstd = rsqrtf(ss * a.inv_hidden + a.eps);
  if (lane == 0 && a.rstd != nullptr) a.rstd[row] = rstd;
  with_norm_round(a.norm_round, [&](auto round_tag) {
    fwd_store_row<decltype(round_tag)::value, false, kPrefetchW, Tout>(a, x, w, row, lane, chunks,
                                                                       rstd);
  });
}

// Rows wider than the register path: one CTA per row, sum of squares over the row, then a
// second pass that reads the row again (from L2 for the most part) and writes the output. With
// the fused add, pass 1 writes residual_out and pass 2 reads it back: both through plain
// accesses, by the thread that owns those columns in both passes.
template <typename Tin, typename Tw, typename Tout, int kVec>
__global__ void __launch_bounds__(LaunchConfig::kTwoPassThreads, 1)
    rms_norm_fwd_two_pass_kernel(const FwdArgs a) {
  constexpr int kUnroll = kVec == 1 ? 8 : 4;
  __shared__ float red[2][1][32];
  pdl::wait_and_release();
  const int64_t threads = blockDim.x;
  const int64_t step = threads * kUnroll;
  const Tw* weight = static_cast<const Tw*>(a.weight);
  const bool has_weight = weight != nullptr;
  const bool fused = a.residual != nullptr;

  int parity = 0;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const Tin* in = static_cast<const Tin*>(a.input) + row * a.input_stride;
    const Tin* res =
        fused ? static_cast<const Tin*>(a.residual) + row * a.residual_stride : nullptr;
    Tin* res_out =
        fused ? static_cast<Tin*>(a.residual_out) + row * a.residual_out_stride : nullptr;
    float ss[1] = {0.0f};
    for (int64_t base = threadIdx.x; base < a.chunks; base += step) {
      Chunk<Tin, kVec> x[kUnroll] = {};
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = base + u * threads;
        if (c < a.chunks) x[u] = load_chunk<Ld::kPlain, Tin, kVec>(in + c * kVec);
      }
      if (fused) {
        Chunk<Tin, kVec> rv[kUnroll] = {};
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t c = base + u * threads;
          if (c < a.chunks) rv[u] = load_chunk<Ld::kPlain, Tin, kVec>(res + c * kVec);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t c = base + u * threads;
          if (c < a.chunks) {
            float f[kVec];
#pragma unroll
            for (int j = 0; j < kVec; ++j) f[j] = x[u].get(j) + rv[u].get(j);
            x[u] = chunk_from_float<Tin, kVec>(f);
            store_chunk<St::kPlain>(res_out + c * kVec, x[u]);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = base + u * threads;
        if (c < a.chunks) {
          float part = 0.0f;
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const float f = x[u].get(j);
            part += f * f;
          }
          ss[0] += part;
        }
      }
    }
    group_sum<1>(ss, static_cast<int>(threads), 0, red[parity]);
    parity ^= 1;
    const float rstd = rsqrtf(ss[0] * a.inv_hidden + a.eps);
    if (threadIdx.x == 0 && a.rstd != nullptr) a.rstd[row] = rstd;

    const Tin* src = fused ? res_out : in;  // the normalized tensor r
    with_norm_round(a.norm_round, [&](auto round_tag) {
      with_bool(a.scale != nullptr, [&](auto mod_tag) {
        constexpr NormRound kRound = decltype(round_tag)::value;
        constexpr bool kModulated = decltype(mod_tag)::value;
        Tout* out = static_cast<Tout*>(a.out) + row * a.out_stride;
        const Tin* scale = nullptr;
        const Tin* shift = nullptr;
        if constexpr (kModulated) {
          const int64_t b = a.sample_of_row.div(row);
          scale = static_cast<const Tin*>(a.scale) + b * a.scale_stride;
          shift = static_cast<const Tin*>(a.shift) + b * a.shift_stride;
        }
        for (int64_t base = threadIdx.x; base < a.chunks; base += step) {
          Chunk<Tin, kVec> x[kUnroll] = {};
          Chunk<Tw, kVec> w[kUnroll] = {};
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            const int64_t c = base + u * threads;
            if (c < a.chunks) {
              x[u] = load_chunk<Ld::kPlain, Tin, kVec>(src + c * kVec);
              if (has_weight) w[u] = load_chunk<Ld::kReadOnly, Tw, kVec>(weight + c * kVec);
            }
          }
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            const int64_t c = base + u * threads;
            if (c < a.chunks) {
              fwd_store_chunk<kRound, kModulated>(out, c * kVec, x[u], w[u], has_weight,
                                                  a.weight_offset, scale, shift, rstd);
            }
          }
        }
      });
    });
  }
}

// ---------------------------------------------------------------------------------------------
// Backward.
// ---------------------------------------------------------------------------------------------
struct BwdArgs {
  void* grad_input;           // [rows, hidden], Tin
  const void* grad_out;       // [rows, hidden], Tout
  const void* input;          // [rows, hidden], Tin: the normalized tensor r
  const void* grad_residual;  // [rows, hidden], Tin, or null
  const void* weight;         // [hidden], Tw, or null
  const void* scale;          // [batch, hidden], Tin, or null (not modulated)
  float* ws_weight;           // [partials, hidden] partial sums of grad_weight, or null
  float* ws_scale;            // [partials, hidden] of grad_scale, or null
  float* ws_shift;            // [partials, hidden] of grad_shift, or null
  int64_t grad_input_stride;
  int64_t grad_out_stride;
  int64_t input_stride;
  int64_t grad_residual_stride;
  int64_t scale_stride;
  int64_t rows;
  int64_t hidden;
  int64_t chunks;                // chunks per row: hidden / kVec
  int64_t rows_per_sample;       // rows when not modulated
  int64_t ctas_per_sample;       // partials of one sample
  int64_t rows_per_cta;          // rows of one partial (the last of a sample may have fewer)
  int64_t partials;              // batch x ctas_per_sample
  FastDivU64 sample_of_partial;  // part / ctas_per_sample
  float inv_hidden;
  float weight_offset;  // 1 without a weight (bwd_terms)
  float eps;
  int group;  // threads per row
  int slots;  // rows in flight per CTA (groups per CTA)
  NormRound norm_round;
  bool prefetch_l2;  // ask L2 for the next row of a group (plan_bwd_prefetch)
};

// Backward modes: what the scale of a modulated forward adds.
enum BwdMode : int {
  kBwdPlain = 0,      // no scale
  kBwdModulated = 1,  // gy = grad_out * (1 + scale), no grad_scale / grad_shift
  kBwdModGrads = 2,   // and the grad_scale / grad_shift partials
};

// Rows [begin, end) of partial `part`: a contiguous range inside one sample (possibly empty).
struct RowRange {
  int64_t sample;
  int64_t begin;
  int64_t end;
};
__device__ __forceinline__ RowRange partial_rows(const BwdArgs& a, int64_t part) {
  RowRange r;
  r.sample = a.sample_of_partial.div(part);
  const int64_t first = r.sample * a.rows_per_sample;
  const int64_t sample_end = min64(first + a.rows_per_sample, a.rows);
  r.begin = first + (part - r.sample * a.ctas_per_sample) * a.rows_per_cta;
  r.end = min64(r.begin + a.rows_per_cta, sample_end);
  if (r.end < r.begin) r.end = r.begin;
  return r;
}

// The per-element backward terms: go = grad_out, gy = go (* (1 + scale)), w', gn = gy * w'.
// `modulated` is a compile-time constant in the register-resident kernel. w' = weight_offset + w
// with or without a weight: without one, w stays 0 (the chunks start zeroed and are never
// loaded) and the launcher passes weight_offset = 1 (BwdArgs), so no select per element. The
// register-resident kernel also instantiates kOffset = false for weight_offset == 0 (a plain
// weight, not Gemma's 1 + w): w' = w, one add fewer per element and pass of an issue-bound loop.
struct BwdTerms {
  float go, gy, wp, gn;
};
template <bool kOffset = true>
__device__ __forceinline__ BwdTerms bwd_terms(float g, float w, float s, bool modulated,
                                              float weight_offset) {
  BwdTerms t;
  t.go = g;
  t.gy = modulated ? t.go * (1.0f + s) : t.go;
  t.wp = kOffset ? weight_offset + w : w;
  t.gn = t.gy * t.wp;
  return t;
}

// ws[c * kVec + j] += add[j] (the wide backward's partials; plain accesses, owner thread only).
template <int kVec>
__device__ __forceinline__ void accumulate_partial(float* ws, int64_t c, const float (&add)[kVec]) {
  if (ws == nullptr) return;
  const Chunk<float, kVec> p = load_chunk<Ld::kPlain, float, kVec>(ws + c * kVec);
  float sum[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) sum[j] = p.get(j) + add[j];
  store_chunk<St::kPlain>(ws + c * kVec, chunk_from_float<float, kVec>(sum));
}

// acc_smem[slot, hidden]: the grad_weight column partials of the CTA, one row per slot, each
// element read and written only by the thread that owns its column (plain shared accesses).
template <int kVec>
__device__ __forceinline__ void add_to_smem(float* p, const float (&add)[kVec]) {
  const Chunk<float, kVec> v = load_chunk<Ld::kPlain, float, kVec>(p);
  float sum[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) sum[j] = v.get(j) + add[j];
  store_chunk<St::kPlain>(p, chunk_from_float<float, kVec>(sum));
}

// Writes row `part` of ws: for each column, the sum over slots of acc_smem[slot, column]
// (fixed order). The caller has made acc_smem complete (a barrier after the last write).
__device__ __forceinline__ void flush_partials(float* ws, const float* acc_smem, const BwdArgs& a,
                                               int64_t part) {
  if (ws == nullptr) return;  // uniform
  float* dst = ws + part * a.hidden;
  const int hidden = static_cast<int>(a.hidden);  // <= kBwdMaxGroup x 16
  for (int col = threadIdx.x; col < hidden; col += blockDim.x) {
    float s = 0.0f;
    for (int i = 0; i < a.slots; ++i) s += acc_smem[i * hidden + col];
    dst[col] = s;
  }
}

// Register partials (grad_scale / grad_shift): through acc_smem, once it is free, then flushed.
template <int kVec, int kChunks>
__device__ __forceinline__ void flush_register_partials(float* ws,
                                                        const float (&acc)[kChunks][kVec],
                                                        float* acc_smem, const BwdArgs& a,
                                                        int64_t part, int slot, int lane) {
  if (ws == nullptr) return;  // uniform
  const int chunks = static_cast<int>(a.chunks);
  __syncthreads();  // acc_smem has been read by the previous flush
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = lane + k * a.group;
    if (c < chunks) {
      store_chunk<St::kPlain>(acc_smem + slot * a.hidden + c * kVec,
                              chunk_from_float<float, kVec>(acc[k]));
    }
  }
  __syncthreads();
  flush_partials(ws, acc_smem, a, part);
}

// The epilogue of one row of the register-resident backward: grad_input of this thread's chunks,
// and their contributions to the column partials.
template <NormRound kRound, int kMode, bool kOffset, bool kGres, typename Tin, typename Tw,
          typename Tout, int kVec, int kChunks, int kModChunks, int kAccChunks>
__device__ __forceinline__ void bwd_store_row(
    const BwdArgs& a, const Chunk<Tin, kVec> (&x)[kChunks], const Chunk<Tout, kVec> (&g)[kChunks],
    const Chunk<Tin, kVec> (&gr)[kChunks], const Chunk<Tw, kVec> (&w)[kChunks],
    const Chunk<Tin, kVec> (&s)[kModChunks], float* acc_w, float (&acc_s)[kAccChunks][kVec],
    float (&acc_sh)[kAccChunks][kVec], int64_t row, int lane, int chunks, float rstd,
    float mean_gn_n) {
  Tin* gin = static_cast<Tin*>(a.grad_input) + row * a.grad_input_stride;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = lane + k * a.group;
    if (c < chunks) {
      float out[kVec], dw[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float r = x[k].get(j);
        const BwdTerms t =
            bwd_terms<kOffset>(g[k].get(j), w[k].get(j), s[kMode != kBwdPlain ? k : 0].get(j),
                               kMode != kBwdPlain, a.weight_offset);
        const float n = r * rstd;
        float v = rstd * (t.gn - n * mean_gn_n);
        if constexpr (kGres) v += gr[k].get(j);
        out[j] = v;
        const float nr = round_norm<kRound>(n);
        dw[j] = t.gy * nr;
        if constexpr (kMode == kBwdModGrads) {
          acc_s[k][j] += t.go * nr * t.wp;
          acc_sh[k][j] += t.go;
        }
      }
      store_chunk<St::kStream>(gin + c * kVec, chunk_from_float<Tin, kVec>(out));
      add_to_smem(acc_w + c * kVec, dw);
    }
  }
}

// The weight (and, modulated, scale) chunks of this thread's columns, through L1.
template <bool kModulated, typename Tin, typename Tw, int kVec, int kChunks, int kModChunks>
__device__ __forceinline__ void load_weight_scale(Chunk<Tw, kVec> (&w)[kChunks],
                                                  Chunk<Tin, kVec> (&s)[kModChunks],
                                                  const Tw* weight, const Tin* scale, int lane,
                                                  int group, int chunks) {
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = lane + k * group;
    if (c < chunks) {
      if (weight != nullptr) w[k] = load_chunk<Ld::kReadOnly, Tw, kVec>(weight + c * kVec);
      if constexpr (kModulated) s[k] = load_chunk<Ld::kReadOnly, Tin, kVec>(scale + c * kVec);
    }
  }
}

// Register-resident backward: persistent CTAs over the rows of their partial; each group of
// `group` threads handles one row per step, `slots` rows at a time per CTA. The grad_weight
// partials accumulate in shared memory (registers are the limit here, not shared memory), the
// grad_scale / grad_shift partials in registers.
template <typename Tin, typename Tw, typename Tout, int kVec, int kChunks, int kMode>
__global__ void __launch_bounds__(LaunchConfig::kBwdMaxGroup,
                                  BwdShape<Tin, Tw, Tout, kVec, kMode>::kMinBlocks)
    rms_norm_bwd_kernel(const BwdArgs a) {
  constexpr bool kModulated = kMode != kBwdPlain;
  constexpr int kModChunks = kModulated ? kChunks : 1;
  constexpr int kAccChunks = kMode == kBwdModGrads ? kChunks : 1;
  extern __shared__ __align__(16) float acc_smem[];  // [slots, hidden]
  __shared__ float red[2][2][32];
  pdl::wait_and_release();
  const int group = a.group;
  const int slot = static_cast<int>(threadIdx.x) / group;
  const int lane = static_cast<int>(threadIdx.x) - slot * group;
  const int chunks = static_cast<int>(a.chunks);  // <= kBwdMaxGroup x kChunks
  const Tw* weight = static_cast<const Tw*>(a.weight);
  const bool has_gres = a.grad_residual != nullptr;
  float* acc_w = acc_smem + slot * a.hidden;

  int parity = 0;
  const int64_t part = blockIdx.x;  // one CTA per partial (grid = partials)
  const RowRange range = partial_rows(a, part);
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int c = lane + k * group;
    if (c < chunks) store_chunk<St::kPlain>(acc_w + c * kVec, Chunk<float, kVec>{});
  }
  // The CTA's rows are all in one sample.
  const Tin* scale =
      kModulated ? static_cast<const Tin*>(a.scale) + range.sample * a.scale_stride : nullptr;
  float acc_s[kAccChunks][kVec] = {};
  float acc_sh[kAccChunks][kVec] = {};

  // Every group runs the same number of steps (the barriers), inactive past the range's end.
  // The loop is instantiated with and without the weight offset (bwd_terms) and grad_residual:
  // as runtime tests, each cost an instruction per element (an issue-bound kernel).
  with_bool(a.weight_offset != 0.0f, [&](auto offset_tag) {
    with_bool(has_gres, [&](auto gres_tag) {
      constexpr bool kOffset = decltype(offset_tag)::value;
      constexpr bool kGres = decltype(gres_tag)::value;
      for (int64_t first_row = range.begin; first_row < range.end; first_row += a.slots) {
        const int64_t row = first_row + slot;
        const bool active = row < range.end;
        Chunk<Tin, kVec> x[kChunks] = {};
        Chunk<Tout, kVec> g[kChunks] = {};
        Chunk<Tin, kVec> gr[kChunks] = {};
        Chunk<Tw, kVec> w[kChunks] = {};
        Chunk<Tin, kVec> s[kModChunks] = {};
        float sums[2] = {0.0f, 0.0f};  // sum r^2, sum gn * r
        if (active) {
          const Tin* in = static_cast<const Tin*>(a.input) + row * a.input_stride;
          const Tout* go = static_cast<const Tout*>(a.grad_out) + row * a.grad_out_stride;
#pragma unroll
          for (int k = 0; k < kChunks; ++k) {
            const int c = lane + k * group;
            if (c < chunks) {
              x[k] = load_chunk<Ld::kStream, Tin, kVec>(in + c * kVec);
              g[k] = load_chunk<Ld::kStream, Tout, kVec>(go + c * kVec);
            }
          }
          if constexpr (kGres) {
            const Tin* gres =
                static_cast<const Tin*>(a.grad_residual) + row * a.grad_residual_stride;
#pragma unroll
            for (int k = 0; k < kChunks; ++k) {
              const int c = lane + k * group;
              if (c < chunks) gr[k] = load_chunk<Ld::kStream, Tin, kVec>(gres + c * kVec);
            }
          }
          if constexpr (kVec > 1 && LaunchConfig::kBwdPrefetchSteps > 0) {
            const int64_t ahead =
                row + static_cast<int64_t>(LaunchConfig::kBwdPrefetchSteps) * a.slots;
            if (a.prefetch_l2 && lane == 0 && !kGres && ahead < range.end) {
              prefetch_l2(static_cast<const Tin*>(a.input) + ahead * a.input_stride,
                          static_cast<uint32_t>(a.hidden * sizeof(Tin)));
              prefetch_l2(static_cast<const Tout*>(a.grad_out) + ahead * a.grad_out_stride,
                          static_cast<uint32_t>(a.hidden * sizeof(Tout)));
            }
          }
          load_weight_scale<kModulated>(w, s, weight, scale, lane, group, chunks);
#pragma unroll
          for (int k = 0; k < kChunks; ++k) {
            const int c = lane + k * group;
            if (c < chunks) {
              float ss = 0.0f, dot = 0.0f;
#pragma unroll
              for (int j = 0; j < kVec; ++j) {
                const float r = x[k].get(j);
                const BwdTerms t =
                    bwd_terms<kOffset>(g[k].get(j), w[k].get(j), s[kModulated ? k : 0].get(j),
                                       kModulated, a.weight_offset);
                ss += r * r;
                dot += t.gn * r;
              }
              sums[0] += ss;
              sums[1] += dot;
            }
          }
        }
        group_sum<2>(sums, group, slot, red[parity]);
        parity ^= 1;
        launder(x);
        launder(g);
        launder(gr);
        if (!active) continue;
        // weight and scale again, from L1: cheaper than keeping them in registers across the
        // reduction (the loads are volatile asm, so they are not merged with the first ones).
        load_weight_scale<kModulated>(w, s, weight, scale, lane, group, chunks);
        const float rstd = rsqrtf(sums[0] * a.inv_hidden + a.eps);
        const float mean_gn_n = sums[1] * rstd * a.inv_hidden;  // mean(gn * n), n = r * rstd

        with_norm_round(a.norm_round, [&](auto round_tag) {
          bwd_store_row<decltype(round_tag)::value, kMode, kOffset, kGres>(
              a, x, g, gr, w, s, acc_w, acc_s, acc_sh, row, lane, chunks, rstd, mean_gn_n);
        });
      }
    });
  });
  __syncthreads();  // acc_smem complete
  flush_partials(a.ws_weight, acc_smem, a, part);
  if constexpr (kMode == kBwdModGrads) {
    flush_register_partials(a.ws_scale, acc_s, acc_smem, a, part, slot, lane);
    flush_register_partials(a.ws_shift, acc_sh, acc_smem, a, part, slot, lane);
  }
}

// Rows wider than the register path: one CTA per partial, two passes per row (sums, then
// grad_input), the column partials accumulated in the CTA's own workspace rows, each element
// read and written by the one thread that owns its column (plain accesses, program order).
template <typename Tin, typename Tw, typename Tout, int kVec>
__global__ void __launch_bounds__(LaunchConfig::kBwdWideThreads, 1)
    rms_norm_bwd_wide_kernel(const BwdArgs a) {
  constexpr int kUnroll = kVec == 1 ? 4 : 2;
  __shared__ float red[2][2][32];
  pdl::wait_and_release();
  const int64_t threads = blockDim.x;
  const int64_t step = threads * kUnroll;
  const Tw* weight = static_cast<const Tw*>(a.weight);
  const bool has_weight = weight != nullptr;
  const bool modulated = a.scale != nullptr;
  const bool has_gres = a.grad_residual != nullptr;

  int parity = 0;
  const int64_t part = blockIdx.x;  // one CTA per partial (grid = partials)
  const RowRange range = partial_rows(a, part);
  const Tin* scale =
      modulated ? static_cast<const Tin*>(a.scale) + range.sample * a.scale_stride : nullptr;
  float* ws[3] = {a.ws_weight ? a.ws_weight + part * a.hidden : nullptr,
                  a.ws_scale ? a.ws_scale + part * a.hidden : nullptr,
                  a.ws_shift ? a.ws_shift + part * a.hidden : nullptr};
  for (int64_t c = threadIdx.x; c < a.chunks; c += threads) {
    const Chunk<float, kVec> zero{};
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      if (ws[i] != nullptr) store_chunk<St::kPlain>(ws[i] + c * kVec, zero);
    }
  }

  for (int64_t row = range.begin; row < range.end; ++row) {
    const Tin* in = static_cast<const Tin*>(a.input) + row * a.input_stride;
    const Tout* go = static_cast<const Tout*>(a.grad_out) + row * a.grad_out_stride;
    float sums[2] = {0.0f, 0.0f};
    for (int64_t base = threadIdx.x; base < a.chunks; base += step) {
      Chunk<Tin, kVec> x[kUnroll] = {}, s[kUnroll] = {};
      Chunk<Tout, kVec> g[kUnroll] = {};
      Chunk<Tw, kVec> w[kUnroll] = {};
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = base + u * threads;
        if (c < a.chunks) {
          x[u] = load_chunk<Ld::kPlain, Tin, kVec>(in + c * kVec);
          g[u] = load_chunk<Ld::kPlain, Tout, kVec>(go + c * kVec);
          if (has_weight) w[u] = load_chunk<Ld::kReadOnly, Tw, kVec>(weight + c * kVec);
          if (modulated) s[u] = load_chunk<Ld::kReadOnly, Tin, kVec>(scale + c * kVec);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = base + u * threads;
        if (c < a.chunks) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const float r = x[u].get(j);
            const BwdTerms t =
                bwd_terms(g[u].get(j), w[u].get(j), s[u].get(j), modulated, a.weight_offset);
            sums[0] += r * r;
            sums[1] += t.gn * r;
          }
        }
      }
    }
    group_sum<2>(sums, static_cast<int>(threads), 0, red[parity]);
    parity ^= 1;
    const float rstd = rsqrtf(sums[0] * a.inv_hidden + a.eps);
    const float mean_gn_n = sums[1] * rstd * a.inv_hidden;

    with_norm_round(a.norm_round, [&](auto round_tag) {
      constexpr NormRound kRound = decltype(round_tag)::value;
      Tin* gin = static_cast<Tin*>(a.grad_input) + row * a.grad_input_stride;
      const Tin* gres =
          has_gres ? static_cast<const Tin*>(a.grad_residual) + row * a.grad_residual_stride
                   : nullptr;
      for (int64_t base = threadIdx.x; base < a.chunks; base += step) {
        Chunk<Tin, kVec> x[kUnroll] = {}, s[kUnroll] = {}, gr[kUnroll] = {};
        Chunk<Tout, kVec> g[kUnroll] = {};
        Chunk<Tw, kVec> w[kUnroll] = {};
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t c = base + u * threads;
          if (c < a.chunks) {
            x[u] = load_chunk<Ld::kPlain, Tin, kVec>(in + c * kVec);
            g[u] = load_chunk<Ld::kPlain, Tout, kVec>(go + c * kVec);
            if (has_gres) gr[u] = load_chunk<Ld::kPlain, Tin, kVec>(gres + c * kVec);
            if (has_weight) w[u] = load_chunk<Ld::kReadOnly, Tw, kVec>(weight + c * kVec);
            if (modulated) s[u] = load_chunk<Ld::kReadOnly, Tin, kVec>(scale + c * kVec);
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t c = base + u * threads;
          if (c < a.chunks) {
            float out[kVec], dw[kVec], ds[kVec], dsh[kVec];
#pragma unroll
            for (int j = 0; j < kVec; ++j) {
              const float r = x[u].get(j);
              const BwdTerms t =
                  bwd_terms(g[u].get(j), w[u].get(j), s[u].get(j), modulated, a.weight_offset);
              const float n = r * rstd;
              float v = rstd * (t.gn - n * mean_gn_n);
              if (has_gres) v += gr[u].get(j);
              out[j] = v;
              const float nr = round_norm<kRound>(n);
              dw[j] = t.gy * nr;
              ds[j] = t.go * nr * t.wp;
              dsh[j] = t.go;
            }
            store_chunk<St::kStream>(gin + c * kVec, chunk_from_float<Tin, kVec>(out));
            accumulate_partial(ws[0], c, dw);
            accumulate_partial(ws[1], c, ds);
            accumulate_partial(ws[2], c, dsh);
          }
        }
      }
    });
  }
}

// Second backward kernel: out[col] = sum of the partial rows of one job, in a fixed order.
// Jobs: grad_weight over all partials, then grad_scale of each sample, then grad_shift of each
// sample, over that sample's ctas_per_sample partials. Warp w of a block adds partials w,
// w + kWarps, ... of 32 columns (128-byte rows), then the warp sums are added in order.
struct ReduceArgs {
  const float* ws_weight;  // [partials, hidden] or null
  const float* ws_scale;   // [partials, hidden] or null
  const float* ws_shift;   // [partials, hidden] or null
  void* grad_weight;       // [hidden], Tw
  void* grad_scale;        // [batch, hidden], Tin
  void* grad_shift;        // [batch, hidden], Tin
  int64_t grad_scale_stride;
  int64_t grad_shift_stride;
  int64_t hidden;
  int64_t batch;
  int64_t ctas_per_sample;
  int64_t partials;
  int64_t col_blocks;       // ceil(hidden / 32)
  int64_t blocks;           // jobs x col_blocks
  FastDivU64 job_of_block;  // blk / col_blocks
};

template <typename Tin, typename Tw>
__global__ void __launch_bounds__(LaunchConfig::kReduceThreads, 1)
    rms_norm_bwd_reduce_kernel(const ReduceArgs a) {
  constexpr int kWarps = LaunchConfig::kReduceThreads / 32;
  constexpr int kUnroll = LaunchConfig::kReduceUnroll;
  __shared__ float red[kWarps][32];
  pdl::wait_and_release();
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  for (int64_t blk = blockIdx.x; blk < a.blocks; blk += gridDim.x) {
    int64_t job = a.job_of_block.div(blk);
    const int64_t col = (blk - job * a.col_blocks) * 32 + lane;
    const float* src;
    int64_t count;
    int kind;  // 0: weight, 1: scale, 2: shift
    int64_t sample = 0;
    if (a.ws_weight != nullptr && job == 0) {
      kind = 0;
      src = a.ws_weight;
      count = a.partials;
    } else {
      if (a.ws_weight != nullptr) --job;
      if (a.ws_scale != nullptr && job < a.batch) {
        kind = 1;
        sample = job;
        src = a.ws_scale;
      } else {
        kind = 2;
        sample = a.ws_scale != nullptr ? job - a.batch : job;
        src = a.ws_shift;
      }
      src += sample * a.ctas_per_sample * a.hidden;
      count = a.ctas_per_sample;
    }
    float sum = 0.0f;
    if (col < a.hidden) {
      const float* p = src + col;
      float s[kUnroll] = {};
      int64_t i = warp;
      for (; i + (kUnroll - 1) * kWarps < count; i += kUnroll * kWarps) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          s[u] += load_chunk<Ld::kStream, float, 1>(p + (i + u * kWarps) * a.hidden).get(0);
        }
      }
      for (; i < count; i += kWarps)
        s[0] += load_chunk<Ld::kStream, float, 1>(p + i * a.hidden).get(0);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) sum += s[u];
    }
    red[warp][lane] = sum;
    __syncthreads();
    if (warp == 0 && col < a.hidden) {
      float total = 0.0f;
#pragma unroll
      for (int i = 0; i < kWarps; ++i) total += red[i][lane];
      if (kind == 0) {
        static_cast<Tw*>(a.grad_weight)[col] = from_float<Tw>(total);
      } else if (kind == 1) {
        static_cast<Tin*>(a.grad_scale)[sample * a.grad_scale_stride + col] =
            from_float<Tin>(total);
      } else {
        static_cast<Tin*>(a.grad_shift)[sample * a.grad_shift_stride + col] =
            from_float<Tin>(total);
      }
    }
    __syncthreads();
  }
}

// ---------------------------------------------------------------------------------------------
// Host side: plans, alignment checks, launches and dtype dispatch.
// ---------------------------------------------------------------------------------------------

// Threads of a row group for `need` threads' worth of chunks: a power of two up to 32, else a
// multiple of 32 (whole warps).
int group_for(int64_t need) {
  if (need <= 32) {
    int g = 1;
    while (g < need) g <<= 1;
    return g;
  }
  return static_cast<int>(ceil_div(need, 32) * 32);
}

struct FwdPlan {
  bool two_pass;
  bool row_kernel;  // decode-sized, one row per CTA: rms_norm_fwd_row_kernel where it applies
  int chunks_per_thread;
  int group;
  int rows_per_cta;
};

FwdPlan plan_fwd(int64_t rows, int64_t chunks, bool wide_rows_ok, int sms) {
  FwdPlan p{};
  if (chunks > LaunchConfig::kFwdMaxRegisterChunks) {
    p.two_pass = true;
    p.group = LaunchConfig::kTwoPassThreads;
    p.rows_per_cta = 1;
    return p;
  }
  const bool few_rows = rows <= static_cast<int64_t>(LaunchConfig::kFwdFewRowsPerSm) * sms;
  // The fewest vectors per thread that fit in one group (decode-sized: in kFwdFewRowsMaxGroup).
  const int max_threads = few_rows ? LaunchConfig::kFwdFewRowsMaxGroup : LaunchConfig::max_group(1);
  int k = 1;
  while (ceil_div(chunks, k) > min64(LaunchConfig::max_group(k), max_threads)) k *= 2;
  if (!few_rows && k < LaunchConfig::kFwdChunksManyRows) k = LaunchConfig::kFwdChunksManyRows;
  if (wide_rows_ok && rows >= static_cast<int64_t>(LaunchConfig::kFwdWideMinRowsPerSm) * sms &&
      k < LaunchConfig::kFwdChunksWideRows && ceil_div(chunks, k) >= LaunchConfig::kFwdWideGroup) {
    k = LaunchConfig::kFwdChunksWideRows;
  }
  p.chunks_per_thread = k;
  p.group = group_for(ceil_div(chunks, k));
  p.rows_per_cta =
      p.group < LaunchConfig::kFwdCtaThreads ? LaunchConfig::kFwdCtaThreads / p.group : 1;
  p.row_kernel = few_rows && p.rows_per_cta == 1;
  return p;
}

// L2 prefetch distance of the register-resident forward (LaunchConfig::kFwdPrefetchBytesPerSm), in
// rows of prefetch_row_bytes (input, plus residual when fused); 0 below kFwdPrefetchMinBytes of
// input, with fewer than kFwdChunksManyRows vectors per thread (no prefetch code), or where no row
// lies that far ahead.
int64_t plan_fwd_prefetch(const FwdPlan& plan, int64_t rows, int64_t input_row_bytes,
                          int64_t prefetch_row_bytes, int sms) {
  if (plan.two_pass || plan.chunks_per_thread < LaunchConfig::kFwdChunksManyRows ||
      rows * input_row_bytes < LaunchConfig::kFwdPrefetchMinBytes) {
    return 0;
  }
  const int64_t ahead = LaunchConfig::kFwdPrefetchBytesPerSm * sms / prefetch_row_bytes;
  return ahead >= 1 && rows > 2 * ahead ? ahead : 0;
}

// Whether the register-resident backward asks L2 for each group's next row: when the rows its
// resident CTAs have in flight fall short of the SM's DRAM share over kBwdPrefetchWindowUs
// (LaunchConfig). dram_per_sm: bytes per microsecond, 0 where the device does not report it
// (then prefetch, as on the GPU where that paid everywhere; benchmarks/NOTES.md).
bool plan_bwd_prefetch(int ctas_per_sm, int slots, int64_t row_bytes, double dram_per_sm) {
  if (dram_per_sm <= 0.0) return true;
  const double in_flight = static_cast<double>(ctas_per_sm) * slots * row_bytes;
  return in_flight < dram_per_sm * LaunchConfig::kBwdPrefetchWindowUs;
}

// Backward row partition: ctas_per_sample partials per sample, each over rows_per_cta
// consecutive rows. It depends on the sizes and the SM count only (not on dtypes or alignment),
// so rms_norm_bwd_workspace_floats and rms_norm_bwd agree.
struct BwdPartition {
  int64_t batch;
  int64_t rows_per_sample;
  int64_t ctas_per_sample;
  int64_t rows_per_cta;
  int64_t partials;
};

BwdPartition partition_bwd(int64_t rows, int64_t rows_per_sample, int sms) {
  BwdPartition p{};
  p.rows_per_sample = rows_per_sample;
  p.batch = ceil_div(rows, rows_per_sample);
  const int64_t target = static_cast<int64_t>(sms) * LaunchConfig::kBwdCtasPerSm;
  int64_t cps = ceil_div(target, p.batch);
  // At least kBwdMinRowsPerCta rows per CTA while that still gives every SM a CTA; below that
  // (small batches) one row per CTA, so that no CTA walks its rows one after another.
  const int64_t min_rows =
      p.batch * ceil_div(rows_per_sample, LaunchConfig::kBwdMinRowsPerCta) >= sms
          ? LaunchConfig::kBwdMinRowsPerCta
          : 1;
  cps = min64(cps, ceil_div(rows_per_sample, min_rows));
  if (cps < 1) cps = 1;
  p.rows_per_cta = ceil_div(rows_per_sample, cps);
  p.ctas_per_sample = ceil_div(rows_per_sample, p.rows_per_cta);  // no empty partial
  p.partials = p.batch * p.ctas_per_sample;
  return p;
}

int64_t bwd_rows_per_sample(const RmsNormBwdParams& p) {
  return p.scale != nullptr ? p.rows_per_sample : p.rows;
}

int bwd_reductions(const RmsNormBwdParams& p) {
  return (p.grad_weight != nullptr) + (p.grad_scale != nullptr) + (p.grad_shift != nullptr);
}

// SM count of the current device.
cudaError_t current_sm_count(int* sms) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess && *sms <= 0) err = cudaErrorInvalidDevice;
  return err;
}

// Peak DRAM bytes per microsecond per SM of the current device (double data rate x bus width);
// 0 where the device does not report its memory clock or bus width. Cached per device: the
// memory clock query is slow (benchmarks/NOTES.md, "Smaller findings").
double dram_bytes_per_us_per_sm(int sms) {
  constexpr int kMaxDevices = 64;
  static std::atomic<double> cached[kMaxDevices] = {};  // 0: not asked yet, -1: not reported
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0.0;
  const bool cacheable = device >= 0 && device < kMaxDevices;
  if (cacheable) {
    const double known = cached[device].load(std::memory_order_relaxed);
    if (known != 0.0) return known > 0.0 ? known : 0.0;
  }
  int clock_khz = 0, bus_bits = 0;
  double rate = -1.0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess &&
      clock_khz > 0 && bus_bits > 0) {
    rate = 2.0 * clock_khz * 1e-3 * (bus_bits / 8.0) / sms;
  } else {
    (void)cudaGetLastError();  // not to be reported by a later launch check
  }
  if (cacheable) cached[device].store(rate, std::memory_order_relaxed);
  return rate > 0.0 ? rate : 0.0;
}

// PDL on sm_90+ by default only for the backward's reduce, which follows the backward kernel
// (after a GEMM a PDL rms_norm launch was slower; benchmarks/NOTES.md, "Smaller findings"); the
// params' pdl_request (enable_pdl) kOn for every launch, kOff for none (pdl.cuh).
template <typename Kernel, typename Args>
cudaError_t launch(pdl::Request pdl_request, pdl::ByDefault by_default, Kernel kernel, int64_t grid,
                   int threads, size_t smem, cudaStream_t stream, const Args& args) {
  return pdl::launch(pdl_request, by_default, kernel,
                     dim3(static_cast<unsigned>(grid < kMaxGrid ? grid : kMaxGrid)),
                     dim3(static_cast<unsigned>(threads)), smem, stream, args);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % LaunchConfig::kVectorBytes == 0;  // null is aligned
}
// Every row start stays 16-byte aligned (irrelevant for a single row).
bool rows_aligned(int64_t stride, size_t elem_bytes, int64_t rows) {
  return rows <= 1 || (stride * static_cast<int64_t>(elem_bytes)) % LaunchConfig::kVectorBytes == 0;
}
bool all_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs) {
    if (!aligned16(p)) return false;
  }
  return true;
}

NormRound to_norm_round(bool round_norm, DType norm_dtype, bool* ok) {
  *ok = true;
  if (!round_norm) return NormRound::kNone;
  switch (norm_dtype) {
    case DType::kFloat32:
      return NormRound::kNone;
    case DType::kFloat16:
      return NormRound::kHalf;
    case DType::kBFloat16:
      return NormRound::kBFloat16;
    default:
      *ok = false;
      return NormRound::kNone;
  }
}

// ---- forward ----

// Asks for LaunchConfig::kFwdCarveoutPercent for kKernel on sm_90 devices, once per device. The
// carveout is a hint: where it cannot be set, the driver's choice stands and nothing is reported.
template <auto kKernel>
void prefer_fwd_carveout() {
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> asked[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    (void)cudaGetLastError();
    return;
  }
  if (asked[device].load(std::memory_order_relaxed)) return;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      (major == 9 && cudaFuncSetAttribute(kKernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                          LaunchConfig::kFwdCarveoutPercent) != cudaSuccess)) {
    (void)cudaGetLastError();  // not to be reported by the launch check
  }
  asked[device].store(true, std::memory_order_relaxed);
}

// The register-resident forward with kChunks vectors per thread; its prefetching instance where
// plan_fwd_prefetch set a distance (which it does only on the vector path, from
// kFwdChunksManyRows vectors per thread: no other instance is built). Those many-row instances
// run with the shared memory carveout of LaunchConfig::kFwdCarveoutPercent.
template <typename Tin, typename Tw, typename Tout, int kVec, int kChunks>
cudaError_t launch_fwd_register(const FwdArgs& args, int threads, pdl::Request pdl_request,
                                cudaStream_t stream) {
  constexpr auto kKernel = rms_norm_fwd_kernel<Tin, Tw, Tout, kVec, kChunks>;
  if constexpr (kChunks >= LaunchConfig::kFwdChunksManyRows) {
    if constexpr (kVec > 1) {
      if (args.prefetch_rows > 0) {
        constexpr auto kPrefetching = rms_norm_fwd_kernel<Tin, Tw, Tout, kVec, kChunks, true>;
        prefer_fwd_carveout<kPrefetching>();
        return launch(pdl_request, pdl::ByDefault::kPlain, kPrefetching, args.row_blocks, threads,
                      0, stream, args);
      }
    }
    prefer_fwd_carveout<kKernel>();
  }
  return launch(pdl_request, pdl::ByDefault::kPlain, kKernel, args.row_blocks, threads, 0, stream,
                args);
}

template <typename Tin, typename Tw, typename Tout, int kVec, int kChunks>
cudaError_t launch_fwd_rows(const FwdArgs& args, int threads, pdl::Request pdl_request,
                            cudaStream_t stream) {
  return launch(pdl_request, pdl::ByDefault::kPlain,
                rms_norm_fwd_row_kernel<Tin, Tw, Tout, kVec, kChunks>, args.rows, threads, 0,
                stream, args);
}

template <typename Tin, typename Tw, typename Tout, int kVec>
cudaError_t launch_fwd(FwdArgs args, int sms, pdl::Request pdl_request, cudaStream_t stream) {
  args.chunks = args.hidden / kVec;
  // 8 vectors per thread for wide rows: not with a residual, nor with an fp16 weight (LaunchConfig).
  const bool wide_rows_ok = args.residual == nullptr && !std::is_same<Tw, __half>::value;
  const FwdPlan plan = plan_fwd(args.rows, args.chunks, wide_rows_ok, sms);
  args.group = plan.group;
  args.rows_per_cta = plan.rows_per_cta;
  args.row_blocks = ceil_div(args.rows, plan.rows_per_cta);
  const int threads = plan.group * plan.rows_per_cta;
  // Bulk prefetches need 16-byte aligned rows of whole vectors: the vector path.
  const int64_t row_bytes = args.hidden * static_cast<int64_t>(sizeof(Tin));
  args.prefetch_rows = kVec > 1
                           ? plan_fwd_prefetch(plan, args.rows, row_bytes,
                                               (args.residual != nullptr ? 2 : 1) * row_bytes, sms)
                           : 0;
  if (plan.two_pass) {
    return launch(pdl_request, pdl::ByDefault::kPlain,
                  rms_norm_fwd_two_pass_kernel<Tin, Tw, Tout, kVec>, args.rows, threads, 0, stream,
                  args);
  }
  // The row kernel: vector path, not modulated (the general kernel takes the other forms).
  const bool row_kernel = kVec > 1 && plan.row_kernel && args.scale == nullptr;
  auto launch_k = [&](auto chunks_tag) {
    constexpr int kChunks = decltype(chunks_tag)::value;
    if constexpr (kVec > 1) {
      if (row_kernel) {
        return launch_fwd_rows<Tin, Tw, Tout, kVec, kChunks>(args, threads, pdl_request, stream);
      }
    }
    return launch_fwd_register<Tin, Tw, Tout, kVec, kChunks>(args, threads, pdl_request, stream);
  };
  switch (plan.chunks_per_thread) {
    case 1:
      return launch_k(std::integral_constant<int, 1>{});
    case 2:
      return launch_k(std::integral_constant<int, 2>{});
    case 4:
      return launch_k(std::integral_constant<int, 4>{});
    case 8:
      return launch_k(std::integral_constant<int, 8>{});
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename Tin, typename Tw, typename Tout>
cudaError_t run_fwd(const RmsNormFwdParams& p, cudaStream_t stream) {
  const pdl::Request pdl_request = p.pdl_request;
  if (p.rows < 0) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  bool round_ok = false;
  const NormRound norm_round = to_norm_round(p.round_norm, p.norm_dtype, &round_ok);
  if (!round_ok || p.hidden <= 0 || p.out == nullptr || p.input == nullptr ||
      (p.residual == nullptr) != (p.residual_out == nullptr) ||
      (p.scale == nullptr) != (p.shift == nullptr) ||
      (p.scale != nullptr && p.rows_per_sample <= 0)) {
    return cudaErrorInvalidValue;
  }
  int sms = 0;
  if (const cudaError_t err = current_sm_count(&sms); err != cudaSuccess) return err;

  FwdArgs args{};
  args.out = p.out;
  args.input = p.input;
  args.residual = p.residual;
  args.residual_out = p.residual_out;
  args.weight = p.weight;
  args.scale = p.scale;
  args.shift = p.shift;
  args.rstd = p.rstd;
  args.out_stride = p.out_stride;
  args.input_stride = p.input_stride;
  args.residual_stride = p.residual_stride;
  args.residual_out_stride = p.residual_out_stride;
  args.scale_stride = p.scale_stride;
  args.shift_stride = p.shift_stride;
  args.rows = p.rows;
  args.hidden = p.hidden;
  const int64_t rows_per_sample = p.scale != nullptr ? p.rows_per_sample : p.rows;
  args.sample_of_row = FastDivU64::make(static_cast<uint64_t>(rows_per_sample));
  args.inv_hidden = static_cast<float>(1.0 / static_cast<double>(p.hidden));
  args.weight_offset = p.weight_offset;
  args.eps = p.eps;
  args.norm_round = norm_round;

  constexpr int V = kVecWidth<Tin>;
  const int64_t batch = ceil_div(p.rows, rows_per_sample);
  const bool vec =
      p.hidden % V == 0 &&
      all_aligned({p.out, p.input, p.residual, p.residual_out, p.weight, p.scale, p.shift}) &&
      rows_aligned(p.out_stride, sizeof(Tout), p.rows) &&
      rows_aligned(p.input_stride, sizeof(Tin), p.rows) &&
      (p.residual == nullptr || (rows_aligned(p.residual_stride, sizeof(Tin), p.rows) &&
                                 rows_aligned(p.residual_out_stride, sizeof(Tin), p.rows))) &&
      (p.scale == nullptr || (rows_aligned(p.scale_stride, sizeof(Tin), batch) &&
                              rows_aligned(p.shift_stride, sizeof(Tin), batch)));
  return vec ? launch_fwd<Tin, Tw, Tout, V>(args, sms, pdl_request, stream)
             : launch_fwd<Tin, Tw, Tout, 1>(args, sms, pdl_request, stream);
}

// ---- backward ----

template <typename Tin, typename Tw, typename Tout, int kVec, int kMode>
cudaError_t launch_bwd_mode(BwdArgs args, double dram_per_sm, pdl::Request pdl_request,
                            cudaStream_t stream) {
  constexpr int kChunks = BwdShape<Tin, Tw, Tout, kVec, kMode>::kChunks;
  args.chunks = args.hidden / kVec;
  const int group = group_for(ceil_div(args.chunks, kChunks));
  if (group > LaunchConfig::kBwdMaxGroup) {
    args.group = LaunchConfig::kBwdWideThreads;
    args.slots = 1;
    return launch(pdl_request, pdl::ByDefault::kPlain,
                  rms_norm_bwd_wide_kernel<Tin, Tw, Tout, kVec>, args.partials,
                  LaunchConfig::kBwdWideThreads, 0, stream, args);
  }
  args.group = group;
  args.slots = group < LaunchConfig::kBwdCtaThreads ? LaunchConfig::kBwdCtaThreads / group : 1;
  const int64_t row_bytes = args.hidden * static_cast<int64_t>(sizeof(Tin) + sizeof(Tout));
  args.prefetch_l2 = plan_bwd_prefetch(BwdShape<Tin, Tw, Tout, kVec, kMode>::kMinBlocks, args.slots,
                                       row_bytes, dram_per_sm);
  // The grad_weight partials [slots, hidden] in shared memory: hidden <= group x kChunks x kVec
  // and group x slots <= 512, so at most 512 x 16 floats (32 KB, within the default 48 KB).
  static_assert(kChunks * kVec <= LaunchConfig::kBwdColumns, "shared memory bound");
  const size_t smem =
      sizeof(float) * static_cast<size_t>(args.slots) * static_cast<size_t>(args.hidden);
  return launch(pdl_request, pdl::ByDefault::kPlain,
                rms_norm_bwd_kernel<Tin, Tw, Tout, kVec, kChunks, kMode>, args.partials,
                group * args.slots, smem, stream, args);
}

template <typename Tin, typename Tw, typename Tout, int kVec>
cudaError_t launch_bwd(const BwdArgs& args, double dram_per_sm, pdl::Request pdl_request,
                       cudaStream_t stream) {
  if (args.scale == nullptr) {
    return launch_bwd_mode<Tin, Tw, Tout, kVec, kBwdPlain>(args, dram_per_sm, pdl_request, stream);
  }
  if (args.ws_scale == nullptr && args.ws_shift == nullptr) {
    return launch_bwd_mode<Tin, Tw, Tout, kVec, kBwdModulated>(args, dram_per_sm, pdl_request,
                                                               stream);
  }
  return launch_bwd_mode<Tin, Tw, Tout, kVec, kBwdModGrads>(args, dram_per_sm, pdl_request, stream);
}

template <typename Tin, typename Tw, typename Tout>
cudaError_t run_bwd(const RmsNormBwdParams& p, cudaStream_t stream) {
  const pdl::Request pdl_request = p.pdl_request;
  if (p.rows < 0) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  bool round_ok = false;
  const NormRound norm_round = to_norm_round(p.round_norm, p.norm_dtype, &round_ok);
  const int reductions = bwd_reductions(p);
  if (!round_ok || p.hidden <= 0 || p.grad_input == nullptr || p.grad_out == nullptr ||
      p.input == nullptr ||
      ((p.grad_scale != nullptr || p.grad_shift != nullptr) && p.scale == nullptr) ||
      (p.scale != nullptr && p.rows_per_sample <= 0) ||
      (reductions > 0 && p.workspace == nullptr)) {
    return cudaErrorInvalidValue;
  }
  int sms = 0;
  if (const cudaError_t err = current_sm_count(&sms); err != cudaSuccess) return err;
  const BwdPartition part = partition_bwd(p.rows, bwd_rows_per_sample(p), sms);
  // One CTA per partial: more than 2^31 - 1 takes more than 2^31 - 1 samples of one row each.
  if (part.partials > kMaxGrid) return cudaErrorInvalidValue;

  BwdArgs args{};
  args.grad_input = p.grad_input;
  args.grad_out = p.grad_out;
  args.input = p.input;
  args.grad_residual = p.grad_residual;
  args.weight = p.weight;
  args.scale = p.scale;
  float* cursor = p.workspace;
  const int64_t per_reduction = part.partials * p.hidden;
  if (p.grad_weight != nullptr) {
    args.ws_weight = cursor;
    cursor += per_reduction;
  }
  if (p.grad_scale != nullptr) {
    args.ws_scale = cursor;
    cursor += per_reduction;
  }
  if (p.grad_shift != nullptr) args.ws_shift = cursor;
  args.grad_input_stride = p.grad_input_stride;
  args.grad_out_stride = p.grad_out_stride;
  args.input_stride = p.input_stride;
  args.grad_residual_stride = p.grad_residual_stride;
  args.scale_stride = p.scale_stride;
  args.rows = p.rows;
  args.hidden = p.hidden;
  args.rows_per_sample = part.rows_per_sample;
  args.ctas_per_sample = part.ctas_per_sample;
  args.rows_per_cta = part.rows_per_cta;
  args.partials = part.partials;
  args.sample_of_partial = FastDivU64::make(static_cast<uint64_t>(part.ctas_per_sample));
  args.inv_hidden = static_cast<float>(1.0 / static_cast<double>(p.hidden));
  args.weight_offset = p.weight != nullptr ? p.weight_offset : 1.0f;  // bwd_terms
  args.eps = p.eps;
  args.norm_round = norm_round;

  constexpr int V = kVecWidth<Tin>;
  const bool vec =
      p.hidden % V == 0 &&
      all_aligned(
          {p.grad_input, p.grad_out, p.input, p.grad_residual, p.weight, p.scale, p.workspace}) &&
      rows_aligned(p.grad_input_stride, sizeof(Tin), p.rows) &&
      rows_aligned(p.grad_out_stride, sizeof(Tout), p.rows) &&
      rows_aligned(p.input_stride, sizeof(Tin), p.rows) &&
      (p.grad_residual == nullptr || rows_aligned(p.grad_residual_stride, sizeof(Tin), p.rows)) &&
      (p.scale == nullptr || rows_aligned(p.scale_stride, sizeof(Tin), part.batch));
  const double dram_per_sm = dram_bytes_per_us_per_sm(sms);
  cudaError_t err = vec ? launch_bwd<Tin, Tw, Tout, V>(args, dram_per_sm, pdl_request, stream)
                        : launch_bwd<Tin, Tw, Tout, 1>(args, dram_per_sm, pdl_request, stream);
  if (err != cudaSuccess || reductions == 0) return err;

  ReduceArgs r{};
  r.ws_weight = args.ws_weight;
  r.ws_scale = args.ws_scale;
  r.ws_shift = args.ws_shift;
  r.grad_weight = p.grad_weight;
  r.grad_scale = p.grad_scale;
  r.grad_shift = p.grad_shift;
  r.grad_scale_stride = p.grad_scale_stride;
  r.grad_shift_stride = p.grad_shift_stride;
  r.hidden = p.hidden;
  r.batch = part.batch;
  r.ctas_per_sample = part.ctas_per_sample;
  r.partials = part.partials;
  r.col_blocks = ceil_div(p.hidden, 32);
  const int64_t jobs = (p.grad_weight != nullptr ? 1 : 0) +
                       (p.grad_scale != nullptr ? part.batch : 0) +
                       (p.grad_shift != nullptr ? part.batch : 0);
  r.blocks = jobs * r.col_blocks;
  r.job_of_block = FastDivU64::make(static_cast<uint64_t>(r.col_blocks));
  return launch(pdl_request, pdl::ByDefault::kPdl, rms_norm_bwd_reduce_kernel<Tin, Tw>, r.blocks,
                LaunchConfig::kReduceThreads, 0, stream, r);
}

// ---- dtype dispatch ----

// Calls f(TypeTag<Tin>, TypeTag<Tw>, TypeTag<Tout>) for the 9 supported combinations: Tin
// fp32/fp16/bf16, Tw and Tout each Tin or fp32; cudaErrorInvalidValue for any other.
template <typename F>
cudaError_t dispatch_types(DType in, DType weight, DType out, F&& f) {
  return dispatch::floats(in, [&](auto tin) {
    return dispatch::same_or_float(weight, in, tin, [&](auto tw) {
      return dispatch::same_or_float(out, in, tin, [&](auto tout) { return f(tin, tw, tout); });
    });
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public launchers (rmsnorm_cuda.h). The dtypes are dispatched before the empty-shape check, so
// an unsupported combination is reported even for an empty tensor.
// ---------------------------------------------------------------------------------------------
cudaError_t rms_norm_fwd(const RmsNormFwdParams& params, cudaStream_t stream) {
  return dispatch_types(params.in_dtype, params.weight_dtype, params.out_dtype,
                        [&](auto tin, auto tw, auto tout) {
                          return run_fwd<typename decltype(tin)::type, typename decltype(tw)::type,
                                         typename decltype(tout)::type>(params, stream);
                        });
}

int64_t rms_norm_bwd_workspace_floats(const RmsNormBwdParams& params) {
  const int reductions = bwd_reductions(params);
  if (params.rows <= 0 || params.hidden <= 0 || reductions == 0) return 0;
  if (params.scale != nullptr && params.rows_per_sample <= 0) return 0;
  int sms = 0;
  // Unknown device: size for a large one. More SMs only mean more partials, so a later launch
  // that sees the real count fits in what this returned.
  if (current_sm_count(&sms) != cudaSuccess) sms = 1024;
  const BwdPartition part = partition_bwd(params.rows, bwd_rows_per_sample(params), sms);
  return reductions * part.partials * params.hidden;
}

cudaError_t rms_norm_bwd(const RmsNormBwdParams& params, cudaStream_t stream) {
  return dispatch_types(params.in_dtype, params.weight_dtype, params.out_dtype,
                        [&](auto tin, auto tw, auto tout) {
                          return run_bwd<typename decltype(tin)::type, typename decltype(tw)::type,
                                         typename decltype(tout)::type>(params, stream);
                        });
}

}  // namespace cuda
}  // namespace rmsnorm
