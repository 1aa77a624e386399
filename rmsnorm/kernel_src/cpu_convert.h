// cpu_convert.h: fp32 <-> fp16 / bf16 conversion of contiguous runs of elements for the CPU
// implementations (rmsnorm_cpu.cpp, rope_cpu.cpp).
//
// One source of truth: common/cpu_convert.h, copied into each user's kernel_src/ by
// scripts/sync_common.py (a kernel folder must build on its own); tests/test_common_sync.py
// fails when a copy drifts. Edit common/, then run the script.
//
// Every rounding to fp16 / bf16 is to nearest even (c10::BFloat16; c10::Half, or the F16C
// instructions, which round identically, on x86-64 CPUs that have them); the conversions to fp32
// are exact. There is no arithmetic here, so build flags such as rope's -ffp-contract=off change
// nothing in this file.
//
// The dtype switches (load, store, round_to) take the kernel's own DType enum (a template
// parameter: every kernel has kFloat32, kFloat16 and kBFloat16) and the name that prefixes the
// error of an unknown value (the callers check dtypes first, so it is a guard, not a user error).
//
// Linkage: everything is in an unnamed namespace (internal linkage), so two kernels built from
// different versions of this header and loaded into one process can never bind each other's
// definitions; `inline` keeps -Wall quiet about the functions a kernel does not use.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CPU_CONVERT_X86_F16C 1
#endif

namespace cpu_convert {
namespace {

// Bytes of one element: 4 for kFloat32, 2 for kFloat16 and kBFloat16.
template <typename DType>
inline int64_t element_size(DType dtype) {
  return dtype == DType::kFloat32 ? 4 : 2;
}

// Address of element `index` of a buffer of `dtype` elements.
template <typename DType>
inline const char* at_index(const void* base, DType dtype, int64_t index) {
  return static_cast<const char*>(base) + index * element_size(dtype);
}
template <typename DType>
inline char* at_index(void* base, DType dtype, int64_t index) {
  return static_cast<char*>(base) + index * element_size(dtype);
}

template <typename T>
inline void load_as(float* __restrict dst, const T* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

template <typename T>
inline void store_as(T* __restrict dst, const float* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]);
}

template <typename T>
inline void round_as(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(static_cast<T>(v[i]));
}

// fp16 on x86-64. c10::Half converts with bit manipulation that GCC does not vectorize (control
// flow), unless the whole build targets F16C, which our baseline x86-64 build does not: those
// loops made rmsnorm's fp16 CPU path several times slower than its bf16 one
// (rmsnorm/benchmarks/NOTES.md, "Smaller findings"). The F16C
// instructions convert 8 values at a time with the same IEEE round-to-nearest-even results, so
// they are used when the CPU has them (checked once at run time) and the c10::Half loops are the
// fallback.
#if defined(CPU_CONVERT_X86_F16C)
inline bool cpu_has_f16c() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  }();
  return has;
}

__attribute__((target("avx,f16c"))) inline void load_half_f16c(float* dst, const c10::Half* src,
                                                               int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  load_as(dst + i, src + i, n - i);
}

__attribute__((target("avx,f16c"))) inline void store_half_f16c(c10::Half* dst, const float* src,
                                                                int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  store_as(dst + i, src + i, n - i);
}

__attribute__((target("avx,f16c"))) inline void round_half_f16c(float* v, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(v + i, _mm256_cvtph_ps(h));
  }
  round_as<c10::Half>(v + i, n - i);
}
#endif

inline void load_half(float* dst, const c10::Half* src, int64_t n) {
#if defined(CPU_CONVERT_X86_F16C)
  if (cpu_has_f16c()) {
    load_half_f16c(dst, src, n);
    return;
  }
#endif
  load_as(dst, src, n);
}

inline void store_half(c10::Half* dst, const float* src, int64_t n) {
#if defined(CPU_CONVERT_X86_F16C)
  if (cpu_has_f16c()) {
    store_half_f16c(dst, src, n);
    return;
  }
#endif
  store_as(dst, src, n);
}

inline void round_half(float* v, int64_t n) {
#if defined(CPU_CONVERT_X86_F16C)
  if (cpu_has_f16c()) {
    round_half_f16c(v, n);
    return;
  }
#endif
  round_as<c10::Half>(v, n);
}

// dst[0, n) <- src[0, n) converted to fp32 (exact). `who` prefixes the error of an unknown dtype.
template <typename DType>
inline void load(DType dtype, float* dst, const void* src, int64_t n, const char* who) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kFloat16:
      load_half(dst, static_cast<const c10::Half*>(src), n);
      return;
    case DType::kBFloat16:
      load_as(dst, static_cast<const c10::BFloat16*>(src), n);
      return;
    default:
      TORCH_CHECK(false, who, ": unsupported DType value ", static_cast<int>(dtype));
  }
}

// dst[0, n) <- src[0, n) rounded to `dtype` (to nearest even).
template <typename DType>
inline void store(DType dtype, void* dst, const float* src, int64_t n, const char* who) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kFloat16:
      store_half(static_cast<c10::Half*>(dst), src, n);
      return;
    case DType::kBFloat16:
      store_as(static_cast<c10::BFloat16*>(dst), src, n);
      return;
    default:
      TORCH_CHECK(false, who, ": unsupported DType value ", static_cast<int>(dtype));
  }
}

// v[0, n) <- round_dtype(v[0, n)), kept in fp32.
template <typename DType>
inline void round_to(DType dtype, float* v, int64_t n, const char* who) {
  switch (dtype) {
    case DType::kFloat32:
      return;
    case DType::kFloat16:
      round_half(v, n);
      return;
    case DType::kBFloat16:
      round_as<c10::BFloat16>(v, n);
      return;
    default:
      TORCH_CHECK(false, who, ": unsupported DType value ", static_cast<int>(dtype));
  }
}

}  // namespace
}  // namespace cpu_convert
