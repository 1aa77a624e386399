// w4a16_cuda.cu: the CUDA int4 weight-only ops (w4a16_cuda.h).
//
// The GEMM is decode-first: at M <= 16 it streams the packed weight once, and its cost is the
// instructions that turn 4-bit codes into mma operands, so the design keeps them few:
//   - It computes D^T = W^T A^T: a weight tile is the mma's A operand (16 columns per
//     m16n8k16, so 4 mmas per 16 k x 64 n tile where the weight-as-B form needs 8), taken
//     straight from the lane's packed words (w4a16_layout.h), and 8 tokens are the B operand.
//   - A code pair becomes (q - z) in two instructions: one lop3 puts magic + q in both 16-bit
//     halves, one subtraction of magic + z leaves the exact integers. The scale is not applied
//     per weight: each group's float32 sums take it once, when the group ends.
//   - Each warp streams a contiguous run of 16-k steps. At one tile and 8 tokens (plain decode)
//     they go straight into registers, kStreamDepth steps ahead of the mmas, and a group's scales
//     (and zeros) are loaded a group ahead; the other shapes stage them through shared memory.
// A CTA of 4 warps owns one output tile (up to 16 tokens x 64 columns) and a share of K; the
// warps' sums meet in shared memory, and when K is split over CTAs (too few tiles to fill the
// GPU) their partials meet in the workspace, where the last CTA to finish adds them in split
// order. Larger M runs one CTA per 16 tokens per output tile, next to each other in the grid so
// that the weight comes from DRAM about once (each CTA still converts it: a tiling that shares
// converted tiles across token tiles is still to come).
#include "w4a16_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "quant_math.h"
#include "w4a16_layout.h"

namespace quant {
namespace cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileM = 16;  // tokens of a CTA
constexpr int kTileN = static_cast<int>(w4::kTileN);
// A split of K keeps at least this many 16-k steps per warp (fewer and the pipeline's fill and
// the reduction cost more than the streaming they spread).
constexpr int64_t kMinStepsPerWarp = 8;
// Steps in flight per warp in the stream main loop (4 and 8 measured slower: benchmarks/NOTES.md).
constexpr int kStreamDepth = 6;

__device__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

template <typename T>
struct PairMath;

// fp16 1024 + q for q in 0..15 is exact (ulp 1 in [1024, 2048)).
template <>
struct PairMath<__half> {
  using T2 = __half2;
  static constexpr uint32_t kMagic = 0x64006400u;
  static constexpr float kMagicValue = 1024.0f;
  static __device__ T2 splat(float x) { return __float2half2_rn(x); }
  static __device__ __half from_float(float x) { return __float2half_rn(x); }
  static __device__ float to_float(__half x) { return __half2float(x); }
};

// bf16 128 + q for q in 0..15 is exact (ulp 1 in [128, 256)).
template <>
struct PairMath<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  static constexpr uint32_t kMagic = 0x43004300u;
  static constexpr float kMagicValue = 128.0f;
  static __device__ T2 splat(float x) { return __float2bfloat162_rn(x); }
  static __device__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
  static __device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
};

template <typename T2>
__device__ T2 pair_from_bits(uint32_t bits) {
  T2 v;
  memcpy(&v, &bits, sizeof(v));
  return v;
}

template <typename T2>
__device__ uint32_t bits_of(T2 v) {
  uint32_t bits;
  memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// The kernel computes D^T = W^T A^T: the weight tile is the mma's A operand (16 output columns
// per mma, read straight from the packed words: w4a16_layout.h) and the activations are its B
// operand (8 tokens per mma). The A fragment of columns 16 j .. 16 j + 15 is word j of the lane:
// registers a0, a1, a2, a3 are the code pairs at bit shifts 0, 8, 4 and 12.
__device__ constexpr int frag_shift(int r) { return (r & 1) * 8 + (r >> 1) * 4; }

// The packed weight is read once: 16 bytes per lane, not kept in L1. Nothing is read (and out
// is undefined) when `live` is false.
__device__ void load_weight_words(uint32_t (&out)[4], const uint4* src, bool live) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
      " @p ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
      : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
      : "l"(src), "r"(static_cast<int>(live)));
