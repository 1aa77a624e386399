// rmsnorm_cuda_utils.cuh: device building blocks of rmsnorm_cuda.cu (CUDA runtime and
// cuda_fp16/cuda_bf16 only, no Torch headers): fp32 <-> element conversions, the rounding of
// the normalized value, chunk loads and stores with cache hints, and the sum over the threads
// that share a row. The chunks themselves, their packing from fp32 and the division by an
// invariant 64-bit divisor are shared with rope: cuda_chunk.cuh (a copy of
// common/cuda_chunk.cuh), brought into rmsnorm::cuda::detail below.
//
// A chunk is kVec consecutive elements of one row: 16 bytes of the input dtype on the vector
// path (8 x fp16/bf16, 4 x fp32; then 16 or 32 bytes of a weight/output that is fp32), one
// element on the scalar path. Chunks move as 16-byte accesses (or one 2/4-byte access) and are
// unpacked to fp32 in registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda_chunk.cuh"

namespace rmsnorm {
namespace cuda {
namespace detail {

using cuda_chunk::Chunk;
using cuda_chunk::chunk_from_float;
using cuda_chunk::FastDivU64;

// ---------------------------------------------------------------------------------------------
// Conversions. Every value is computed in fp32 and rounded to nearest even once on store.
// bf16 uses only conversions, which cuda_bf16.h emulates on sm_75.
// ---------------------------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// round_norm: n' = round_{norm_dtype}(n) (LlamaRMSNorm's hidden_states.to(input_dtype));
// kNone for no rounding and for an fp32 norm_dtype.
enum class NormRound : int { kNone = 0, kHalf = 1, kBFloat16 = 2 };

template <NormRound kRound>
__device__ __forceinline__ float round_norm(float x) {
  if constexpr (kRound == NormRound::kHalf) {
    return __half2float(__float2half_rn(x));
  } else if constexpr (kRound == NormRound::kBFloat16) {
    return __bfloat162float(__float2bfloat16_rn(x));
  } else {
    return x;
  }
}

// ---------------------------------------------------------------------------------------------
// Global memory accesses.
//   Ld::kStream   ld.global: activations read once per row. Coherent (not .nc) because
//                 outputs may alias them (in-place forms); a thread stores an element only after
//                 it has loaded it, and nothing it stores is loaded again. No cache hint:
//                 L1::no_allocate made both directions slower (benchmarks/NOTES.md).
//   Ld::kReadOnly ld.global.nc: weight, scale and shift, never written by these kernels and
//                 reused by every row, so they stay in L1.
//   Ld::kPlain    an ordinary C++ load, for data this kernel writes and reads back (the
//                 residual sum of the two-pass forward, the workspace of the wide backward):
//                 the compiler sees and orders it against the matching plain store.
//   St::kStream   st.global.cs (evict-first): outputs this kernel never reads back.
//   St::kPlain    an ordinary C++ store.
// The inline-asm accesses are volatile, so the compiler keeps them in program order with each
// other and after griddepcontrol.wait (a non-volatile asm without memory operands may be moved
// anywhere, even above the wait for the producer grid); ptxas still schedules the instructions.
// ---------------------------------------------------------------------------------------------
enum class Ld { kStream, kReadOnly, kPlain };
enum class St { kStream, kPlain };

template <Ld kPolicy>
__device__ __forceinline__ uint32_t ld_b16(const void* p) {
  unsigned short h;
  if constexpr (kPolicy == Ld::kStream) {
    asm volatile("ld.global.b16 %0, [%1];" : "=h"(h) : "l"(p));
  } else if constexpr (kPolicy == Ld::kReadOnly) {
    asm volatile("ld.global.nc.b16 %0, [%1];" : "=h"(h) : "l"(p));
  } else {
    h = *static_cast<const unsigned short*>(p);
  }
  return h;
}
template <Ld kPolicy>
__device__ __forceinline__ uint32_t ld_b32(const void* p) {
  uint32_t r;
  if constexpr (kPolicy == Ld::kStream) {
    asm volatile("ld.global.b32 %0, [%1];" : "=r"(r) : "l"(p));
  } else if constexpr (kPolicy == Ld::kReadOnly) {
    asm volatile("ld.global.nc.b32 %0, [%1];" : "=r"(r) : "l"(p));
  } else {
    r = *static_cast<const uint32_t*>(p);
  }
  return r;
}
template <Ld kPolicy>
__device__ __forceinline__ void ld_b128(uint32_t* r, const void* p) {
  if constexpr (kPolicy == Ld::kStream) {
    asm volatile("ld.global.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "l"(p));
  } else if constexpr (kPolicy == Ld::kReadOnly) {
    asm volatile("ld.global.nc.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "l"(p));
  } else {
    const uint4 v = *static_cast<const uint4*>(p);
    r[0] = v.x;
    r[1] = v.y;
    r[2] = v.z;
    r[3] = v.w;
  }
}

template <St kPolicy>
__device__ __forceinline__ void st_b16(void* p, uint32_t v) {
  const unsigned short h = static_cast<unsigned short>(v);
  if constexpr (kPolicy == St::kStream) {
    asm volatile("st.global.cs.b16 [%0], %1;" ::"l"(p), "h"(h));
  } else {
    *static_cast<unsigned short*>(p) = h;
  }
}
template <St kPolicy>
__device__ __forceinline__ void st_b32(void* p, uint32_t v) {
  if constexpr (kPolicy == St::kStream) {
    asm volatile("st.global.cs.b32 [%0], %1;" ::"l"(p), "r"(v));
  } else {
    *static_cast<uint32_t*>(p) = v;
  }
}
template <St kPolicy>
__device__ __forceinline__ void st_b128(void* p, const uint32_t* v) {
  if constexpr (kPolicy == St::kStream) {
    asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v[0]), "r"(v[1]),
                 "r"(v[2]), "r"(v[3]));
  } else {
    *static_cast<uint4*>(p) = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

// Loads kN elements at p: 16-byte accesses (p 16-byte aligned), or one 4- or 2-byte access.
template <Ld kPolicy, typename T, int kN>
__device__ __forceinline__ Chunk<T, kN> load_chunk(const T* p) {
  using C = Chunk<T, kN>;
  C c;
  if constexpr (C::kBytes >= 16) {
    static_assert(C::kBytes % 16 == 0, "whole 16-byte pieces");
#pragma unroll
    for (int i = 0; i < C::kBytes / 16; ++i) {
      ld_b128<kPolicy>(c.w + 4 * i, reinterpret_cast<const char*>(p) + 16 * i);
    }
  } else if constexpr (C::kBytes == 4) {
    c.w[0] = ld_b32<kPolicy>(p);
  } else {
    static_assert(C::kBytes == 2, "16-byte pieces, one word or one 2-byte element");
    c.w[0] = ld_b16<kPolicy>(p);
  }
  return c;
}

template <St kPolicy, typename T, int kN>
__device__ __forceinline__ void store_chunk(T* p, const Chunk<T, kN>& c) {
  using C = Chunk<T, kN>;
  if constexpr (C::kBytes >= 16) {
#pragma unroll
    for (int i = 0; i < C::kBytes / 16; ++i) {
      st_b128<kPolicy>(reinterpret_cast<char*>(p) + 16 * i, c.w + 4 * i);
    }
  } else if constexpr (C::kBytes == 4) {
    st_b32<kPolicy>(p, c.w[0]);
  } else {
    st_b16<kPolicy>(p, c.w[0]);
  }
}

// Asks L2 to fetch [p, p + bytes) ahead of its use (p 16-byte aligned, bytes a multiple of 16):
// one bulk prefetch on sm_90+, nothing on older devices. It only moves data into L2, so it
// cannot change a result; the backward uses it to keep DRAM busy with a CTA's next rows while the
// current ones are reduced and written.
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  (void)p;
  (void)bytes;
#endif
}

// Makes the compiler treat the chunk as a new value (an empty asm that "modifies" its registers),
// so that fp32 values it converted before a row reduction are recomputed from the packed chunk
// after it, instead of being kept live across it: 16-bit data then costs half a register per
// element across the reduction, not one register per element for each derived value.
template <typename T, int kN>
__device__ __forceinline__ void launder(Chunk<T, kN>& c) {
#pragma unroll
  for (int i = 0; i < Chunk<T, kN>::kWords; ++i) asm volatile("" : "+r"(c.w[i]));
}
template <typename T, int kN, int kM>
__device__ __forceinline__ void launder(Chunk<T, kN> (&c)[kM]) {
#pragma unroll
  for (int i = 0; i < kM; ++i) launder(c[i]);
}

// All lanes of a warp take part in the shuffles below.
constexpr unsigned kFullWarp = 0xffffffffu;

// The sum of v over the 32 lanes of the warp, in every lane (unrolled: a runtime-bounded loop
// cost a branch and its counter per level; the backward, which runs this per row of 16 columns per
// thread, is bound by issue).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullWarp, v, offset);
  return v;
}

// ---------------------------------------------------------------------------------------------
// Sum over the `group` threads that share a row, result in every thread of the group; `slot` is
// the group's index in the CTA (threadIdx.x / group, which the callers have at hand: dividing
// here cost an integer division per row).
// Groups are consecutive threads: a power of two up to 32 (aligned inside a warp: an xor
// butterfly) or a multiple of 32 (whole warps: a butterfly per warp, the warp sums through
// `red` behind a CTA barrier, then a second butterfly over the group's at most 32 warp sums, a
// few shuffles where a serial loop would wait on each shared load). The barrier is
// __syncthreads, not a named barrier per group: a named barrier with a register id makes ptxas
// reserve all 16 hardware barriers for the CTA, which capped residency at 4 CTAs per SM and cost
// the forward bandwidth (benchmarks/NOTES.md, "Smaller findings"); all groups of a CTA
// reduce in the same step anyway. Butterfly partners add the same two values (a + b == b + a in IEEE
// arithmetic), so every thread of the group ends with bit-identical sums. All threads of a
// CTA call it, active row or not (barrier, full-warp shuffles). Callers that reduce
// repeatedly alternate between two `red` buffers: a warp writing the next buffer has passed a
// barrier that every reader of the previous one reached after reading it.
// ---------------------------------------------------------------------------------------------
template <int kN>
__device__ __forceinline__ void group_sum(float (&v)[kN], int group, int slot, float (*red)[32]) {
  if (group < 32) {
    for (int offset = group >> 1; offset > 0; offset >>= 1) {
#pragma unroll
      for (int i = 0; i < kN; ++i) v[i] += __shfl_xor_sync(kFullWarp, v[i], offset);
    }
    return;
  }
  // Whole warps: the levels outermost, so that the kN butterflies interleave.
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] += __shfl_xor_sync(kFullWarp, v[i], offset);
  }
  if (group == 32) return;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int i = 0; i < kN; ++i) red[i][warp] = v[i];
  }
  const int warps = group >> 5;
  __syncthreads();
  // Every warp of the group adds the group's (at most 32) warp sums with the same butterfly.
  const int lane = static_cast<int>(threadIdx.x) & 31;
#pragma unroll
  for (int i = 0; i < kN; ++i) v[i] = warp_sum(lane < warps ? red[i][slot * warps + lane] : 0.0f);
}

// group_sum of one value for a CTA that is one group of whole warps (blockDim.x a multiple of 32,
// at least 64): the same additions in the same order, without the tests on the group's shape.
// warp_sums: at least blockDim.x / 32 floats of shared memory, used once.
__device__ __forceinline__ float cta_sum(float v, float* warp_sums) {
  v = warp_sum(v);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  if (lane == 0) warp_sums[threadIdx.x >> 5] = v;
  __syncthreads();
  return warp_sum(lane < static_cast<int>(blockDim.x >> 5) ? warp_sums[lane] : 0.0f);
}

}  // namespace detail
}  // namespace cuda
}  // namespace rmsnorm
