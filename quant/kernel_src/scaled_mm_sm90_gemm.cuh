// scaled_mm_sm90_gemm.cuh: the Hopper (sm_90a) scaled GEMMs, built from CUTLASS 3.x collectives.
//
// One template, Sm90ScaledGemm<Operand, Out, Config, kAzp>, makes a warp-specialized wgmma + TMA
// kernel whose epilogue (an epilogue visitor tree) computes ScaledMmParams' formula:
//   D = act(scale_b * (scale_a * (acc - zp)) + bias)
// The scale vectors use CUTLASS's dynamic broadcast: a `bool` stride tells at run time whether a
// scale is a vector or one value, so per-tensor and per-token/channel share one kernel. The
// activation is a run-time argument too. What stays compile-time: operand, output type, tile
// configuration (scaled_mm_sm90_configs.cuh), and the zero-point terms (int8 azp only).
//
// Swap-AB configurations (small M) compute D^T = B^T A^T: the weight fills the 64-row wgmma tile
// and the few tokens become the narrow N tile, so no tensor-core work is spent on padding rows.
// A and B are K-major either way; only D's layout and which scale broadcasts along which mode
// change.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "scaled_mm_params.h"
#include "scaled_mm_sm90_activation.cuh"
#include "scaled_mm_sm90_instances.h"

namespace quant {
namespace cuda {
namespace sm90 {

using namespace cute;

// The epilogue's activation, chosen at run time (scaled_mm_sm90_activation.cuh). Sm90Compute
// hands a functor's `Arguments` to its call operator; both the scalar and the fragment form take
// the same arguments type.
struct ActivationArgs {
  int kind = static_cast<int>(Activation::kNone);
};

template <class T>
struct RuntimeActivation {
  using Arguments = ActivationArgs;
  CUTLASS_DEVICE T operator()(T const& x, Arguments const& args) const {
    float y = float(x);
    with_activation(static_cast<Activation>(args.kind), [&](auto kind) { y = activate(kind, y); });
    return T(y);
  }
};

template <class T, int N>
struct RuntimeActivation<cutlass::Array<T, N>> {
  using Arguments = ActivationArgs;
  CUTLASS_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& x,
                                                 Arguments const& args) const {
    cutlass::Array<T, N> y;
    with_activation(static_cast<Activation>(args.kind), [&](auto kind) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < N; ++i) y[i] = T(activate(kind, float(x[i])));
    });
    return y;
  }
};

// The element types of one operand family.
template <class ElementAB_>
struct OperandTraits;
template <>
struct OperandTraits<cutlass::float_e4m3_t> {
  using ElementAB = cutlass::float_e4m3_t;
  using ElementAcc = float;
};
template <>
struct OperandTraits<int8_t> {
  using ElementAB = int8_t;
  using ElementAcc = int32_t;
};
template <>
struct OperandTraits<cutlass::bfloat16_t> {
  using ElementAB = cutlass::bfloat16_t;
  using ElementAcc = float;
};
template <>
struct OperandTraits<cutlass::half_t> {
  using ElementAB = cutlass::half_t;
  using ElementAcc = float;
};

// The epilogue visitor tree. "Token" vectors vary along the activations' rows (M), "channel"
// vectors along the weight's rows (N); which GEMM mode that is depends on kSwapAB.
template <class TileShape, class ElementD, bool kSwapAB, bool kAzp>
struct ScaledEpilogue {
  template <class Element, bool kVector>
  using Along = cute::conditional_t<kVector,
                                    cutlass::epilogue::fusion::Sm90ColBroadcast<
                                        0, TileShape, Element, Element, Stride<bool, _0, int64_t>>,
                                    cutlass::epilogue::fusion::Sm90RowBroadcast<
                                        0, TileShape, Element, Element, Stride<_0, bool, int64_t>>>;
  // Per-token values vary along GEMM mode M, i.e. down a column, unless A and B are swapped.
  template <class Element>
  using TokenVector = Along<Element, !kSwapAB>;
  template <class Element>
  using ChannelVector = Along<Element, kSwapAB>;
  using Bias = ChannelVector<ElementD>;