#endif
}

// An activation pair (two consecutive k of one token, 4-byte aligned): every CTA of a split reads
// the same ones, so they stay in L1 / L2. Zero when `live` is false (src is not read then).
__device__ uint32_t load_act_pair(const void* src, bool live) {
  uint32_t out = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p ld.global.nc.u32 %0, [%1];\n}\n"
               : "+r"(out)
               : "l"(src), "r"(static_cast<int>(live)));
#endif
  return out;
}

// A 2-byte scale or zero, as raw bits.
__device__ uint16_t load_half_bits(const void* src) {
  uint16_t out = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ld.global.nc.u16 %0, [%1];\n" : "=h"(out) : "l"(src));
#endif
  return out;
}

// The cp.async helpers (sm_80 and newer, as the int4 ops require; empty below, where no op runs
// them). Copies 16 bytes, or writes 16 zero bytes when `valid` is false (src is not read then).
__device__ void cp_async_16(uint32_t dst, const void* global, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global),
               "r"(valid ? 16 : 0));
#endif
}

// Copies 4 bytes, or writes 4 zero bytes when `valid` is false (src is not read then).
__device__ void cp_async_4(uint32_t dst, const void* global, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(global),
               "r"(valid ? 4 : 0));
#endif
}

__device__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int kPending>
__device__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

// (x & 0x000F000F) | kMagic in one lop3: the low nibbles of both halves as magic + q.
template <uint32_t kMagic>
__device__ uint32_t nibble_pair(uint32_t x) {
  uint32_t out;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(out) : "r"(x), "r"(0x000F000Fu), "r"(kMagic));
  return out;
}

template <typename T>
__device__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

template <>
__device__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// The shapes of one kernel instance: kTiles weight tiles per output tile (gated: 2) and kTokens8
// groups of 8 tokens (1: M <= 8, 2: up to 16 per CTA). Each warp streams a contiguous run of
// 16-k steps through one of two main loops:
//   - stream (one tile, 8 tokens: plain decode): straight into registers, kStreamDepth steps ahead;
//     the registers allow it with 4 CTAs per SM;
//   - ring (the others, whose accumulators leave too few registers): through a ring of kStages
//     cp.async stages per warp in shared memory.
template <int kTiles_, int kTokens8_>
struct Shape {
  static constexpr int kTiles = kTiles_;
  static constexpr int kTokens8 = kTokens8_;
  static constexpr int kTokens = 8 * kTokens8;
  static constexpr bool kStream = kTiles == 1 && kTokens8 == 1;
  // CTAs per SM: the kernel's register budget (__launch_bounds__), and the wave the host's
  // split of K fills. The gated instances' accumulators (two tiles) need more registers than
  // 4 CTAs an SM leave: 3 at 8 tokens, 2 at 16.
  static constexpr int kMinCtas = kTiles == 1 ? 4 : kTokens8 == 1 ? 3 : 2;
  static constexpr int kStages = 8 / (kTiles * kTokens8) >= 4 ? 8 / (kTiles * kTokens8) : 4;
  // One ring stage of a warp: each lane's 16 bytes of each weight tile, then its two 32-bit
  // activation pairs per group of 8 tokens.
  static constexpr int kStageBytes = 32 * (16 * kTiles + 8 * kTokens8);
  static constexpr int kRingBytes = kStream ? 0 : kWarps * kStages * kStageBytes;
  // The warps' partial tiles, float [warp][tile][token][column], reuse the ring.
  static constexpr int kReduceBytes = kWarps * kTiles * kTokens * kTileN * 4;
  static constexpr int kSharedBytes = kRingBytes > kReduceBytes ? kRingBytes : kReduceBytes;
};

