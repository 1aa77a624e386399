// newkernel_cpu.cpp: CPU implementation of the ops declared in newkernel_cpu.h.
//
// Rows are cut into chunks of kChunk elements and the (row, chunk) pairs are spread over ATen's
// thread pool, which keeps every thread busy both for many short rows and for one long row.
// fp32, fp16 and bf16 compute in fp32 and round once; fp64 computes in fp64 (so that float64
// gradcheck tests this code).
#include "newkernel_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace newkernel {
namespace cpu {
namespace {

constexpr int64_t kChunk = 1024;
// Elements one thread-pool task processes at least, so that tiny calls stay serial.
constexpr int64_t kGrainElems = 32768;

template <typename T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
void scale_impl(const ScaleParams& p) {
  using C = compute_t<T>;
  const C alpha = static_cast<C>(p.alpha);
  const T* input = static_cast<const T*>(p.input);
  T* out = static_cast<T*>(p.out);
  const int64_t chunks = (p.n + kChunk - 1) / kChunk;
  const int64_t grain = std::max<int64_t>(1, kGrainElems / kChunk);
  at::parallel_for(0, p.rows * chunks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t row = task / chunks;
      const int64_t start = (task % chunks) * kChunk;
      const int64_t stop = std::min(p.n, start + kChunk);
      const T* x = input + row * p.input_row_stride;
      T* y = out + row * p.out_row_stride;
      for (int64_t i = start; i < stop; ++i) {
        y[i] = static_cast<T>(alpha * static_cast<C>(x[i]));
      }
    }
  });
}

}  // namespace

void scale(DType dtype, const ScaleParams& params) {
  if (params.rows == 0 || params.n == 0) {
    return;
  }
  switch (dtype) {
    case DType::kFloat32:
      return scale_impl<float>(params);
    case DType::kFloat16:
      return scale_impl<c10::Half>(params);
    case DType::kBFloat16:
      return scale_impl<c10::BFloat16>(params);
    case DType::kFloat64:
      return scale_impl<double>(params);
    default:
      TORCH_CHECK(false, "scale: unsupported DType value ", static_cast<int>(dtype));
  }
}

}  // namespace cpu
}  // namespace newkernel