  using Acc = cutlass::epilogue::fusion::Sm90AccFetch;
  // acc - zp, in exact int32: zp = azp[m] * azp_adj[n] (a null azp reads as 1: per tensor).
  using ZeroPoint = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, int32_t, int32_t,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      TokenVector<int32_t>, ChannelVector<int32_t>>;
  using Centered = cute::conditional_t<
      kAzp,
      cutlass::epilogue::fusion::Sm90EVT<
          cutlass::epilogue::fusion::Sm90Compute<cutlass::minus, int32_t, int32_t,
                                                 cutlass::FloatRoundStyle::round_to_nearest>,
          Acc, ZeroPoint>,
      Acc>;
  using TokenScaled = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      TokenVector<float>, Centered>;
  using Affine = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiply_add, float, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      ChannelVector<float>, TokenScaled, Bias>;
  using Tree = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<RuntimeActivation, ElementD, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      Affine>;

  static typename Tree::Arguments arguments(const ScaledMmParams& p) {
    using TokenF = TokenVector<float>;
    using ChannelF = ChannelVector<float>;
    typename TokenF::Arguments scale_a = make_vector<TokenF>(p.scale_a, p.scale_a_per_row, 0.f);
    typename ChannelF::Arguments scale_b = make_vector<ChannelF>(p.scale_b, p.scale_b_per_col, 0.f);
    typename Bias::Arguments bias =
        make_vector<Bias>(static_cast<const ElementD*>(p.bias), p.bias != nullptr, ElementD(0));
    typename Centered::Arguments centered = centered_args(p);
    return {{scale_b, {scale_a, centered, {}}, bias, {}},
            ActivationArgs{static_cast<int>(p.activation)}};
  }

 private:
  // A broadcast's arguments: `ptr` read as a vector (stride 1) or as one value (stride 0); a null
  // pointer reads as `null_default` everywhere.
  template <class Vector, class Element>
  static typename Vector::Arguments make_vector(const Element* ptr, bool is_vector,
                                                Element null_default) {
    typename Vector::Arguments args{};
    if constexpr (kVectorIsColumn<Vector>()) {
      args.ptr_col = ptr;
      args.dCol = typename Vector::StrideMNL{is_vector, _0{}, int64_t(0)};
    } else {
      args.ptr_row = ptr;
      args.dRow = typename Vector::StrideMNL{_0{}, is_vector, int64_t(0)};
    }
    args.null_default = null_default;
    return args;
  }

  template <class Vector>
  static constexpr bool kVectorIsColumn() {
    return cute::is_same_v<typename Vector::StrideMNL, Stride<bool, _0, int64_t>>;
  }

  static typename Centered::Arguments centered_args(const ScaledMmParams& p) {
    if constexpr (kAzp) {
      using TokenI = TokenVector<int32_t>;
      using ChannelI = ChannelVector<int32_t>;
      // Without per-token zero points azp_adj already holds azp * colsum(B): read azp as 1.
      typename TokenI::Arguments azp = make_vector<TokenI>(p.azp, p.azp != nullptr, 1);
      typename ChannelI::Arguments adj = make_vector<ChannelI>(p.azp_adj, true, 0);
      return {{}, {azp, adj, {}}, {}};
    } else {
      return {};
    }
  }
};

// The mainloop of every kernel here: TMA loads of A [rows, K] and B [cols, K] (K-major, 16-byte
// aligned), wgmma on Config's tile, as many pipeline stages as the shared memory holds besides
// the epilogue's.
template <class Config, class ElementA, class LayoutA, class ElementB, class LayoutB,
          class ElementAcc, class CollectiveEpilogue>
using Sm90Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA,
    128 / cutlass::sizeof_bits<ElementA>::value, ElementB, LayoutB,
    128 / cutlass::sizeof_bits<ElementB>::value, ElementAcc, typename Config::TileShape,
    typename Config::ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename CollectiveEpilogue::SharedStorage))>,
    typename Config::KernelSchedule>::CollectiveOp;

// The device-level GEMM of a mainloop and an epilogue on Config's tile scheduler.
template <class Config, class CollectiveMainloop, class CollectiveEpilogue>
using Sm90DeviceGemm = cutlass::gemm::device::GemmUniversalAdapter<
    cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                         CollectiveEpilogue, typename Config::TileScheduler>>;

