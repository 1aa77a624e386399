// newkernel_cuda.cu: CUDA kernel and host launcher of `scale` (newkernel_cuda.h).
//
// One thread per 16-byte vector (8 x fp16/bf16, 4 x fp32, 2 x fp64) when every row start is
// 16-byte aligned (aligned base pointers, row strides a multiple of the vector width), else one
// element per thread, still coalesced. Block (x, y) covers vectors of a row and rows; the rows
// loop only beyond 65535 of them. The last, partial vector of a row is done element by element.
// fp32, fp16 and bf16 compute in fp32 and round once; fp64 computes in fp64.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "dispatch.cuh"
#include "newkernel_cuda.h"
#include "newkernel_params.h"

namespace newkernel {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVectorBytes = 16;
constexpr int64_t kMaxGridY = 65535;

template <typename T>
struct Compute {
  using type = float;
};
template <>
struct Compute<double> {
  using type = double;
};

__device__ __forceinline__ float to_compute(float x) { return x; }
__device__ __forceinline__ double to_compute(double x) { return x; }
__device__ __forceinline__ float to_compute(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_compute(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ void from_compute(float x, float* y) { *y = x; }
__device__ __forceinline__ void from_compute(double x, double* y) { *y = x; }
__device__ __forceinline__ void from_compute(float x, __half* y) { *y = __float2half_rn(x); }
__device__ __forceinline__ void from_compute(float x, __nv_bfloat16* y) {
  *y = __float2bfloat16_rn(x);
}

// kVec elements of T, loaded and stored as one access.
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) scale_kernel(ScaleParams p) {
  using C = typename Compute<T>::type;
  const C alpha = static_cast<C>(p.alpha);
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kVec;
  if (col >= p.n) {
    return;
  }
  for (int64_t row = blockIdx.y; row < p.rows; row += gridDim.y) {
    const T* x = static_cast<const T*>(p.input) + row * p.input_row_stride + col;
    T* y = static_cast<T*>(p.out) + row * p.out_row_stride + col;
    if (col + kVec <= p.n) {
      const Vec<T, kVec> in = *reinterpret_cast<const Vec<T, kVec>*>(x);
      Vec<T, kVec> out;
#pragma unroll
      for (int j = 0; j < kVec; ++j) from_compute(alpha * to_compute(in.v[j]), &out.v[j]);
      *reinterpret_cast<Vec<T, kVec>*>(y) = out;
    } else {
      for (int64_t j = 0; j < p.n - col; ++j) from_compute(alpha * to_compute(x[j]), &y[j]);
    }
  }
}

bool aligned(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % kVectorBytes == 0; }

template <typename T>
cudaError_t launch(const ScaleParams& p, cudaStream_t stream) {
  constexpr int kVec = kVectorBytes / static_cast<int>(sizeof(T));
  const bool vectorized =
      aligned(p.out) && aligned(p.input) &&
      (p.rows == 1 || (p.out_row_stride % kVec == 0 && p.input_row_stride % kVec == 0));
  const int64_t per_thread = vectorized ? kVec : 1;
  const int64_t threads_per_row = (p.n + per_thread - 1) / per_thread;
  const dim3 grid(static_cast<unsigned>((threads_per_row + kThreads - 1) / kThreads),
                  static_cast<unsigned>(std::min(p.rows, kMaxGridY)));
  if (vectorized) {
    scale_kernel<T, kVec><<<grid, kThreads, 0, stream>>>(p);
  } else {
    scale_kernel<T, 1><<<grid, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t scale(DType dtype, const ScaleParams& params, cudaStream_t stream) {
  if (params.rows == 0 || params.n == 0) {
    return cudaSuccess;
  }
  return dispatch::floats_and_double(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch<T>(params, stream);
  });
}

}  // namespace cuda
}  // namespace newkernel
