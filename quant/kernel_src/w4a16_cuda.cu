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
//   - Each warp streams a contiguous run of 16-k steps through a ring of cp.async stages in
//     shared memory (weights and the activation pairs of the step), kStages steps in flight.
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
// The grid aims at this many CTAs per SM, enough bytes in flight to cover DRAM latency.
constexpr int kCtasPerSm = 4;

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

// The shapes of one kernel instance: kTiles weight tiles per output tile (gated: 2), kTokens8
// groups of 8 tokens (1: M <= 8, 2: up to 16 per CTA), and kStages steps in flight per warp.
template <int kTiles_, int kTokens8_>
struct Shape {
  static constexpr int kTiles = kTiles_;
  static constexpr int kTokens8 = kTokens8_;
  static constexpr int kTokens = 8 * kTokens8;
  static constexpr int kStages = 8 / (kTiles * kTokens8) >= 4 ? 8 / (kTiles * kTokens8) : 4;
  // One stage of a warp: each lane's 16 bytes of each weight tile, then its two 32-bit
  // activation pairs per group of 8 tokens.
  static constexpr int kStageBytes = 32 * (16 * kTiles + 8 * kTokens8);
  static constexpr int kRingBytes = kWarps * kStages * kStageBytes;
  // The warps' partial tiles, float [warp][tile][token][column], reuse the ring.
  static constexpr int kReduceBytes = kWarps * kTiles * kTokens * kTileN * 4;
  static constexpr int kSharedBytes = kRingBytes > kReduceBytes ? kRingBytes : kReduceBytes;
};

