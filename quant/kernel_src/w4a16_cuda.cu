// w4a16_cuda.cu: the CUDA int4 weight-only ops (w4a16_cuda.h).
//
// The GEMM is decode-first: at M <= 16 it streams the packed weight once. A CTA of 8 warps owns a
// 16 x 64 output tile (one m16 row block, 8 n8 blocks) and a share of K; each warp takes a
// contiguous run of 16-k steps. Per step a lane loads its 16 bytes of the tile (w4a16_layout.h:
// its B fragments for the 8 blocks), turns each pair of codes into (q - z) * s with an OR into
// the exponent, one exact subtraction and one multiply (the formula's single rounding), and
// issues 8 mma.sync m16n8k16 with float32 accumulators. The warps' partial tiles meet in shared
// memory; when K is split over several CTAs (too few tiles to fill the GPU), their partials meet
// in the workspace and the last CTA to finish adds them in split order. Larger M runs one CTA
// per 16 rows and output tile; the row tiles of an output tile are launched next to each other,
// so the weight comes from DRAM about once and from L2 for the rest (each CTA still dequantizes
// it: a tiling that shares one dequantized tile across row tiles is still to come).
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

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileM = 16;
constexpr int kTileN = static_cast<int>(w4::kTileN);
constexpr int kTileElems = kTileM * kTileN;
constexpr int kBlocksN = kTileN / 8;  // n8 blocks of a tile
// A split of K keeps at least this many 16-k steps per warp (fewer and the reduction costs more
// than the streaming it spreads).
constexpr int64_t kMinStepsPerWarp = 4;
// Row stride of the shared reduction buffer: 64 + 8 floats keeps a warp's float2 stores off
// shared bank conflicts beyond two-way.
constexpr int kRedStride = kTileN + 8;

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

