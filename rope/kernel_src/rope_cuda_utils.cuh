// rope_cuda_utils.cuh: device building blocks of rope_cuda.cu (CUDA runtime and
// cuda_fp16/cuda_bf16 only, no Torch headers): the loads and stores of register chunks with
// cache hints and the index loads. The chunks themselves, their packing from fp32 and the
// division by an invariant 64-bit divisor are shared with rmsnorm: cuda_chunk.cuh (a copy of
// common/cuda_chunk.cuh), brought into rope::cuda::detail below.
//
// A chunk is kN consecutive elements of one tensor row: 16 bytes of the activation dtype on the
// vector path (8 x fp16/bf16, 4 x fp32) and the matching 8, 16 or 32 bytes of a table, one
// element on the scalar path. Chunks move as 16-byte accesses (or one 8-, 4- or 2-byte access)
// and are unpacked to fp32 in registers.
//
// The inline assembly is compiled for the device only. The `#else` branches (plain C++
// accesses) are never used by nvcc: they let the kernels be compiled as host C++ against stub
// CUDA headers, which is how their index math is checked on machines without a GPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda_chunk.cuh"

namespace rope {
namespace cuda {
namespace detail {

using cuda_chunk::Chunk;
using cuda_chunk::chunk_from_float;
using cuda_chunk::FastDivU64;

// ---------------------------------------------------------------------------------------------
// Global memory accesses.
//   Ld::kStream    ld.global.L1::no_allocate: q and k, each element read once. Coherent (not
//                  .nc) because the output may be the input (in place): a thread stores an
//                  element only after it has loaded it, and nothing it stores is loaded again.
//                  Not allocating in L1 leaves it to the table rows, which every head of a
//                  token reads again.
//   Ld::kCached    ld.global: the same, allocating in L1 (LaunchConfig picks one of the two).
//   Ld::kReadOnly  ld.global.nc: cos, sin, positions, offsets and cu_seqlens, never written by
//                  this kernel; a table row is reused by every head of its token through L1.
//   St::kStream    st.global.cs (evict-first): outputs, never read back.
// The accesses are volatile asm, so the compiler keeps them in program order with each other
// and after griddepcontrol.wait (a non-volatile asm without memory operands may be hoisted above
// the wait for the producer grid); ptxas still overlaps their latencies.
// ---------------------------------------------------------------------------------------------
enum class Ld { kStream, kCached, kReadOnly };
enum class St { kStream };

template <Ld kPolicy>
__device__ __forceinline__ uint32_t ld_b16(const void* p) {
  unsigned short h;
#if defined(__CUDA_ARCH__)
  if constexpr (kPolicy == Ld::kStream) {
    asm volatile("ld.global.L1::no_allocate.b16 %0, [%1];" : "=h"(h) : "l"(p));
  } else if constexpr (kPolicy == Ld::kCached) {
    asm volatile("ld.global.b16 %0, [%1];" : "=h"(h) : "l"(p));
  } else {
    asm volatile("ld.global.nc.b16 %0, [%1];" : "=h"(h) : "l"(p));
  }
#else
  std::memcpy(&h, p, sizeof(h));
#endif
  return h;
}

template <Ld kPolicy>
__device__ __forceinline__ uint32_t ld_b32(const void* p) {
  uint32_t r;
#if defined(__CUDA_ARCH__)
  if constexpr (kPolicy == Ld::kStream) {
    asm volatile("ld.global.L1::no_allocate.b32 %0, [%1];" : "=r"(r) : "l"(p));
  } else if constexpr (kPolicy == Ld::kCached) {
    asm volatile("ld.global.b32 %0, [%1];" : "=r"(r) : "l"(p));
  } else {
    asm volatile("ld.global.nc.b32 %0, [%1];" : "=r"(r) : "l"(p));
  }
#else
  std::memcpy(&r, p, sizeof(r));
#endif
  return r;
}

// 64-bit scalars are only read through the read-only path (int64 positions).
__device__ __forceinline__ uint64_t ld_b64_readonly(const void* p) {
  uint64_t r;
#if defined(__CUDA_ARCH__)
  asm volatile("ld.global.nc.b64 %0, [%1];" : "=l"(r) : "l"(p));
#else
  std::memcpy(&r, p, sizeof(r));
#endif
  return r;
}

template <Ld kPolicy>
__device__ __forceinline__ void ld_v2_b32(uint32_t* r, const void* p) {
#if defined(__CUDA_ARCH__)
  if constexpr (kPolicy == Ld::kStream) {
    asm volatile("ld.global.L1::no_allocate.v2.b32 {%0, %1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1])
                 : "l"(p));
  } else if constexpr (kPolicy == Ld::kCached) {
    asm volatile("ld.global.v2.b32 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "l"(p));
  } else {
    asm volatile("ld.global.nc.v2.b32 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "l"(p));
  }
#else
  std::memcpy(r, p, 8);
#endif
}

template <Ld kPolicy>
__device__ __forceinline__ void ld_v4_b32(uint32_t* r, const void* p) {
#if defined(__CUDA_ARCH__)
  if constexpr (kPolicy == Ld::kStream) {
    asm volatile("ld.global.L1::no_allocate.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "l"(p));
  } else if constexpr (kPolicy == Ld::kCached) {
    asm volatile("ld.global.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "l"(p));
  } else {
    asm volatile("ld.global.nc.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "l"(p));
  }
#else
  std::memcpy(r, p, 16);
#endif
}

__device__ __forceinline__ void st_b16(void* p, uint32_t v) {
  const unsigned short h = static_cast<unsigned short>(v);
#if defined(__CUDA_ARCH__)
  asm volatile("st.global.cs.b16 [%0], %1;" ::"l"(p), "h"(h));
#else
  std::memcpy(p, &h, sizeof(h));
#endif
}
__device__ __forceinline__ void st_b32(void* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.global.cs.b32 [%0], %1;" ::"l"(p), "r"(v));
#else
  std::memcpy(p, &v, sizeof(v));
#endif
}
__device__ __forceinline__ void st_v2_b32(void* p, const uint32_t* v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.global.cs.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(v[0]), "r"(v[1]));
#else
  std::memcpy(p, v, 8);
#endif
}
__device__ __forceinline__ void st_v4_b32(void* p, const uint32_t* v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v[0]), "r"(v[1]),
               "r"(v[2]), "r"(v[3]));
#else
  std::memcpy(p, v, 16);
#endif
}

// Loads the kN elements at p: 16-byte accesses (p 16-byte aligned), or one 8-, 4- or 2-byte
// access (p aligned to it).
template <Ld kPolicy, typename T, int kN>
__device__ __forceinline__ Chunk<T, kN> load_chunk(const T* p) {
  using C = Chunk<T, kN>;
  C c;
  if constexpr (C::kBytes >= 16) {
    static_assert(C::kBytes % 16 == 0, "whole 16-byte pieces");
#pragma unroll
    for (int i = 0; i < C::kBytes / 16; ++i) {
      ld_v4_b32<kPolicy>(c.w + 4 * i, reinterpret_cast<const char*>(p) + 16 * i);
    }
  } else if constexpr (C::kBytes == 8) {
    ld_v2_b32<kPolicy>(c.w, p);
  } else if constexpr (C::kBytes == 4) {
    c.w[0] = ld_b32<kPolicy>(p);
  } else {
    static_assert(C::kBytes == 2, "16-byte pieces, 8, 4 or 2 bytes");
    c.w[0] = ld_b16<kPolicy>(p);
  }
  return c;
}

template <St kPolicy, typename T, int kN>
__device__ __forceinline__ void store_chunk(T* p, const Chunk<T, kN>& c) {
  static_assert(kPolicy == St::kStream, "one store policy");
  using C = Chunk<T, kN>;
  if constexpr (C::kBytes >= 16) {
    static_assert(C::kBytes % 16 == 0, "whole 16-byte pieces");
#pragma unroll
    for (int i = 0; i < C::kBytes / 16; ++i) {
      st_v4_b32(reinterpret_cast<char*>(p) + 16 * i, c.w + 4 * i);
    }
  } else if constexpr (C::kBytes == 8) {
    st_v2_b32(p, c.w);
  } else if constexpr (C::kBytes == 4) {
    st_b32(p, c.w[0]);
  } else {
    static_assert(C::kBytes == 2, "16-byte pieces, 8, 4 or 2 bytes");
    st_b16(p, c.w[0]);
  }
}

// One int64 or int32 index (positions) through the read-only path, widened to int64.
__device__ __forceinline__ int64_t load_index(const void* p, bool is_int32) {
  return is_int32 ? static_cast<int64_t>(static_cast<int32_t>(ld_b32<Ld::kReadOnly>(p)))
                  : static_cast<int64_t>(ld_b64_readonly(p));
}
__device__ __forceinline__ int64_t load_i32(const int32_t* p) {
  return static_cast<int32_t>(ld_b32<Ld::kReadOnly>(p));
}

}  // namespace detail
}  // namespace cuda
}  // namespace rope