// blockIdx.x: the 16-token tile (fastest, so that the CTAs of one weight tile run together and
// all but the first read it from L2); blockIdx.y: the output tile of 64 columns, which reads
// kTiles weight tiles (gated: the gate tile 2 y and the up tile 2 y + 1); blockIdx.z: the split
// of K. Each warp streams a contiguous run of 16-k steps through its ring of kStages cp.async
// stages; a step's products go to float32 group sums, which take the group's scales when the
// group ends (every product (q - z) a is exact and the scale is applied once, in float32).
template <typename T, bool kZeros, typename S>
__global__ void __launch_bounds__(kThreads)
    w4a16_gemm_kernel(const W4A16GemmParams p, int splits, float* partials, int* counters) {
  using M = PairMath<T>;
  using T2 = typename M::T2;
  constexpr int kTiles = S::kTiles, kTokens8 = S::kTokens8, kStages = S::kStages;
  __shared__ __align__(16) unsigned char smem[S::kSharedBytes];

  const int mt = blockIdx.x, ot = blockIdx.y, split = blockIdx.z;
  const int out_tiles = gridDim.y;
  const int64_t n_tiles = p.n / kTileN;  // of the weight
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;

  // This CTA's 16-k steps, then this warp's contiguous run of them (K / 16 fits an int: the
  // packed weight's rows are indexed by it).
  const int steps = static_cast<int>(p.k / w4::kTileK);
  const int per_split = (steps + splits - 1) / splits;
  const int split_begin = min(steps, split * per_split);
  const int split_end = min(steps, split_begin + per_split);
  const int per_warp = (split_end - split_begin + kWarps - 1) / kWarps;
  const int begin = min(split_end, split_begin + warp * per_warp);
  const int end = min(split_end, begin + per_warp);

  const T* scales = static_cast<const T*>(p.scales);
  const T* zeros = static_cast<const T*>(p.zeros);
  const int64_t m0 = static_cast<int64_t>(mt) * kTileM;
  const int64_t first_tile = static_cast<int64_t>(ot) * kTiles;  // weight tile of t = 0

  // Where the lane's copies come from (advanced one step at a time) and go to. Step s of the
  // weight is row s of tiles: n_tiles tiles of 32 uint4, one per lane.
  const int64_t weight_step = n_tiles * 32;  // uint4 per packed row
  const uint4* weight_src = reinterpret_cast<const uint4*>(p.b) +
                            (static_cast<int64_t>(begin) * n_tiles + first_tile) * 32 + lane;
  const T* act_src[kTokens8];
  bool act_valid[kTokens8];
#pragma unroll
  for (int u = 0; u < kTokens8; ++u) {
    const int64_t m = m0 + 8 * u + g;
    act_valid[u] = m < p.m;
    act_src[u] = static_cast<const T*>(p.a) +
                 (act_valid[u] ? m * p.lda + static_cast<int64_t>(begin) * w4::kTileK + 2 * c : 0);
  }
  // This warp's ring of kStages stages in shared memory, as 32-bit shared addresses of the
  // lane's bytes: copies go to `write`, the step being computed is read at `read`.
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

  // Queue the next step (rows advance by one per call) at `write`; one commit group per call,
  // zero-filled without reading once `issued` passes the end.
  int issued = begin;
  auto issue = [&]() {
    const bool live = issued < end;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) cp_async_16(write + t * 512, weight_src + t * 32, live);
#pragma unroll
    for (int u = 0; u < kTokens8; ++u) {
      const uint32_t dst = write + act_offset + u * 256;
      cp_async_4(dst, act_src[u], act_valid[u] && live);
      cp_async_4(dst + 4, act_src[u] + 8, act_valid[u] && live);
      if (live && act_valid[u]) act_src[u] += w4::kTileK;
    }
    if (live) weight_src += weight_step;
    ++issued;
    advance(write);
    cp_async_commit();
  };

  // The per-group factors of the lane's 8 output columns per tile (16 j + g + 8 h for f = 2 j + h):
  // the scale, and the code offset magic + z.
  const int steps_per_group = static_cast<int>(p.group_size / w4::kTileK);
  float scale[kTiles][8];
  T2 offset[kTiles][8];
  auto load_group = [&](int group) {
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int f = 0; f < 8; ++f) {
        const int64_t at = group * p.n + (first_tile + t) * kTileN + 8 * f + g;
        scale[t][f] = M::to_float(scales[at]);
        const float z = kZeros ? M::to_float(zeros[at]) : static_cast<float>(w4::kZeroPoint);
        offset[t][f] = M::splat(M::kMagicValue + z);
      }
    }
  };

  // acc: the running sums; group_acc: this group's, before its scale.
  float acc[kTiles][kTokens8][4][4] = {};
  float group_acc[kTiles][kTokens8][4][4];

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue();
  for (int step = begin; step < end;) {
    const int group = step / steps_per_group;
    const int group_end = min(end, (group + 1) * steps_per_group);
    load_group(group);
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
      for (int u = 0; u < kTokens8; ++u)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) group_acc[t][u][j][r] = 0.0f;
    for (; step < group_end; ++step) {
      cp_async_wait<kStages - 2>();  // this step's copies have landed
      issue();                       // into the slot the previous step freed
      uint2 act[kTokens8];
      uint4 q[kTiles];
#pragma unroll
      for (int u = 0; u < kTokens8; ++u) {
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n"
                     : "=r"(act[u].x), "=r"(act[u].y)
                     : "r"(read + act_offset + u * 256));
      }
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(q[t].x), "=r"(q[t].y), "=r"(q[t].z), "=r"(q[t].w)
                     : "r"(read + t * 512));
      }
      advance(read);
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        const uint32_t words[4] = {q[t].x, q[t].y, q[t].z, q[t].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t frag[4];
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            // magic + q in both halves (exact), minus magic + z: the exact integers q - z.
            const uint32_t biased = nibble_pair<M::kMagic>(words[j] >> frag_shift(r));
            frag[r] = bits_of(__hsub2(pair_from_bits<T2>(biased), offset[t][2 * j + (r & 1)]));
          }
#pragma unroll
          for (int u = 0; u < kTokens8; ++u) {
            mma_16816<T>(group_acc[t][u][j], frag, act[u].x, act[u].y);
          }
        }
      }
    }
    // The group's sums take its scales (one float32 rounding each).
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
      for (int u = 0; u < kTokens8; ++u)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            acc[t][u][j][r] = fmaf(scale[t][2 * j + r / 2], group_acc[t][u][j][r], acc[t][u][j][r]);
          }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with its ring: the reduction reuses it

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
      const int64_t n = (first_tile + t) * kTileN + col;  // the weight's column
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
  // Split K until the grid has kCtasPerSm CTAs per SM, while each warp keeps kMinStepsPerWarp.
  const int64_t by_grid = kCtasPerSm * static_cast<int64_t>(sm_count) / (tiles > 0 ? tiles : 1);
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
