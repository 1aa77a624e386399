// scaled_mm_sm90.cu: picks the Hopper kernel instance of a call (scaled_mm_sm90_instances.h):
// operand and output type, the tile configuration of its M bucket, the zero-point form.
#include "scaled_mm_sm90.h"

#include <type_traits>

#include "scaled_mm_sm90_instances.h"

namespace quant {
namespace cuda {
namespace sm90 {
namespace {

template <class T>
struct Tag {
  using type = T;
};

// Calls f(TypeTag<ElementAB>, TypeTag<ElementD>, TypeTag<Config>, bool_constant<kAzp>) for the
// instance that serves p. The buckets are where the measured best configuration changes
// (benchmarks/NOTES.md).
template <class Fn>
auto with_instance(const ScaledMmParams& p, Fn&& f) {
  const bool azp = p.azp_adj != nullptr;
  auto by_output = [&](auto ab, auto config, auto has_azp) {
    if (p.out_dtype == DType::kBFloat16) return f(ab, Tag<cutlass::bfloat16_t>{}, config, has_azp);
    return f(ab, Tag<cutlass::half_t>{}, config, has_azp);
  };
  auto by_config = [&](auto ab) {
    if (azp) {
      if (p.m <= 64) return by_output(ab, Tag<ConfigM64>{}, std::true_type{});
      return by_output(ab, Tag<ConfigM2K>{}, std::true_type{});
    }
    if (p.m <= 16) return by_output(ab, Tag<ConfigM16>{}, std::false_type{});
    if (p.m <= 64) return by_output(ab, Tag<ConfigM64>{}, std::false_type{});
    if (p.m <= 128) return by_output(ab, Tag<ConfigM128>{}, std::false_type{});
    if (p.m < 2048) return by_output(ab, Tag<ConfigM2K>{}, std::false_type{});
    return by_output(ab, Tag<ConfigLarge>{}, std::false_type{});
  };
  if (p.operand == GemmOperand::kInt8) return by_config(Tag<int8_t>{});
  return by_config(Tag<cutlass::float_e4m3_t>{});
}

}  // namespace

size_t workspace_size(const ScaledMmParams& p, int sm_count) {
  return with_instance(p, [&](auto ab, auto out, auto config, auto azp) -> size_t {
    using AB = typename decltype(ab)::type;
    using Out = typename decltype(out)::type;
    using Config = typename decltype(config)::type;
    if constexpr (decltype(azp)::value && !std::is_same_v<AB, int8_t>) {
      return 0;  // fp8 has no zero-point form (torch-ext/ rejects it)
    } else {
      return ScaledInstance<AB, Out, Config, decltype(azp)::value>::workspace_size(p, sm_count);
    }
  });
}

cudaError_t scaled_mm(const ScaledMmParams& p, void* workspace, int sm_count, cudaStream_t stream) {
  if (p.m == 0) return cudaSuccess;
  return with_instance(p, [&](auto ab, auto out, auto config, auto azp) -> cudaError_t {
    using AB = typename decltype(ab)::type;
    using Out = typename decltype(out)::type;
    using Config = typename decltype(config)::type;
    if constexpr (decltype(azp)::value && !std::is_same_v<AB, int8_t>) {
      return cudaErrorInvalidValue;
    } else {
      return ScaledInstance<AB, Out, Config, decltype(azp)::value>::run(p, workspace, sm_count,
                                                                        stream);
    }
  });
}

size_t block_workspace_size(const BlockScaledMmParams& p, int sm_count) {
  if (p.out_dtype == DType::kBFloat16) {
    return BlockInstance<cutlass::bfloat16_t, ConfigBlock>::workspace_size(p, sm_count);
  }
  return BlockInstance<cutlass::half_t, ConfigBlock>::workspace_size(p, sm_count);
}

cudaError_t block_scaled_mm(const BlockScaledMmParams& p, void* workspace, int sm_count,
                            cudaStream_t stream) {
  if (p.m == 0) return cudaSuccess;
  if (p.out_dtype == DType::kBFloat16) {
    return BlockInstance<cutlass::bfloat16_t, ConfigBlock>::run(p, workspace, sm_count, stream);
  }
  return BlockInstance<cutlass::half_t, ConfigBlock>::run(p, workspace, sm_count, stream);
}

}  // namespace sm90
}  // namespace cuda
}  // namespace quant