// The two codes in bits `shift` and 16 + `shift` of `word`, as (q - z) * s in both halves.
template <typename T>
__device__ uint32_t dequant_pair(uint32_t word, int shift, typename PairMath<T>::T2 offset,
                                 typename PairMath<T>::T2 scale) {
  using M = PairMath<T>;
  const uint32_t biased = ((word >> shift) & 0x000F000Fu) | M::kMagic;  // magic + q, exact
  const auto q_minus_z = __hsub2(pair_from_bits<typename M::T2>(biased), offset);  // exact
  return bits_of(__hmul2(q_minus_z, scale));
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

// A[m, k] and A[m, k + 1] (through perm when given) in the low and high halves; 0 past M. k is
// even: without perm, and with A's rows on 4-byte boundaries (`paired`), one 32-bit load.
template <typename T>
__device__ uint32_t load_a_pair(const W4A16GemmParams& p, bool paired, int64_t m, int64_t k) {
  if (m >= p.m) return 0;
  const T* row = static_cast<const T*>(p.a) + m * p.lda;
  if (paired) return __ldg(reinterpret_cast<const uint32_t*>(row + k));
  const int64_t k0 = p.perm != nullptr ? __ldg(p.perm + k) : k;
  const int64_t k1 = p.perm != nullptr ? __ldg(p.perm + k + 1) : k + 1;
  uint16_t lo, hi;
  const T x0 = row[k0], x1 = row[k1];
  memcpy(&lo, &x0, 2);
  memcpy(&hi, &x1, 2);
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// blockIdx.x: the row tile (16 rows), fastest, so that the CTAs of one weight tile run together
// and all but the first read it from L2; blockIdx.y: the output tile of 64 columns, which reads
// kTiles weight tiles (1; gated: the gate tile 2 y and the up tile 2 y + 1 of the weight).
template <typename T, bool kZeros, int kTiles>
__global__ void __launch_bounds__(kThreads)
    w4a16_gemm_kernel(const W4A16GemmParams p, int splits, float* partials, int* counters) {
  using M = PairMath<T>;
  using T2 = typename M::T2;
  const int mt = blockIdx.x, ot = blockIdx.y, split = blockIdx.z;
  const int m_tiles = gridDim.x, out_tiles = gridDim.y;
  const int64_t n_tiles = p.n / kTileN;  // of the weight
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;

  // This CTA's 16-k steps, then this warp's contiguous run of them.
  const int64_t steps = p.k / w4::kTileK;
  const int64_t per_split = (steps + splits - 1) / splits;
  const int64_t split_begin = min64(steps, split * per_split);
  const int64_t split_end = min64(steps, split_begin + per_split);
  const int64_t per_warp = (split_end - split_begin + kWarps - 1) / kWarps;
  const int64_t begin = min64(split_end, split_begin + warp * per_warp);
  const int64_t end = min64(split_end, begin + per_warp);

  const auto* tiles = reinterpret_cast<const uint4*>(p.b);  // 32 uint4 per tile, one per lane
  const T* scales = static_cast<const T*>(p.scales);
  const T* zeros = static_cast<const T*>(p.zeros);
  const int64_t m0 = static_cast<int64_t>(mt) * kTileM;
  const int64_t first_tile = static_cast<int64_t>(ot) * kTiles;  // weight tile of t = 0
  const bool paired = p.perm == nullptr && reinterpret_cast<uintptr_t>(p.a) % 4 == 0 &&
                      (p.m <= 1 || p.lda % 2 == 0);

  float acc[kTiles][kBlocksN][4] = {};
  T2 scale[kTiles][kBlocksN], offset[kTiles][kBlocksN];
  int64_t group = -1;
  // Steps go in batches of kBatch: the batch's weight loads are all issued before its first
  // multiply, so each warp keeps kBatch * kTiles 16-byte loads in flight (a decode GEMM is
  // bound by how many bytes are in flight per SM).
  constexpr int kBatch = 4 / kTiles;
  for (int64_t base = begin; base < end; base += kBatch) {
    uint4 q[kBatch][kTiles];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        q[b][t] = base + b < end
                      ? __ldg(tiles + ((base + b) * n_tiles + first_tile + t) * 32 + lane)
                      : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t step = base + b;
      if (step >= end) break;
      const int64_t k = step * w4::kTileK + 2 * c;
      const uint32_t a[4] = {
          load_a_pair<T>(p, paired, m0 + g, k), load_a_pair<T>(p, paired, m0 + g + 8, k),
          load_a_pair<T>(p, paired, m0 + g, k + 8), load_a_pair<T>(p, paired, m0 + g + 8, k + 8)};
      const int64_t step_group = step * w4::kTileK / p.group_size;
      if (step_group != group) {
        group = step_group;
#pragma unroll
        for (int t = 0; t < kTiles; ++t) {
#pragma unroll
          for (int f = 0; f < kBlocksN; ++f) {
            // block f of the lane: column 8 f + g of the tile
            const int64_t at = group * p.n + (first_tile + t) * kTileN + 8 * f + g;
            scale[t][f] = T2(scales[at], scales[at]);
            const float z = kZeros ? M::to_float(zeros[at]) : static_cast<float>(w4::kZeroPoint);
            offset[t][f] = M::splat(M::kMagicValue + z);
          }
        }
      }
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        const uint32_t words[4] = {q[b][t].x, q[b][t].y, q[b][t].z, q[b][t].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int f0 = 2 * j, f1 = 2 * j + 1;
          mma_16816<T>(acc[t][f0], a, dequant_pair<T>(words[j], 0, offset[t][f0], scale[t][f0]),
                       dequant_pair<T>(words[j], 4, offset[t][f0], scale[t][f0]));
          mma_16816<T>(acc[t][f1], a, dequant_pair<T>(words[j], 8, offset[t][f1], scale[t][f1]),
                       dequant_pair<T>(words[j], 12, offset[t][f1], scale[t][f1]));
        }
      }
    }
  }

  // The warps' partial tiles meet in shared memory, one weight tile at a time: C fragment rows
  // g and g + 8, columns 8 f + 2 c and + 1.
  __shared__ float2 reduction[kWarps][kTileM][kRedStride / 2];
  constexpr int kPerThread = kTileElems / kThreads;  // 4
  float sum[kTiles][kPerThread];
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    if (t > 0) __syncthreads();  // the previous tile's sums are read
#pragma unroll
    for (int f = 0; f < kBlocksN; ++f) {
      reduction[warp][g][4 * f + c] = make_float2(acc[t][f][0], acc[t][f][1]);
      reduction[warp][g + 8][4 * f + c] = make_float2(acc[t][f][2], acc[t][f][3]);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = threadIdx.x + i * kThreads, r = e / kTileN, n = e % kTileN;
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float2 v = reduction[w][r][n / 2];
        s += n % 2 == 0 ? v.x : v.y;
      }
      sum[t][i] = s;
    }
  }

  if (splits > 1) {
    // Partials of split s: [s][m tile][output tile][t][16 x 64].
    const int64_t tile = static_cast<int64_t>(mt) * out_tiles + ot;
    const int64_t split_stride = static_cast<int64_t>(m_tiles) * out_tiles * kTiles * kTileElems;
    float* mine = partials + split * split_stride + tile * kTiles * kTileElems;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        mine[t * kTileElems + threadIdx.x + i * kThreads] = sum[t][i];
      }
    }
    __threadfence();
    __syncthreads();
    __shared__ int is_last;
    if (threadIdx.x == 0) is_last = atomicAdd(counters + tile, 1) == splits - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        const int64_t at = tile * kTiles * kTileElems + t * kTileElems + threadIdx.x + i * kThreads;
        float total = 0.0f;
        for (int s = 0; s < splits; ++s) {
          total += s == split ? sum[t][i] : __ldcg(partials + s * split_stride + at);
        }
        sum[t][i] = total;
      }
    }
  }

  const T* bias = static_cast<const T*>(p.bias);
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int e = threadIdx.x + i * kThreads;
    const int64_t m = m0 + e / kTileN, col = e % kTileN;
    if (m >= p.m) continue;
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