// Checks, initializes and launches one CUTLASS device GEMM; CUTLASS's statuses become
// cudaErrorInvalidValue (arguments it cannot run) or the launch error.
template <class Gemm>
cudaError_t run_gemm(const typename Gemm::Arguments& args, void* workspace, cudaStream_t stream) {
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) {
    return cudaErrorInvalidValue;
  }
  if (gemm.run(stream) != cutlass::Status::kSuccess) {
    const cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? cudaErrorLaunchFailure : err;
  }
  return cudaGetLastError();
}

// One kernel: operand family, output element, tile configuration, zero-point terms.
template <class ElementAB, class ElementD, class Config, bool kAzp>
struct Sm90ScaledGemm {
  using Traits = OperandTraits<ElementAB>;
  using ElementAcc = typename Traits::ElementAcc;
  using TileShape = typename Config::TileShape;
  using ClusterShape = typename Config::ClusterShape;
  static constexpr bool kSwapAB = Config::kSwapAB;

  // Both operands are K-major (A: activations [M, K] row-major; B: weight [N, K] row-major).
  // Swapped, the weight is the first operand and D is written transposed (column-major D^T).
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD =
      cute::conditional_t<kSwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;

  using Epilogue = ScaledEpilogue<TileShape, ElementD, kSwapAB, kAzp>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, void, LayoutD, kAlignD,
      ElementD, LayoutD, kAlignD, typename Config::EpilogueSchedule,
      typename Epilogue::Tree>::CollectiveOp;

  using CollectiveMainloop =
      Sm90Mainloop<Config, ElementAB, LayoutA, ElementAB, LayoutB, ElementAcc, CollectiveEpilogue>;
  using Gemm = Sm90DeviceGemm<Config, CollectiveMainloop, CollectiveEpilogue>;
  using Kernel = typename Gemm::GemmKernel;

  static typename Gemm::Arguments arguments(const ScaledMmParams& p, int sm_count) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    const auto* a = static_cast<const ElementAB*>(p.a);
    const auto* b = static_cast<const ElementAB*>(p.b);
    // GEMM modes (rows, cols, K): (M, N) or, swapped, (N, M) with the weight as operand A.
    const int rows = static_cast<int>(kSwapAB ? p.n : p.m);
    const int cols = static_cast<int>(kSwapAB ? p.m : p.n);
    const StrideA stride_first{kSwapAB ? p.ldb : p.lda, _1{}, int64_t(0)};
    const StrideB stride_second{kSwapAB ? p.lda : p.ldb, _1{}, int64_t(0)};
    StrideD stride_d{};
    if constexpr (kSwapAB) {
      stride_d = StrideD{_1{}, p.ldd, int64_t(0)};
    } else {
      stride_d = StrideD{p.ldd, _1{}, int64_t(0)};
    }
    cutlass::KernelHardwareInfo hw{};
    hw.sm_count = sm_count;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {rows, cols, static_cast<int>(p.k), 1},
        {kSwapAB ? b : a, stride_first, kSwapAB ? a : b, stride_second},
        {Epilogue::arguments(p), nullptr, stride_d, static_cast<ElementD*>(p.d), stride_d},
        hw};
    Config::tune(args.scheduler, p);
    return args;
  }

  static size_t workspace_size(const ScaledMmParams& p, int sm_count) {
    return Gemm::get_workspace_size(arguments(p, sm_count));
  }

  static cudaError_t run(const ScaledMmParams& p, void* workspace, int sm_count,
                         cudaStream_t stream) {
    return run_gemm<Gemm>(arguments(p, sm_count), workspace, stream);
  }
};

// Blockwise fp8 (BlockScaledMmParams): the mainloop applies the 1 x 128 activation scales and the
// 128 x 128 weight scales as it promotes each K block's partial sums; the epilogue adds the bias
// and applies the activation.
template <class ElementD, class Config>
struct Sm90BlockScaledGemm {
  using ElementAB = cutlass::float_e4m3_t;
  using TileShape = typename Config::TileShape;
  using ClusterShape = typename Config::ClusterShape;
  // Activation scales M-major ([K / 128, M]), weight scales K-major ([N / 128, K / 128]).
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::MN,
                                                                cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;