// What a warp streams: steps [begin, end) of 16 k, from the lane's first weight words and
// activation pairs (the B fragment: k = 2 c, 2 c + 1 and 2 c + 8, 2 c + 9 of a step, token g of
// each group of 8) on.
template <typename T, int kTokens8>
struct WarpRun {
  int begin, end;
  int lane, g;
  int64_t first_tile;   // weight tile of t = 0
  int64_t weight_step;  // uint4 per packed row of 16 k
  const uint4* weight_src;
  const T* act_src[kTokens8];
  bool act_valid[kTokens8];
};

// The per-group factors of the lane's 8 output columns per tile (16 j + g + 8 h for
// f = 2 j + h): the scale, and the code offset magic + z. `fetch` loads a group's raw bits
// (clamped to the warp's last group), `take` turns them into the factors, so the stream loop
// can fetch a group ahead of its use.
template <typename T, bool kZeros, int kTiles>
struct GroupFactors {
  using M = PairMath<T>;
  using T2 = typename M::T2;
  float scale[kTiles][8];
  T2 offset[kTiles][8];
  uint16_t scale_bits[kTiles][8], zero_bits[kTiles][8];

  __device__ void fetch(const W4A16GemmParams& p, int64_t first_tile, int g, int group,
                        int last_group) {
    const int64_t at0 =
        static_cast<int64_t>(min(group, last_group)) * p.n + first_tile * kTileN + g;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int f = 0; f < 8; ++f) {
        const int64_t at = at0 + t * kTileN + 8 * f;
        scale_bits[t][f] = load_half_bits(static_cast<const T*>(p.scales) + at);
        if constexpr (kZeros) zero_bits[t][f] = load_half_bits(static_cast<const T*>(p.zeros) + at);
      }
    }
  }

  __device__ void take() {
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int f = 0; f < 8; ++f) {
        T s;
        memcpy(&s, &scale_bits[t][f], sizeof(s));
        scale[t][f] = M::to_float(s);
        float z = static_cast<float>(w4::kZeroPoint);
        if constexpr (kZeros) {
          T zt;
          memcpy(&zt, &zero_bits[t][f], sizeof(zt));
          z = M::to_float(zt);
        }
        offset[t][f] = M::splat(M::kMagicValue + z);
      }
    }
  }
};

// One step's mmas into the group sums: the weight words of each tile (the A fragments of its
// four 16-column blocks) against the activation pairs of each group of 8 tokens.
template <typename T, bool kZeros, int kTiles, int kTokens8>
__device__ void mma_step(float (&group_acc)[kTiles][kTokens8][4][4],
                         const uint32_t (&words)[kTiles][4], const uint32_t (&act)[kTokens8][2],
                         const GroupFactors<T, kZeros, kTiles>& factors) {
  using M = PairMath<T>;
  using T2 = typename M::T2;
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t frag[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        // magic + q in both halves (exact), minus magic + z: the exact integers q - z.
        const uint32_t biased = nibble_pair<M::kMagic>(words[t][j] >> frag_shift(r));
        frag[r] = bits_of(__hsub2(pair_from_bits<T2>(biased), factors.offset[t][2 * j + (r & 1)]));
      }
#pragma unroll
      for (int u = 0; u < kTokens8; ++u)
        mma_16816<T>(group_acc[t][u][j], frag, act[u][0], act[u][1]);
    }
  }
}

// The group's sums take its scales (one float32 rounding each) and start again from zero.
template <int kTiles, int kTokens8>
__device__ void end_group(float (&acc)[kTiles][kTokens8][4][4],
                          float (&group_acc)[kTiles][kTokens8][4][4],
                          const float (&scale)[kTiles][8]) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int u = 0; u < kTokens8; ++u)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          acc[t][u][j][r] = fmaf(scale[t][2 * j + r / 2], group_acc[t][u][j][r], acc[t][u][j][r]);
          group_acc[t][u][j][r] = 0.0f;
        }
}

