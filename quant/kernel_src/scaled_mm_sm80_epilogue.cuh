// scaled_mm_sm80_epilogue.cuh: the fused epilogue of the mma.sync scaled GEMMs, as a CUTLASS 2.x
// epilogue visitor tree (EVT). It maps ScaledMmParams' formula
//
//   D[m, n] = act(scale_a[m] * scale_b[n] * (acc[m, n] - zp[m, n]) + bias[n])
//
// onto tree nodes, leaves first (every node below is evaluated per output fragment):
//
//   zp        = azp[m] * azp_adj[n]          int32; azp absent -> 1, azp_adj absent -> 0, so the
//                                            three zero-point forms of the contract are one tree
//   centered  = float(acc - zp)              exact int32 subtraction, one rounding to float
//                                            (int8 only; the fp8 tree uses the float acc as is)
//   sa        = scale_a_scalar * scale_a[m]  per tensor: the scalar node reads *scale_a on the
//   sb        = scale_b_scalar * scale_b[n]  device and the vector node is 1; per row / column
//                                            the reverse; either way one factor is exactly 1
//   y         = sa * (sb * centered) + bias  float32; absent bias -> 0
//   D         = act(y)                       rounded once to the output dtype, stored
//
// Per-tensor versus per-row/column scales and all optional terms are runtime choices (null
// pointers and 1 / 0 defaults), so one kernel serves every combination of a given operand,
// output dtype and tile.
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/epilogue/threadblock/fusion/visitors.hpp>
#include <cutlass/functional.h>

#include <cstdint>

#include "scaled_mm_params.h"

namespace quant {
namespace cuda {
namespace sm80 {

// The activations of the contract, on float32 (erf gelu, tanh gelu, silu = x * sigmoid(x)).
__device__ __forceinline__ float apply_activation(Activation act, float x) {
  switch (act) {
    case Activation::kGelu:
      return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case Activation::kGeluTanh: {
      const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
      return 0.5f * x * (1.0f + tanhf(inner));
    }
    case Activation::kSilu:
      return x / (1.0f + expf(-x));
    default:
      return x;
  }
}

// Last compute node of the tree: the activation chosen at run time, then the rounding to the
// output dtype. A stock VisitorCompute cannot carry a runtime parameter, hence this node; the
// switch is on a kernel parameter, uniform across the grid, so it does not diverge.
template <typename ElementOutput>
struct VisitorActivation {
  struct Arguments {
    Activation activation = Activation::kNone;
  };
  using Params = Arguments;
  struct SharedStorage {};

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args,
                                                  void*) {
    return args;
  }

  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }

  CUTLASS_HOST_DEVICE VisitorActivation() {}
  CUTLASS_HOST_DEVICE VisitorActivation(Params const& params, SharedStorage const&)
      : params_ptr(&params) {}

  Params const* params_ptr = nullptr;

  struct Callbacks : cutlass::epilogue::threadblock::EmptyCallbacks {
    Activation activation;

    template <typename ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<ElementOutput, FragmentSize> visit(
        int, int, int, int, cutlass::Array<ElementAccumulator, FragmentSize> const&,
        cutlass::Array<float, FragmentSize> const& y) {
      cutlass::Array<float, FragmentSize> activated;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) activated[i] = apply_activation(activation, y[i]);
      cutlass::NumericArrayConverter<ElementOutput, float, FragmentSize> to_output;
      return to_output(activated);
    }
  };

  template <class ProblemShape>
  CUTLASS_DEVICE auto get_callbacks(cutlass::gemm::GemmCoord, int, ProblemShape) {
    Callbacks callbacks;
    callbacks.activation = params_ptr->activation;
    return callbacks;
  }
};

