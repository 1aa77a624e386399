// w4a16_cpu.cpp: the int4 weight-only ops on the CPU (w4a16_cpu.h), the formulas of
// w4a16_params.h evaluated directly: the reference CPU users and CI run.
//
// The GEMM dequantizes one 64-column panel of the weight (K x 64, float32) per task of
// at::parallel_for, each weight (q - z) * s exact in float32, then accumulates every row of A
// against it in float32 and rounds once.
#include "w4a16_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <vector>

#include "quant_math.h"
#include "w4a16_layout.h"

namespace quant {
namespace cpu {
namespace {

template <typename T>
float load(const void* base, int64_t i) {
  return static_cast<float>(static_cast<const T*>(base)[i]);
}

// Float32 sums of every row of `a` (M x K, A's columns in packed order) against the weight's
// 64-column panel `panel`, into acc[m * 64 + j] (bias not added). w: K x 64 scratch.
template <typename T>
void panel_sums(const W4A16GemmParams& p, const std::vector<float>& a, int64_t panel,
                std::vector<float>& w, std::vector<float>& acc) {
  const int64_t M = p.m, N = p.n, K = p.k;
  constexpr int64_t kPanel = w4::kTileN;
  const auto* words = reinterpret_cast<const uint32_t*>(p.b);
  const int64_t n0 = panel * kPanel;
  for (int64_t k = 0; k < K; ++k) {
    const int64_t g = k / p.group_size;
    for (int64_t j = 0; j < kPanel; ++j) {
      const int64_t n = n0 + j;
      const w4::NibblePos pos = w4::position_of(k, n, N);
      const int q = static_cast<int>((words[pos.word] >> (4 * pos.nibble)) & 0xFu);
      const float z =
          p.zeros != nullptr ? load<T>(p.zeros, g * N + n) : static_cast<float>(w4::kZeroPoint);
      // (q - z) * s is exact in float32 (w4a16_params.h).
      w[k * kPanel + j] = (static_cast<float>(q) - z) * load<T>(p.scales, g * N + n);
    }
  }
  for (int64_t m = 0; m < M; ++m) {
    float* out = acc.data() + m * kPanel;
    for (int64_t j = 0; j < kPanel; ++j) out[j] = 0.0f;
    const float* row = a.data() + m * K;
    for (int64_t k = 0; k < K; ++k) {
      const float x = row[k];
      const float* wk = w.data() + k * kPanel;
      for (int64_t j = 0; j < kPanel; ++j) out[j] += x * wk[j];
    }
  }
}

template <typename T>
void gemm(const W4A16GemmParams& p) {
  const int64_t M = p.m, K = p.k;
  // A as float32, its columns in the packed weight's row order.
  std::vector<float> a(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) {
      a[m * K + k] = load<T>(p.a, m * p.lda + (p.perm != nullptr ? p.perm[k] : k));
    }
  }
  constexpr int64_t kPanel = w4::kTileN;
  const int64_t out_panels = p.n / kPanel / (p.gated ? 2 : 1);
  const auto bias = [&](int64_t n) { return p.bias != nullptr ? load<T>(p.bias, n) : 0.0f; };
  at::parallel_for(0, out_panels, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> w(static_cast<size_t>(K * kPanel));
    std::vector<float> first(static_cast<size_t>(M * kPanel)), second;
    if (p.gated) second.resize(first.size());
    for (int64_t panel = begin; panel < end; ++panel) {
      // gated: the gate panel 2 panel and the up panel 2 panel + 1 of the weight.
      const int64_t n0 = (p.gated ? 2 * panel : panel) * kPanel;
      panel_sums<T>(p, a, n0 / kPanel, w, first);
      if (p.gated) panel_sums<T>(p, a, n0 / kPanel + 1, w, second);
      for (int64_t m = 0; m < M; ++m) {
        T* d = static_cast<T*>(p.d) + m * p.ldd + panel * kPanel;
        for (int64_t j = 0; j < kPanel; ++j) {
          const float s = first[m * kPanel + j] + bias(n0 + j);
          const float v = p.gated ? math::activate(p.activation, s) *
                                        (second[m * kPanel + j] + bias(n0 + kPanel + j))
                                  : math::activate(p.activation, s);
          d[j] = static_cast<T>(v);
        }
      }
    }
  });
}

}  // namespace

void w4_pack(const W4PackParams& p) {
  auto* words = reinterpret_cast<uint32_t*>(p.packed);
  const int64_t row_words = w4::packed_row_words(p.n);
  // Row tiles of 16 k own disjoint words.
  at::parallel_for(0, p.k / w4::kTileK, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * row_words; i < end * row_words; ++i) words[i] = 0;
    for (int64_t k = begin * w4::kTileK; k < end * w4::kTileK; ++k) {
      for (int64_t n = 0; n < p.n; ++n) {
        const w4::NibblePos pos = w4::position_of(k, n, p.n);
        words[pos.word] |= (static_cast<uint32_t>(p.codes[k * p.ld + n]) & 0xFu)
                           << (4 * pos.nibble);
      }
    }
  });
}

void w4_unpack(const W4PackParams& p) {
  const auto* words = reinterpret_cast<const uint32_t*>(p.packed);
  uint8_t* codes = p.codes;
  at::parallel_for(0, p.k, 16, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      for (int64_t n = 0; n < p.n; ++n) {
        const w4::NibblePos pos = w4::position_of(k, n, p.n);
        codes[k * p.ld + n] = static_cast<uint8_t>((words[pos.word] >> (4 * pos.nibble)) & 0xFu);
      }
    }
  });
}

void w4a16_gemm(const W4A16GemmParams& p) {
  if (p.m == 0 || p.n == 0) return;
  if (p.dtype == DType::kBFloat16) {
    gemm<c10::BFloat16>(p);
  } else {
    gemm<c10::Half>(p);
  }
}

}  // namespace cpu
}  // namespace quant
