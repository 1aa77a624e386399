// scaled_mm_sm90_gate.cu: the gate pass of scaled_mm_sm90_gate.h. One thread per pair of
// adjacent outputs: both their gate values, and both up values kGateBlock columns further, are
// 4-byte loads (N and kGateBlock are even).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "scaled_mm_sm90_activation.cuh"
#include "scaled_mm_sm90_gate.h"

namespace quant {
namespace cuda {
namespace sm90 {
namespace {

template <class T>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ float2 to_float2(type v) { return __bfloat1622float2(v); }
  static __device__ type from_float2(float2 v) { return __float22bfloat162_rn(v); }
};
template <>
struct Pair<__half> {
  using type = __half2;
  static __device__ float2 to_float2(type v) { return __half22float2(v); }
  static __device__ type from_float2(float2 v) { return __float22half2_rn(v); }
};

template <class T, class Act>
__global__ void gate_kernel(const T* __restrict__ y, int64_t ldy, T* __restrict__ out, int64_t ldo,
                            int64_t rows, int64_t cols, Act act) {
  using P = Pair<T>;
  using V = typename P::type;
  const int64_t pairs_per_row = cols / 2;
  const int64_t total = rows * pairs_per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / pairs_per_row;
    const int64_t col = 2 * (i - row * pairs_per_row);  // output column, even
    const int64_t block = col / kGateBlock;
    const int64_t gate_col = block * 2 * kGateBlock + (col - block * kGateBlock);
    const float2 g = P::to_float2(*reinterpret_cast<const V*>(y + row * ldy + gate_col));
    const float2 u =
        P::to_float2(*reinterpret_cast<const V*>(y + row * ldy + gate_col + kGateBlock));
    *reinterpret_cast<V*>(out + row * ldo + col) =
        P::from_float2(make_float2(activate(act, g.x) * u.x, activate(act, g.y) * u.y));
  }
}

template <class T>
cudaError_t launch(const ScaledMmParams& p, const void* y, int64_t ldy, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t pairs = p.m * (p.n / 2);
  const int64_t blocks = (pairs + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  with_activation(p.activation, [&](auto act) {
    gate_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const T*>(y), ldy, static_cast<T*>(p.d),
                                               p.ldd, p.m, p.n, act);
  });
  return cudaGetLastError();
}

}  // namespace

cudaError_t gate_packed_product(const ScaledMmParams& p, const void* y, int64_t ldy,
                                cudaStream_t stream) {
  if (p.m == 0) return cudaSuccess;
  if (p.out_dtype == DType::kBFloat16) return launch<__nv_bfloat16>(p, y, ldy, stream);
  return launch<__half>(p, y, ldy, stream);
}

}  // namespace sm90
}  // namespace cuda
}  // namespace quant