// Output tiles of 16 x 64: one CTA each per split.
int64_t output_tiles(const W4A16GemmParams& p) {
  return (p.m + kTileM - 1) / kTileM * (p.n / kTileN / (p.gated ? 2 : 1));
}

// The workspace: one counter per output tile, then (from the next 16 bytes) the partials, one
// 16 x 64 float tile per weight tile, split and row of tiles.
size_t counter_bytes(int64_t tiles) {
  return (static_cast<size_t>(tiles) * sizeof(int) + 15) / 16 * 16;
}

template <typename T>
cudaError_t launch_gemm(const W4A16GemmParams& p, dim3 grid, int splits, float* partials,
                        int* counters, cudaStream_t stream) {
  const bool zeros = p.zeros != nullptr;
  if (p.gated) {
    if (zeros) {
      w4a16_gemm_kernel<T, true, 2><<<grid, kThreads, 0, stream>>>(p, splits, partials, counters);
    } else {
      w4a16_gemm_kernel<T, false, 2><<<grid, kThreads, 0, stream>>>(p, splits, partials, counters);
    }
  } else if (zeros) {
    w4a16_gemm_kernel<T, true, 1><<<grid, kThreads, 0, stream>>>(p, splits, partials, counters);
  } else {
    w4a16_gemm_kernel<T, false, 1><<<grid, kThreads, 0, stream>>>(p, splits, partials, counters);
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
  int splits = 1;
  // Split K until two CTAs per SM, while each warp keeps kMinStepsPerWarp steps.
  while (tiles * splits < 2 * sm_count && steps / (2 * splits) >= kWarps * kMinStepsPerWarp) {
    splits *= 2;
  }
  W4A16Plan plan{splits, 0};
  if (splits > 1) {
    const int64_t weight_tiles = (p.m + kTileM - 1) / kTileM * (p.n / kTileN);
    plan.workspace_bytes = counter_bytes(tiles) +
                           static_cast<size_t>(splits) * weight_tiles * kTileElems * sizeof(float);
  }
  return plan;
}

cudaError_t w4a16_gemm(const W4A16GemmParams& p, const W4A16Plan& plan, void* workspace,
                       cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return cudaSuccess;
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
