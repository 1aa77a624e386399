// w4a16_probe.cu: the int4 GEMM's kernels alone, without torch: a check against a float64 host
// product and CUDA-graph timings, for A/B runs of kernel variants in one GPU call.
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//     -Iquant/kernel_src quant/benchmarks/probe/w4a16_probe.cu quant/kernel_src/w4a16_cuda.cu \
//     -o /tmp/w4a16_probe && /tmp/w4a16_probe [K N M [gated] [zeros]] ...
//
// Without arguments it runs the decode shapes of int4_sweep.py at M = 1, 4, 16, symmetric and
// with zeros. Per case it prints the time of one call (the mean of graph replays over weight
// copies that together exceed twice the L2, as int4_sweep.py times them), the weight bytes over
// that time, and the largest error against the float64 product in units of its bound (the bound
// of quant/tests/test_quant_int4_ops.py: float32 accumulation plus one rounding to bf16; a
// figure above 1 fails the case). bf16 activations, scales and output; group size 128.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "w4a16_cuda.h"
#include "w4a16_layout.h"

#define CHECK(call)                                                                                \
  do {                                                                                             \
    const cudaError_t err_ = (call);                                                               \
    if (err_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

namespace {

constexpr int64_t kGroup = 128;
constexpr int kCheckedColumns = 192;  // columns compared with the host product per case

struct Case {
  int64_t k, n, m;
  bool gated, zeros;
};

uint16_t bf16_bits(float x) {
  const __nv_bfloat16 b = __float2bfloat16_rn(x);
  uint16_t bits;
  std::memcpy(&bits, &b, 2);
  return bits;
}

float bf16_value(uint16_t bits) {
  uint32_t w = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}

double activate_host(double x) { return x / (1.0 + std::exp(-x)); }  // silu (the gated form)

void run_case(const Case& cs, int sm_count, size_t l2_bytes, double copy_gbs) {
  std::mt19937 rng(static_cast<unsigned>(cs.k * 131 + cs.n * 7 + cs.m));
  std::uniform_int_distribution<int> code(0, 15);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  const int64_t groups = cs.k / kGroup;

  std::vector<uint8_t> codes(cs.k * cs.n);
  for (auto& q : codes) q = static_cast<uint8_t>(code(rng));
  std::vector<uint32_t> packed(cs.k / quant::w4::kTileK * quant::w4::packed_row_words(cs.n), 0u);
  for (int64_t k = 0; k < cs.k; ++k) {
    for (int64_t n = 0; n < cs.n; ++n) {
      const auto pos = quant::w4::position_of(k, n, cs.n);
      packed[pos.word] |= static_cast<uint32_t>(codes[k * cs.n + n]) << (4 * pos.nibble);
    }
  }
  std::vector<uint16_t> scales(groups * cs.n), zeros(groups * cs.n), a(cs.m * cs.k);
  for (auto& s : scales) s = bf16_bits(unit(rng) * 0.01f + 1e-3f);
  for (auto& z : zeros) z = bf16_bits(static_cast<float>(code(rng)));
  for (auto& x : a) x = bf16_bits(normal(rng));

  const size_t weight_bytes = packed.size() * 4;
  const size_t read_bytes = weight_bytes + scales.size() * 2 * (cs.zeros ? 2 : 1);
  const int copies = static_cast<int>(2 * l2_bytes / weight_bytes + 2);
  std::vector<void*> d_b(copies);
  for (auto& ptr : d_b) {
    CHECK(cudaMalloc(&ptr, weight_bytes));
    CHECK(cudaMemcpy(ptr, packed.data(), weight_bytes, cudaMemcpyHostToDevice));
  }
  void *d_scales, *d_zeros, *d_a, *d_d;
  const int64_t out_cols = cs.gated ? cs.n / 2 : cs.n;
  CHECK(cudaMalloc(&d_scales, scales.size() * 2));
  CHECK(cudaMalloc(&d_zeros, zeros.size() * 2));
  CHECK(cudaMalloc(&d_a, a.size() * 2));
  CHECK(cudaMalloc(&d_d, cs.m * out_cols * 2));
  CHECK(cudaMemcpy(d_scales, scales.data(), scales.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_zeros, zeros.data(), zeros.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_a, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(d_d, 0xFF, cs.m * out_cols * 2));  // poison: NaN in bf16

  quant::W4A16GemmParams p{};
  p.dtype = quant::DType::kBFloat16;
  p.a = d_a;
  p.b = static_cast<const int32_t*>(d_b[0]);
  p.scales = d_scales;
  p.zeros = cs.zeros ? d_zeros : nullptr;
  p.perm = nullptr;
  p.bias = nullptr;
  p.d = d_d;
  p.m = cs.m;
  p.n = cs.n;
  p.k = cs.k;
  p.group_size = kGroup;
  p.lda = cs.k;
  p.ldd = out_cols;
  p.activation = cs.gated ? quant::Activation::kSilu : quant::Activation::kNone;
  p.gated = cs.gated;
  const quant::cuda::W4A16Plan plan = quant::cuda::w4a16_plan(p, sm_count);
  void* workspace = nullptr;
  if (plan.workspace_bytes > 0) CHECK(cudaMalloc(&workspace, plan.workspace_bytes));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  CHECK(quant::cuda::w4a16_gemm(p, plan, workspace, stream));
  CHECK(cudaStreamSynchronize(stream));

  // Check sampled output columns against the float64 product of the dequantized weight.
  std::vector<uint16_t> d(cs.m * out_cols);
  CHECK(cudaMemcpy(d.data(), d_d, d.size() * 2, cudaMemcpyDeviceToHost));
  double worst = 0.0;
  std::uniform_int_distribution<int64_t> column(0, out_cols - 1);
  auto sum_of = [&](int64_t m, int64_t n, double* abs_sum) {
    double s = 0.0, as = 0.0;
    for (int64_t k = 0; k < cs.k; ++k) {
      const int64_t at = (k / kGroup) * cs.n + n;
      const double z = cs.zeros ? bf16_value(zeros[at]) : 8.0;
      const double w = (codes[k * cs.n + n] - z) * bf16_value(scales[at]);
      const double x = bf16_value(a[m * cs.k + k]);
      s += x * w;
      as += std::fabs(x * w);
    }
    *abs_sum = as;
    return s;
  };
  for (int i = 0; i < kCheckedColumns; ++i) {
    const int64_t j = column(rng);
    for (int64_t m = 0; m < cs.m; ++m) {
      double ref, bound, as;
      if (cs.gated) {
        const int64_t gate_col = (j / 64) * 128 + j % 64;
        double ag, au;
        const double gs = sum_of(m, gate_col, &ag), us = sum_of(m, gate_col + 64, &au);
        ref = activate_host(gs) * us;
        as = 1.13 * ag * std::fabs(us) + std::fabs(activate_host(gs)) * au;
      } else {
        ref = sum_of(m, j, &as);
      }
      bound = cs.k * std::ldexp(1.0, -24) * as + std::ldexp(1.0, -8) * std::fabs(ref) +
              std::ldexp(1.0, -24) * 8;
      const double got = bf16_value(d[m * out_cols + j]);
      const double ratio = std::isfinite(got) ? std::fabs(got - ref) / bound : INFINITY;
      if (ratio > worst) worst = ratio;
    }
  }

  // Time: one graph of `reps` calls, each on the next weight copy.
  const int reps = 20 * copies;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int r = 0; r < reps; ++r) {
    p.b = static_cast<const int32_t*>(d_b[r % copies]);
    CHECK(quant::cuda::w4a16_gemm(p, plan, workspace, stream));
  }
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, stream));  // warm-up
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  float best = 1e30f;
  for (int trial = 0; trial < 5; ++trial) {
    CHECK(cudaEventRecord(start, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (ms < best) best = ms;
  }
  const double us = best * 1e3 / reps;
  const double gbs = read_bytes / us * 1e-3;
  std::printf(
      "K %6lld N %6lld M %3lld %-5s %-5s splits %2d  %8.2f us  %7.0f GB/s  %5.1f%% of copy"
      "  err/bound %.3f %s\n",
      static_cast<long long>(cs.k), static_cast<long long>(cs.n), static_cast<long long>(cs.m),
      cs.gated ? "gated" : "plain", cs.zeros ? "awq" : "gptq", plan.splits, us, gbs,
      100.0 * gbs / copy_gbs, worst, worst <= 1.0 ? "ok" : "FAIL");
  std::fflush(stdout);

  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(stream));
  for (void* ptr : d_b) CHECK(cudaFree(ptr));
  for (void* ptr : {d_scales, d_zeros, d_a, d_d}) CHECK(cudaFree(ptr));
  if (workspace != nullptr) CHECK(cudaFree(workspace));
}

// Device-to-device copy bandwidth of a 1 GiB buffer (read + write bytes over time).
double copy_gbs() {
  const size_t bytes = size_t{1} << 30;
  void *src, *dst;
  CHECK(cudaMalloc(&src, bytes));
  CHECK(cudaMalloc(&dst, bytes));
  CHECK(cudaMemset(src, 1, bytes));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  float best = 1e30f;
  for (int i = 0; i < 6; ++i) {
    CHECK(cudaEventRecord(start));
    CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i > 0 && ms < best) best = ms;
  }
  CHECK(cudaFree(src));
  CHECK(cudaFree(dst));
  return 2.0 * bytes / (best * 1e-3) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const double copy = copy_gbs();
  std::printf("%s, %d SMs, L2 %d MB, copy %.0f GB/s\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20, copy);
  std::vector<Case> cases;
  if (argc > 1) {
    for (int i = 1; i + 2 < argc;) {
      Case cs{std::atoll(argv[i]), std::atoll(argv[i + 1]), std::atoll(argv[i + 2]), false, false};
      i += 3;
      for (; i < argc && !std::isdigit(static_cast<unsigned char>(argv[i][0])); ++i) {
        cs.gated |= std::string(argv[i]) == "gated";
        cs.zeros |= std::string(argv[i]) == "zeros";
      }
      cases.push_back(cs);
    }
  } else {
    const int64_t shapes[][2] = {
        {4096, 28672}, {14336, 4096}, {4096, 6144}, {4096, 4096}, {8192, 8192}};
    for (const auto& kn : shapes) {
      for (int64_t m : {1, 4, 16}) cases.push_back({kn[0], kn[1], m, false, false});
      cases.push_back({kn[0], kn[1], 1, false, true});
    }
    cases.push_back({4096, 28672, 1, true, false});
    cases.push_back({4096, 28672, 16, true, true});
  }
  for (const Case& cs : cases) {
    run_case(cs, prop.multiProcessorCount, static_cast<size_t>(prop.l2CacheSize), copy);
  }
  return 0;
}