// The stream main loop: kStreamDepth register slots, each refilled right after its step's mmas, so
// kStreamDepth steps of loads are in flight; the next group's factors are fetched when a group
// starts. Steps are predicated only in the last kStreamDepth.
template <typename T, bool kZeros, typename S>
__device__ void stream_mainloop(const W4A16GemmParams& p, WarpRun<T, S::kTokens8>& run,
                                float (&acc)[S::kTiles][S::kTokens8][4][4]) {
  constexpr int kTiles = S::kTiles, kTokens8 = S::kTokens8, kDepth = kStreamDepth;
  const int begin = run.begin, end = run.end;
  if (begin >= end) return;
  uint32_t words[kDepth][kTiles][4];
  uint32_t act[kDepth][kTokens8][2];
  // Loads the next step (steps advance by one per call) into slot i; nothing is read unless
  // `live` (the step is before `end`). Slots never loaded are never read, and the activation
  // pairs of tokens past M are garbage that only their own (never written) outputs see.
  auto load_step = [&](int i, bool live) {
#pragma unroll
    for (int t = 0; t < kTiles; ++t) load_weight_words(words[i][t], run.weight_src + t * 32, live);
#pragma unroll
    for (int u = 0; u < kTokens8; ++u) {
      act[i][u][0] = load_act_pair(run.act_src[u], live && run.act_valid[u]);
      act[i][u][1] = load_act_pair(run.act_src[u] + 8, live && run.act_valid[u]);
      run.act_src[u] += w4::kTileK;
    }
    run.weight_src += run.weight_step;
  };

  const int steps_per_group = static_cast<int>(p.group_size / w4::kTileK);
  const int last_group = (end - 1) / steps_per_group;
  GroupFactors<T, kZeros, kTiles> factors;
  float group_acc[kTiles][kTokens8][4][4] = {};
  int group = begin / steps_per_group;
  int left = min(end, (group + 1) * steps_per_group) - begin;  // steps left in the group
  auto compute_step = [&](int i, int next_step) {
    mma_step<T, kZeros, kTiles, kTokens8>(group_acc, words[i], act[i], factors);
    if (--left == 0) {
      end_group(acc, group_acc, factors.scale);
      ++group;
      left = min(steps_per_group, end - next_step);
      factors.take();
      factors.fetch(p, run.first_tile, run.g, group + 1, last_group);
    }
  };

#pragma unroll
  for (int i = 0; i < kDepth; ++i) load_step(i, begin + i < end);
  factors.fetch(p, run.first_tile, run.g, group, last_group);
  factors.take();
  factors.fetch(p, run.first_tile, run.g, group + 1, last_group);
  int step = begin;
  for (; step + 2 * kDepth <= end; step += kDepth) {
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
      compute_step(i, step + i + 1);
      load_step(i, true);  // step + i + kDepth, into the slot just used
    }
  }
  for (; step < end; step += kDepth) {
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
      if (step + i < end) compute_step(i, step + i + 1);
      load_step(i, step + i + kDepth < end);
    }
  }
}

// The ring main loop: the warp's kStages stages of cp.async copies in shared memory (its slice
// of `smem`), one step per stage; a group's factors are loaded when the group starts.
template <typename T, bool kZeros, typename S>
__device__ void ring_mainloop(const W4A16GemmParams& p, WarpRun<T, S::kTokens8>& run,
                              float (&acc)[S::kTiles][S::kTokens8][4][4], unsigned char* smem,
                              int warp) {
  constexpr int kTiles = S::kTiles, kTokens8 = S::kTokens8, kStages = S::kStages;
  const int begin = run.begin, end = run.end, lane = run.lane;
  // The ring, as 32-bit shared addresses of the lane's bytes: copies go to `write`, the step
  // being computed is read at `read`.
  const uint32_t ring_begin = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) +
                              warp * kStages * S::kStageBytes + lane * 16;
  const uint32_t ring_end = ring_begin + kStages * S::kStageBytes;
  // From the lane's weight bytes of a stage to its activation bytes.
  const uint32_t act_offset = 32 * 16 * kTiles + lane * 8 - lane * 16;
  uint32_t write = ring_begin, read = ring_begin;
  auto advance = [&](uint32_t& at) {
    at += S::kStageBytes;
    if (at == ring_end) at = ring_begin;
  };

  // Queue the next step at `write`; one commit group per call, zero-filled without reading once
  // `issued` passes the end.
  int issued = begin;
  auto issue = [&]() {
    const bool live = issued < end;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) cp_async_16(write + t * 512, run.weight_src + t * 32, live);