// The tree for one operand (int8 or fp8), output dtype and output tile thread map.
template <GemmOperand kOperand, typename ElementOutput, typename OutputTileThreadMap>
struct ScaledEpilogue {
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  template <typename T>
  using PerRow = cutlass::epilogue::threadblock::VisitorColBroadcast<  // indexed by m
      OutputTileThreadMap, T, cute::Stride<cute::_1, cute::_0, cute::_0>>;
  template <typename T>
  using PerCol = cutlass::epilogue::threadblock::VisitorRowBroadcast<  // indexed by n
      OutputTileThreadMap, T, cute::Stride<cute::_0, cute::_1, cute::_0>>;
  using Scalar = cutlass::epilogue::threadblock::VisitorScalarBroadcast<float>;
  template <template <class> class Fn, typename Out, typename In>
  using Compute = cutlass::epilogue::threadblock::VisitorCompute<Fn, Out, In, kRound>;
  template <typename Node, typename... Children>
  using Tree = cutlass::epilogue::threadblock::Sm80EVT<Node, Children...>;
  using Acc = cutlass::epilogue::threadblock::VisitorAccFetch;

  using ZeroPoint =
      Tree<Compute<cutlass::multiplies, int32_t, int32_t>, PerRow<int32_t>, PerCol<int32_t>>;
  using Centered = Tree<Compute<cutlass::minus, float, int32_t>, Acc, ZeroPoint>;
  // fp8 accumulates in float and has no zero point: the accumulator is the centered value.
  using Product = std::conditional_t<kOperand == GemmOperand::kInt8, Centered, Acc>;

  using ScaleA = Tree<Compute<cutlass::multiplies, float, float>, Scalar, PerRow<float>>;
  using ScaleB = Tree<Compute<cutlass::multiplies, float, float>, Scalar, PerCol<float>>;
  using ScaledB = Tree<Compute<cutlass::multiplies, float, float>, ScaleB, Product>;
  using Affine =
      Tree<Compute<cutlass::multiply_add, float, float>, ScaleA, ScaledB, PerCol<ElementOutput>>;
  using Activated = Tree<VisitorActivation<ElementOutput>, Affine>;
  using Store =
      cutlass::epilogue::threadblock::VisitorAuxStore<OutputTileThreadMap, ElementOutput, kRound,
                                                      cute::Stride<int64_t, cute::_1, int64_t>>;
  using Callbacks = Tree<Store, Activated>;

  // One scale operand: the scalar node and the vector node, one of them the identity.
  template <typename VectorArgs>
  static void split_scale(const float* scale, bool per_vector, typename Scalar::Arguments& scalar,
                          VectorArgs& vector) {
    scalar = typename Scalar::Arguments{{1.0f}, {per_vector ? nullptr : scale}, {}};
    vector = VectorArgs{per_vector ? scale : nullptr, 1.0f, {}};
  }

  static typename Callbacks::Arguments arguments(const ScaledMmParams& p) {
    typename Scalar::Arguments scalar_a, scalar_b;
    typename PerRow<float>::Arguments row_scale_a;
    typename PerCol<float>::Arguments col_scale_b;
    split_scale(p.scale_a, p.scale_a_per_row, scalar_a, row_scale_a);
    split_scale(p.scale_b, p.scale_b_per_col, scalar_b, col_scale_b);
    const typename ScaleA::Arguments scale_a{scalar_a, row_scale_a, {}};
    const typename ScaleB::Arguments scale_b{scalar_b, col_scale_b, {}};

    typename Product::Arguments product{};
    if constexpr (kOperand == GemmOperand::kInt8) {
      // azp missing (per-tensor zero point folded into azp_adj) multiplies azp_adj by 1.
      const typename ZeroPoint::Arguments zero_point{
          {p.azp, int32_t{1}, {}}, {p.azp_adj, int32_t{0}, {}}, {}};
      product = typename Product::Arguments{{}, zero_point, {}};
    }
    const typename PerCol<ElementOutput>::Arguments bias{
        static_cast<const ElementOutput*>(p.bias), ElementOutput(0.0f), {}};
    const typename Affine::Arguments affine{scale_a, {scale_b, product, {}}, bias, {}};
    const typename Activated::Arguments activated{affine, {p.activation}};
    const typename Store::Arguments store{static_cast<ElementOutput*>(p.d),
                                          {p.ldd, cute::_1{}, int64_t{0}}};
    return typename Callbacks::Arguments{activated, store};
  }
};

}  // namespace sm80
}  // namespace cuda
}  // namespace quant
