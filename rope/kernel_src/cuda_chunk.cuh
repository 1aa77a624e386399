// cuda_chunk.cuh: register chunks of tensor elements for the elementwise CUDA kernels of this
// repository (rmsnorm_cuda.cu, rope_cuda.cu), with their packing from fp32, and the division by
// an invariant 64-bit divisor that maps a row or token index to its sample (CUDA runtime and
// cuda_fp16/cuda_bf16 only, no Torch headers).
//
// Source of truth: common/cuda_chunk.cuh. Each kernel folder builds alone, so
// scripts/sync_common.py copies this file into <kernel>/kernel_src/ and tests/test_common_sync.py
// fails when a copy drifts. Edit it here, then run `python scripts/sync_common.py`.
//
// The global memory accesses that fill and drain chunks (load_chunk, store_chunk and their cache
// policies) differ between the kernels and stay in each kernel's <kernel>_cuda_utils.cuh, which
// brings these names into its own namespace with `using` declarations. Everything here has
// internal linkage, so the copies in different kernel libraries never clash.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace {
namespace cuda_chunk {

// ---------------------------------------------------------------------------------------------
// Chunks. kN elements of T in registers, kept as the 32-bit words they were loaded as (a 2-byte
// scalar in the low half of one word). Elements are unpacked to fp32 on use (get: a shift, a
// mask or a half-to-float conversion) and packed once on store. Holding words rather than
// 16-bit elements keeps the compiler from splitting chunks into 16-bit values (a PRMT and a
// register per element). Value-initialized chunks (Chunk<T, kN> c{}) are zero.
// ---------------------------------------------------------------------------------------------
template <typename T, int kN>
struct Chunk {
  static constexpr int kBytes = static_cast<int>(sizeof(T)) * kN;
  static constexpr int kWords = kBytes < 4 ? 1 : kBytes / 4;
  static_assert(kBytes == 2 || kBytes % 4 == 0, "chunk of whole words or one 2-byte element");
  uint32_t w[kWords];

  __device__ __forceinline__ float get(int j) const {
    if constexpr (std::is_same<T, float>::value) {
      return __uint_as_float(w[j]);
    } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      const uint32_t word = w[j >> 1];
      return __uint_as_float((j & 1) ? (word & 0xffff0000u) : (word << 16));
    } else {
      static_assert(std::is_same<T, __half>::value, "float, __half or __nv_bfloat16");
      const uint32_t word = w[j >> 1];
      const unsigned short h = static_cast<unsigned short>((j & 1) ? (word >> 16) : word);
      return __half2float(__ushort_as_half(h));
    }
  }
};

// Rounds kN fp32 values to T (to nearest even, once) and packs them. 2-byte types convert
// pairs: one cvt.rn.{f16,bf16}x2.f32 on sm_80+, two scalar conversions on older targets (bf16
// emulated on sm_75).
template <typename T, int kN>
__device__ __forceinline__ Chunk<T, kN> chunk_from_float(const float (&f)[kN]) {
  Chunk<T, kN> c;
  if constexpr (std::is_same<T, float>::value) {
#pragma unroll
    for (int j = 0; j < kN; ++j) c.w[j] = __float_as_uint(f[j]);
  } else if constexpr (kN == 1) {
    c.w[0] = std::is_same<T, __half>::value ? __half_as_ushort(__float2half_rn(f[0]))
                                            : __bfloat16_as_ushort(__float2bfloat16_rn(f[0]));
  } else {
    static_assert(kN % 2 == 0, "pairs of 2-byte elements");
#pragma unroll
    for (int j = 0; j < kN; j += 2) {
      uint32_t lo, hi;
      if constexpr (std::is_same<T, __half>::value) {
        const __half2 p = __floats2half2_rn(f[j], f[j + 1]);
        lo = __half_as_ushort(__low2half(p));
        hi = __half_as_ushort(__high2half(p));
      } else {
        const __nv_bfloat162 p = __floats2bfloat162_rn(f[j], f[j + 1]);
        lo = __bfloat16_as_ushort(__low2bfloat16(p));
        hi = __bfloat16_as_ushort(__high2bfloat16(p));
      }
      c.w[j / 2] = lo | (hi << 16);
    }
  }
  return c;
}

// ---------------------------------------------------------------------------------------------
// n / d for 0 <= n < 2^63 and an invariant 1 <= d < 2^63 without a 64-bit division (a
// division is ~70 instructions and a dozen registers): one multiply-high with the round-up
// magic of Granlund & Montgomery (1994), "Division by invariant integers using
// multiplication", section 4: s = ceil(log2 d), m = floor(2^64 (2^s - d) / d) + 1,
// q = (umulhi(n, m) + n) >> s. The sum cannot overflow for n < 2^63. make() runs on the host.
// ---------------------------------------------------------------------------------------------
struct FastDivU64 {
  uint64_t magic;
  unsigned shift;

  static FastDivU64 make(uint64_t d) {  // 1 <= d < 2^63
    unsigned s = 0;
    while (s < 63 && (uint64_t(1) << s) < d) ++s;
    const unsigned __int128 num = static_cast<unsigned __int128>((uint64_t(1) << s) - d) << 64;
    return FastDivU64{static_cast<uint64_t>(num / d) + 1, s};
  }
  __device__ __forceinline__ int64_t div(int64_t n) const {
    const uint64_t u = static_cast<uint64_t>(n);
    return static_cast<int64_t>((__umul64hi(u, magic) + u) >> shift);
  }
};

}  // namespace cuda_chunk
}  // namespace