#pragma unroll
    for (int u = 0; u < kTokens8; ++u) {
      const uint32_t dst = write + act_offset + u * 256;
      cp_async_4(dst, run.act_src[u], run.act_valid[u] && live);
      cp_async_4(dst + 4, run.act_src[u] + 8, run.act_valid[u] && live);
      if (live && run.act_valid[u]) run.act_src[u] += w4::kTileK;
    }
    if (live) run.weight_src += run.weight_step;
    ++issued;
    advance(write);
    cp_async_commit();
  };

  const int steps_per_group = static_cast<int>(p.group_size / w4::kTileK);
  GroupFactors<T, kZeros, kTiles> factors;
  float group_acc[kTiles][kTokens8][4][4] = {};  // end_group zeroes it again

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue();
  for (int step = begin; step < end;) {
    const int group = step / steps_per_group;
    const int group_end = min(end, (group + 1) * steps_per_group);
    factors.fetch(p, run.first_tile, run.g, group, group);
    factors.take();
    for (; step < group_end; ++step) {
      cp_async_wait<kStages - 2>();  // this step's copies have landed
      issue();                       // into the slot the previous step freed
      uint32_t act[kTokens8][2];
      uint32_t words[kTiles][4];
#pragma unroll
      for (int u = 0; u < kTokens8; ++u) {
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n"
                     : "=r"(act[u][0]), "=r"(act[u][1])
                     : "r"(read + act_offset + u * 256));
      }
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(words[t][0]), "=r"(words[t][1]), "=r"(words[t][2]), "=r"(words[t][3])
                     : "r"(read + t * 512));
      }
      advance(read);
      mma_step<T, kZeros, kTiles, kTokens8>(group_acc, words, act, factors);
    }
    end_group(acc, group_acc, factors.scale);
  }
  cp_async_wait<0>();
}

