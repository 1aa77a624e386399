// scaled_mm_sm90.cu: picks the Hopper kernel instance of a call (scaled_mm_sm90_instances.h):
// operand and output type, the tile configuration of its M bucket, the zero-point form.
#include "scaled_mm_sm90.h"

#include <type_traits>

#include "scaled_mm_sm90_gate.h"
#include "scaled_mm_sm90_instances.h"

namespace quant {
namespace cuda {
namespace sm90 {
namespace {

template <class T>
struct Tag {
  using type = T;
};

template <class T>
constexpr bool kSixteenBit = std::is_same_v<T, Bf16> || std::is_same_v<T, Fp16>;

// The share of the last wave's SMs that have a tile, for `tiles` tiles on `sm_count` SMs.
double last_wave_fill(int64_t tiles, int sm_count) {
  const int64_t waves = (tiles + sm_count - 1) / sm_count;
  return waves == 0 ? 1.0 : double(tiles) / double(waves * sm_count);
}

enum class LargeMTile { kSquare, kWide, kNarrow };

// fp8 at M > 128: 128 x 128 tiles unless they leave over a fifth of the SMs idle and 128 x 192
// (kWide) or 64 x 128 tiles (kNarrow) fill the waves clearly better; the wider tile on a tie
// (H200: benchmarks/NOTES.md).
LargeMTile large_m_tile(const ScaledMmParams& p, int sm_count) {
  const int64_t row_tiles = (p.m + 127) / 128;
  const double square = last_wave_fill(row_tiles * ((p.n + 127) / 128), sm_count);
  if (square >= 0.8) return LargeMTile::kSquare;
  const double wide = last_wave_fill(row_tiles * ((p.n + 191) / 192), sm_count);
  const double narrow = last_wave_fill(((p.m + 63) / 64) * ((p.n + 127) / 128), sm_count);
  if (wide >= narrow && wide > square + 0.1) return LargeMTile::kWide;
  if (narrow > square + 0.1) return LargeMTile::kNarrow;
  return LargeMTile::kSquare;
}

// Calls f(Tag<ElementAB>, Tag<ElementD>, Tag<Config>, bool_constant<kAzp>) for the instance that
// serves p (scaled_mm_sm90_instances.h lists them). The M buckets are where the measured best
// configuration changes (benchmarks/NOTES.md). 16-bit operands have only the gated form (the
// callers below refuse their plain form first), the gated form no zero points.
template <class Fn>
auto with_instance(const ScaledMmParams& p, int sm_count, Fn&& f) {
  auto by_config = [&](auto ab, auto out) {
    using AB = typename decltype(ab)::type;
    auto gated = [&] {
      if (p.m <= 128) return f(ab, out, Tag<ConfigGatedM128<AB>>{}, std::false_type{});
      return f(ab, out, Tag<ConfigGated<AB>>{}, std::false_type{});
    };
    if constexpr (kSixteenBit<AB>) {
      return gated();
    } else {
      if (p.gated) return gated();
      if constexpr (std::is_same_v<AB, int8_t>) {
        if (p.azp_adj != nullptr) {
          if (p.m <= 64) return f(ab, out, Tag<ConfigM64<AB>>{}, std::true_type{});
          return f(ab, out, Tag<ConfigM2K<AB>>{}, std::true_type{});
        }
      }
      if (p.m <= 16) return f(ab, out, Tag<ConfigM16<AB>>{}, std::false_type{});
      if (p.m <= 64) return f(ab, out, Tag<ConfigM64<AB>>{}, std::false_type{});
      if (p.m <= 128) {
        if constexpr (std::is_same_v<AB, Fp8>) {
          // 64 x 128 tiles that would cover at most half the SMs: half-width ones instead.
          const int64_t tiles = ((p.m + 63) / 64) * ((p.n + 127) / 128);
          if (2 * tiles <= sm_count) {
            return f(ab, out, Tag<ConfigM128Narrow<AB>>{}, std::false_type{});
          }
        }
        return f(ab, out, Tag<ConfigM128<AB>>{}, std::false_type{});
      }
      if constexpr (std::is_same_v<AB, Fp8>) {
        switch (large_m_tile(p, sm_count)) {
          case LargeMTile::kWide:
            return f(ab, out, Tag<ConfigM2KWide<AB>>{}, std::false_type{});
          case LargeMTile::kNarrow:
            return f(ab, out, Tag<ConfigM128<AB>>{}, std::false_type{});
          default:
            break;
        }
      } else {  // int8
        if (p.m >= 2048) return f(ab, out, Tag<ConfigLarge<AB>>{}, std::false_type{});
      }
      return f(ab, out, Tag<ConfigM2K<AB>>{}, std::false_type{});
    }
  };
  // Quantized operands write bf16 or fp16; 16-bit ones their own type.
  auto by_output = [&](auto ab) {
    if (p.out_dtype == DType::kBFloat16) return by_config(ab, Tag<Bf16>{});
    return by_config(ab, Tag<Fp16>{});
  };
  switch (p.operand) {
    case GemmOperand::kInt8:
      return by_output(Tag<int8_t>{});
    case GemmOperand::kBFloat16:
      return by_config(Tag<Bf16>{}, Tag<Bf16>{});
    case GemmOperand::kFloat16:
      return by_config(Tag<Fp16>{}, Tag<Fp16>{});
    default:
      return by_output(Tag<Fp8>{});
  }
}

// The plain (not gated) form of 16-bit operands, linear_act, is not built: its first H200 run
// gave wrong results, so it runs unfused on CUDA (benchmarks/NOTES.md).
bool unsupported(const ScaledMmParams& p) { return !p.gated && is_sixteen_bit(p.operand); }

// The quantized gated form at M <= 64 runs as a pair: the [M, 2N] product over the packed weight
// on the swapped decode tiles, into the workspace, then the gate pass (scaled_mm_sm90_gate.h). The
// gated kernel's 64-row tiles, mostly empty rows at decode sizes, took 1.7x as long (H200,
// benchmarks/NOTES.md).
bool gated_as_pair(const ScaledMmParams& p) {
  return p.gated && !is_sixteen_bit(p.operand) && p.m <= 64;
}

// The packed product's bytes, rounded up to 256 (the GEMM's own workspace follows).
size_t pair_product_bytes(const ScaledMmParams& p) {
  const size_t bytes = size_t(p.m) * size_t(2 * p.n) * 2;  // bf16 / fp16
  return (bytes + 255) / 256 * 256;
}

// The plain GEMM of the pair, writing y [M, 2N] (row stride 2N).
ScaledMmParams pair_product(const ScaledMmParams& p, void* y) {
  ScaledMmParams q = p;
  q.gated = false;
  q.n = 2 * p.n;
  q.d = y;
  q.ldd = 2 * p.n;
  q.activation = Activation::kNone;
  return q;
}

size_t plain_workspace_size(const ScaledMmParams& p, int sm_count) {
  if (unsupported(p)) return 0;
  return with_instance(p, sm_count, [&](auto ab, auto out, auto config, auto azp) -> size_t {
    using AB = typename decltype(ab)::type;
    using Out = typename decltype(out)::type;
    using Config = typename decltype(config)::type;
    if constexpr (std::is_base_of_v<GatedConfig, Config>) {
      return GatedInstance<AB, Out, Config>::workspace_size(p, sm_count);
    } else {
      return ScaledInstance<AB, Out, Config, decltype(azp)::value>::workspace_size(p, sm_count);
    }
  });
}

cudaError_t plain_scaled_mm(const ScaledMmParams& p, void* workspace, int sm_count,
                            cudaStream_t stream) {
  if (unsupported(p)) return cudaErrorNotSupported;
  if (p.m == 0) return cudaSuccess;
  return with_instance(p, sm_count, [&](auto ab, auto out, auto config, auto azp) -> cudaError_t {
    using AB = typename decltype(ab)::type;
    using Out = typename decltype(out)::type;
    using Config = typename decltype(config)::type;
    if constexpr (std::is_base_of_v<GatedConfig, Config>) {
      return GatedInstance<AB, Out, Config>::run(p, workspace, sm_count, stream);
    } else {
      return ScaledInstance<AB, Out, Config, decltype(azp)::value>::run(p, workspace, sm_count,
                                                                        stream);
    }
  });
}

}  // namespace

size_t workspace_size(const ScaledMmParams& p, int sm_count) {
  if (gated_as_pair(p)) {
    return pair_product_bytes(p) + plain_workspace_size(pair_product(p, nullptr), sm_count);
  }
  return plain_workspace_size(p, sm_count);
}

cudaError_t scaled_mm(const ScaledMmParams& p, void* workspace, int sm_count, cudaStream_t stream) {
  if (gated_as_pair(p) && p.m > 0) {
    void* y = workspace;
    void* gemm_workspace = static_cast<char*>(workspace) + pair_product_bytes(p);
    const cudaError_t err = plain_scaled_mm(pair_product(p, y), gemm_workspace, sm_count, stream);
    if (err != cudaSuccess) return err;
    return gate_packed_product(p, y, 2 * p.n, stream);
  }
  return plain_scaled_mm(p, workspace, sm_count, stream);
}

size_t block_workspace_size(const BlockScaledMmParams& p, int sm_count) {
  if (p.out_dtype == DType::kBFloat16) {
    return BlockInstance<Bf16, ConfigBlock<Fp8>>::workspace_size(p, sm_count);
  }
  return BlockInstance<Fp16, ConfigBlock<Fp8>>::workspace_size(p, sm_count);
}

cudaError_t block_scaled_mm(const BlockScaledMmParams& p, void* workspace, int sm_count,
                            cudaStream_t stream) {
  if (p.m == 0) return cudaSuccess;
  if (p.out_dtype == DType::kBFloat16) {
    return BlockInstance<Bf16, ConfigBlock<Fp8>>::run(p, workspace, sm_count, stream);
  }
  return BlockInstance<Fp16, ConfigBlock<Fp8>>::run(p, workspace, sm_count, stream);
}

}  // namespace sm90
}  // namespace cuda
}  // namespace quant