  using Bias = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, ElementD, ElementD,
                                                           Stride<_0, _1, int64_t>>;
  using Biased = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, float, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      cutlass::epilogue::fusion::Sm90AccFetch, Bias>;
  using Tree = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<RuntimeActivation, ElementD, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      Biased>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignD,
      ElementD, LayoutD, kAlignD, typename Config::EpilogueSchedule, Tree>::CollectiveOp;

  using CollectiveMainloop =
      Sm90Mainloop<Config, ElementAB, cute::tuple<cutlass::layout::RowMajor, LayoutSFA>, ElementAB,
                   cute::tuple<cutlass::layout::ColumnMajor, LayoutSFB>, float, CollectiveEpilogue>;
  using Gemm = Sm90DeviceGemm<Config, CollectiveMainloop, CollectiveEpilogue>;
  using Kernel = typename Gemm::GemmKernel;

  static typename Gemm::Arguments arguments(const BlockScaledMmParams& p, int sm_count) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
    // The activation scales' K-block rows are scale_a_ld apart (16-byte aligned for their TMA
    // loads); the rows past M are never used.
    const int sfa_rows = static_cast<int>(p.scale_a_ld);
    const StrideD stride_d{p.ldd, _1{}, int64_t(0)};
    typename Bias::Arguments bias{};
    bias.ptr_row = static_cast<const ElementD*>(p.bias);  // null reads as 0
    cutlass::KernelHardwareInfo hw{};
    hw.sm_count = sm_count;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {static_cast<const ElementAB*>(p.a), StrideA{p.lda, _1{}, int64_t(0)},
         static_cast<const ElementAB*>(p.b), StrideB{p.ldb, _1{}, int64_t(0)}, p.scale_a,
         ScaleConfig::tile_atom_to_shape_SFA(make_shape(sfa_rows, n, k, 1)), p.scale_b,
         ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, n, k, 1))},
        {{{{}, bias, {}}, ActivationArgs{static_cast<int>(p.activation)}},
         nullptr,
         stride_d,
         static_cast<ElementD*>(p.d),
         stride_d},
        hw};
    return args;
  }

  static size_t workspace_size(const BlockScaledMmParams& p, int sm_count) {
    return Gemm::get_workspace_size(arguments(p, sm_count));
  }

  static cudaError_t run(const BlockScaledMmParams& p, void* workspace, int sm_count,
                         cudaStream_t stream) {
    return run_gemm<Gemm>(arguments(p, sm_count), workspace, stream);
  }
};

// The members of the instance wrappers that scaled_mm_sm90_instances.h declares.
template <class ElementAB, class ElementD, class Config, bool kAzp>
size_t ScaledInstance<ElementAB, ElementD, Config, kAzp>::workspace_size(const ScaledMmParams& p,
                                                                         int sm_count) {
  return Sm90ScaledGemm<ElementAB, ElementD, Config, kAzp>::workspace_size(p, sm_count);
}
template <class ElementAB, class ElementD, class Config, bool kAzp>
cudaError_t ScaledInstance<ElementAB, ElementD, Config, kAzp>::run(const ScaledMmParams& p,
                                                                   void* workspace, int sm_count,
                                                                   cudaStream_t stream) {
  return Sm90ScaledGemm<ElementAB, ElementD, Config, kAzp>::run(p, workspace, sm_count, stream);
}
template <class ElementD, class Config>
size_t BlockInstance<ElementD, Config>::workspace_size(const BlockScaledMmParams& p, int sm_count) {
  return Sm90BlockScaledGemm<ElementD, Config>::workspace_size(p, sm_count);
}
template <class ElementD, class Config>
cudaError_t BlockInstance<ElementD, Config>::run(const BlockScaledMmParams& p, void* workspace,
                                                 int sm_count, cudaStream_t stream) {
  return Sm90BlockScaledGemm<ElementD, Config>::run(p, workspace, sm_count, stream);
}

}  // namespace sm90
}  // namespace cuda
}  // namespace quant