// blockIdx.x: the 16-token tile (fastest, so that the CTAs of one weight tile run together and
// all but the first read it from L2); blockIdx.y: the output tile of 64 columns, which reads
// kTiles weight tiles (gated: the gate tile 2 y and the up tile 2 y + 1); blockIdx.z: the split
// of K. A step's products go to float32 group sums, which take the group's scales when the
// group ends (every product (q - z) a is exact and the scale is applied once, in float32).
template <typename T, bool kZeros, typename S>
__global__ void __launch_bounds__(kThreads, S::kMinCtas)
    w4a16_gemm_kernel(const W4A16GemmParams p, int splits, float* partials, int* counters) {
  using M = PairMath<T>;
  constexpr int kTiles = S::kTiles, kTokens8 = S::kTokens8;
  __shared__ __align__(16) unsigned char smem[S::kSharedBytes];

  const int mt = blockIdx.x, ot = blockIdx.y, split = blockIdx.z;
  const int out_tiles = gridDim.y;
  const int64_t n_tiles = p.n / kTileN;  // of the weight
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;

  // This CTA's 16-k steps, then this warp's contiguous run of them (K / 16 fits an int: the
  // packed weight's rows are indexed by it). Step s of the weight is row s of tiles: n_tiles
  // tiles of 32 uint4, one per lane.
  WarpRun<T, kTokens8> run;
  const int steps = static_cast<int>(p.k / w4::kTileK);
  const int per_split = (steps + splits - 1) / splits;
  const int split_begin = min(steps, split * per_split);
  const int split_end = min(steps, split_begin + per_split);
  const int per_warp = (split_end - split_begin + kWarps - 1) / kWarps;
  run.begin = min(split_end, split_begin + warp * per_warp);
  run.end = min(split_end, run.begin + per_warp);
  run.lane = lane;
  run.g = g;
  const int64_t m0 = static_cast<int64_t>(mt) * kTileM;
  run.first_tile = static_cast<int64_t>(ot) * kTiles;
  run.weight_step = n_tiles * 32;
  run.weight_src = reinterpret_cast<const uint4*>(p.b) +
                   (static_cast<int64_t>(run.begin) * n_tiles + run.first_tile) * 32 + lane;
#pragma unroll
  for (int u = 0; u < kTokens8; ++u) {
    const int64_t m = m0 + 8 * u + g;
    run.act_valid[u] = m < p.m;
    run.act_src[u] =
        static_cast<const T*>(p.a) +
        (run.act_valid[u] ? m * p.lda + static_cast<int64_t>(run.begin) * w4::kTileK + 2 * c : 0);
  }

  float acc[kTiles][kTokens8][4][4] = {};
  if constexpr (S::kStream) {
    stream_mainloop<T, kZeros, S>(p, run, acc);
  } else {
    ring_mainloop<T, kZeros, S>(p, run, acc, smem, warp);
    __syncthreads();  // every warp is done with its ring: the reduction reuses it
  }

  // The warps' partial tiles meet in shared memory. C fragment of mma j, token group u: rows
  // (columns of the tile) 16 j + g + 8 h for r = 2 h, 2 h + 1, tokens 8 u + 2 c + (r & 1).
  constexpr int kTokens = S::kTokens;
  auto* reduce = reinterpret_cast<float*>(smem);  // [warp][t][token][column]
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int u = 0; u < kTokens8; ++u)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int token = 8 * u + 2 * c + (r & 1), col = 16 * j + g + 8 * (r / 2);
          reduce[((warp * kTiles + t) * kTokens + token) * kTileN + col] = acc[t][u][j][r];
        }
  __syncthreads();
  // Each thread then owns elements e = threadIdx.x + i * kThreads of the [token][column] tile.
  constexpr int kPerThread = kTokens * kTileN / kThreads;
  const int64_t valid = min64(kTokens, p.m - m0);  // tokens of this tile
  float sum[kTiles][kPerThread];
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = threadIdx.x + i * kThreads;
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += reduce[(w * kTiles + t) * kTokens * kTileN + e];
      sum[t][i] = s;
    }

  if (splits > 1) {
    // Partials of split s: [s][m tile][output tile][t][token][column], valid tokens only.
    const int m_tiles = gridDim.x;
    const int64_t tile = static_cast<int64_t>(mt) * out_tiles + ot;
    constexpr int kTileFloats = kTiles * kTokens * kTileN;
    const int64_t split_stride = static_cast<int64_t>(m_tiles) * out_tiles * kTileFloats;
    float* mine = partials + split * split_stride + tile * kTileFloats;
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        const int e = threadIdx.x + i * kThreads;
        if (e / kTileN < valid) mine[t * kTokens * kTileN + e] = sum[t][i];
      }
    __threadfence();
    __syncthreads();
    __shared__ int is_last;
    if (threadIdx.x == 0) is_last = atomicAdd(counters + tile, 1) == splits - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        const int e = threadIdx.x + i * kThreads;
        if (e / kTileN >= valid) continue;
        const int64_t at = tile * kTileFloats + t * kTokens * kTileN + e;
        float total = 0.0f;
        for (int s = 0; s < splits; ++s) {
          total += s == split ? sum[t][i] : __ldcg(partials + s * split_stride + at);
        }
        sum[t][i] = total;
      }
  }

  const T* bias = static_cast<const T*>(p.bias);
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int e = threadIdx.x + i * kThreads;
    const int64_t m = m0 + e / kTileN, col = e % kTileN;
    if (e / kTileN >= valid) continue;
    float v[kTiles];
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const int64_t n = (run.first_tile + t) * kTileN + col;  // the weight's column
      v[t] = sum[t][i] + (bias != nullptr ? M::to_float(bias[n]) : 0.0f);
    }
    float out = math::activate(p.activation, v[0]);
    if constexpr (kTiles == 2) out *= v[1];
    static_cast<T*>(p.d)[m * p.ldd + static_cast<int64_t>(ot) * kTileN + col] = M::from_float(out);
  }
}

// One thread per packed word: its 8 codes, from or to codes[k, n].
template <bool kUnpack>
__global__ void w4_pack_kernel(const W4PackParams p) {
  const int64_t row_words = w4::packed_row_words(p.n);
  const int64_t word = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (word >= p.k / w4::kTileK * row_words) return;
  const int64_t kt = word / row_words, in_row = word % row_words;
  const int64_t nt = in_row / w4::kTileWords;
  const int in_tile = static_cast<int>(in_row % w4::kTileWords);
  const int lane = in_tile / static_cast<int>(w4::kWordsPerLane);
  const int j = in_tile % static_cast<int>(w4::kWordsPerLane);
  auto* words = reinterpret_cast<uint32_t*>(p.packed);
  uint32_t bits = kUnpack ? words[word] : 0u;
  for (int nibble = 0; nibble < w4::kNibblesPerWord; ++nibble) {
    const w4::TileElement e = w4::tile_element(lane, j, nibble);
    uint8_t* code = p.codes + (kt * w4::kTileK + e.k) * p.ld + nt * w4::kTileN + e.n;
    if (kUnpack) {
      *code = static_cast<uint8_t>((bits >> (4 * nibble)) & 0xFu);
    } else {
      bits |= (static_cast<uint32_t>(*code) & 0xFu) << (4 * nibble);
    }
  }
  if (!kUnpack) words[word] = bits;
}

template <bool kUnpack>
cudaError_t launch_pack(const W4PackParams& p, cudaStream_t stream) {
  const int64_t words = p.k / w4::kTileK * w4::packed_row_words(p.n);
  if (words == 0) return cudaSuccess;
  constexpr int kPackThreads = 256;
  const auto blocks = static_cast<unsigned>((words + kPackThreads - 1) / kPackThreads);
  w4_pack_kernel<kUnpack><<<blocks, kPackThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

// Output tiles of up to 16 tokens x 64 columns: one CTA each per split.
int64_t output_tiles(const W4A16GemmParams& p) {
  return (p.m + kTileM - 1) / kTileM * (p.n / kTileN / (p.gated ? 2 : 1));
}

// Tokens per CTA: 8 when M <= 8 (one mma per 16 columns), else 16.
int tile_tokens(const W4A16GemmParams& p) { return p.m <= 8 ? 8 : 16; }

// The CTAs per SM of the instance that runs p (its register budget: Shape::kMinCtas). The split
// of K aims at one full wave of them: enough bytes in flight to cover DRAM latency, no second
// wave (the gated form at 4 CTAs per SM split gate_up 4096 -> 28672 at M = 1 in two and ran
// 1.13 waves: 26.2 us, against 22.9 in one split).
int ctas_per_sm(const W4A16GemmParams& p) {
  const bool wide = tile_tokens(p) == 16;
  if (p.gated) return wide ? Shape<2, 2>::kMinCtas : Shape<2, 1>::kMinCtas;
  return wide ? Shape<1, 2>::kMinCtas : Shape<1, 1>::kMinCtas;
}

// The workspace: one counter per output tile, then (from the next 16 bytes) the partials, one
// tokens x 64 float tile per weight tile, split and tile of tokens.
size_t counter_bytes(int64_t tiles) {
  return (static_cast<size_t>(tiles) * sizeof(int) + 15) / 16 * 16;
}

template <typename T, bool kZeros, typename S>
void launch_shape(const W4A16GemmParams& p, dim3 grid, int splits, float* partials, int* counters,
                  cudaStream_t stream) {
  w4a16_gemm_kernel<T, kZeros, S><<<grid, kThreads, 0, stream>>>(p, splits, partials, counters);
}

template <typename T, bool kZeros>
void launch_zeros(const W4A16GemmParams& p, dim3 grid, int splits, float* partials, int* counters,
                  cudaStream_t stream) {
  const bool wide = tile_tokens(p) == 16;
  if (p.gated) {
    wide ? launch_shape<T, kZeros, Shape<2, 2>>(p, grid, splits, partials, counters, stream)
         : launch_shape<T, kZeros, Shape<2, 1>>(p, grid, splits, partials, counters, stream);
  } else {
    wide ? launch_shape<T, kZeros, Shape<1, 2>>(p, grid, splits, partials, counters, stream)
         : launch_shape<T, kZeros, Shape<1, 1>>(p, grid, splits, partials, counters, stream);
  }
}

template <typename T>
cudaError_t launch_gemm(const W4A16GemmParams& p, dim3 grid, int splits, float* partials,
                        int* counters, cudaStream_t stream) {
  if (p.zeros != nullptr) {
    launch_zeros<T, true>(p, grid, splits, partials, counters, stream);
  } else {
    launch_zeros<T, false>(p, grid, splits, partials, counters, stream);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t w4_pack(const W4PackParams& p, cudaStream_t stream) {
  return launch_pack<false>(p, stream);
}

cudaError_t w4_unpack(const W4PackParams& p, cudaStream_t stream) {
  return launch_pack<true>(p, stream);
}

W4A16Plan w4a16_plan(const W4A16GemmParams& p, int sm_count) {
  const int64_t tiles = output_tiles(p), steps = p.k / w4::kTileK;
  // Split K until the grid fills the SMs once, while each warp keeps kMinStepsPerWarp.
  const int64_t by_grid = ctas_per_sm(p) * static_cast<int64_t>(sm_count) / (tiles > 0 ? tiles : 1);
  const int64_t by_steps = steps / (kWarps * kMinStepsPerWarp);
  const int64_t splits = by_grid < by_steps ? by_grid : by_steps;
  W4A16Plan plan{splits > 1 ? static_cast<int>(splits) : 1, 0};
  if (plan.splits > 1) {
    const int64_t weight_tiles = (p.m + kTileM - 1) / kTileM * (p.n / kTileN);
    plan.workspace_bytes = counter_bytes(tiles) + static_cast<size_t>(plan.splits) * weight_tiles *
                                                      tile_tokens(p) * kTileN * sizeof(float);
  }
  return plan;
}

cudaError_t w4a16_gemm(const W4A16GemmParams& p, const W4A16Plan& plan, void* workspace,
                       cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  // The activations go through 4-byte copies of k pairs; torch-ext/ gathers act-order columns
  // (perm) into a contiguous A first. Without K nothing is read: the output is the bias.
  const bool paired =
      p.k == 0 || (reinterpret_cast<uintptr_t>(p.a) % 4 == 0 && (p.m <= 1 || p.lda % 2 == 0));
  if (p.perm != nullptr || !paired) return cudaErrorInvalidValue;
  const int64_t tiles = output_tiles(p);
  int* counters = nullptr;
  float* partials = nullptr;
  if (plan.splits > 1) {
    counters = static_cast<int*>(workspace);
    partials = reinterpret_cast<float*>(static_cast<char*>(workspace) + counter_bytes(tiles));
    const cudaError_t err = cudaMemsetAsync(counters, 0, tiles * sizeof(int), stream);
    if (err != cudaSuccess) return err;
  }
  const int64_t out_tiles = p.n / kTileN / (p.gated ? 2 : 1);
  const dim3 grid(static_cast<unsigned>(tiles / out_tiles), static_cast<unsigned>(out_tiles),
                  static_cast<unsigned>(plan.splits));
  return p.dtype == DType::kBFloat16
             ? launch_gemm<__nv_bfloat16>(p, grid, plan.splits, partials, counters, stream)
             : launch_gemm<__half>(p, grid, plan.splits, partials, counters, stream);
}

}  // namespace cuda
}  // namespace quant
