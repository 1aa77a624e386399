// scaled_mm_sm90_gated.cuh: the gated MLP form of the Hopper scaled GEMMs (ScaledMmParams::gated):
// D = act(x W_gate^T) * (x W_up^T) from one packed weight, writing only the N output columns.
//
// The packed weight alternates kGateBlock-row blocks of W_gate and W_up, and the CTA tile is two
// blocks wide, so the wgmma accumulators of one thread hold, for every gate column it owns, the
// up column kGateBlock to the right: the epilogue combines them in registers and stores the
// result straight from registers (no shared-memory staging: the output tile is half the
// accumulator tile, which the TMA epilogues do not express).
#pragma once

#include "scaled_mm_sm90_gemm.cuh"

namespace quant {
namespace cuda {
namespace sm90 {

template <class ElementAcc, class ElementD_>
class GatedEpilogue {
 public:
  using EpilogueSchedule = cutlass::epilogue::NoSmemWarpSpecialized;
  using DispatchPolicy = EpilogueSchedule;
  using ElementAccumulator = ElementAcc;
  using ElementC = void;
  using ElementD = ElementD_;
  using StrideC = Stride<int64_t, _1, int64_t>;
  using StrideD = StrideC;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;
  // What GemmUniversalAdapter reads off an epilogue's thread operator.
  struct ThreadEpilogueOp {
    using ElementOutput = ElementD_;
    using ElementAccumulator = ElementAcc;
    using ElementCompute = float;
    using ElementD = ElementD_;
    static constexpr int kCount = 2;
  };

  struct SharedStorage {};
  using TensorStorage = SharedStorage;

  struct Arguments {
    ElementD* d = nullptr;  // [M, N], row stride ldd
    int64_t ldd = 0;
    int64_t n = 0;  // output columns (the packed weight has 2N)
    const float* scale_a = nullptr;
    const float* scale_b = nullptr;  // packed order
    bool scale_a_per_row = false;
    bool scale_b_per_col = false;
    const ElementD* bias = nullptr;  // packed order
    int activation = 0;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args,
                                                  void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*,
                                              cudaStream_t, cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& shape, Arguments const& args) {
    return args.n % kGateBlock == 0 && get<1>(shape) == 2 * args.n && args.ldd % 2 == 0;
  }

  CUTLASS_HOST_DEVICE
  GatedEpilogue(Params const& params, SharedStorage const& = SharedStorage()) : params_(params) {}

  CUTLASS_DEVICE bool is_source_needed() { return false; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine,
            class FrgLayout, class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK,
                                 BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const& accumulators,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char*) {
    constexpr int kBlockM = size<0>(BlockShapeMNK{});
    constexpr int kBlockN = size<1>(BlockShapeMNK{});
    static_assert(kBlockN == 2 * kGateBlock, "a CTA tile is one gate block and its up block");
    // wgmma accumulators: ((2 columns, 2 row halves, atom N / 8 column groups), MMA_M, MMA_N).
    static_assert(size<0, 0>(FrgLayout{}) == 2 && size<0, 1>(FrgLayout{}) == 2);
    constexpr int kAtomGroups = size<0, 2>(FrgLayout{});
    constexpr int kMmaM = size<1>(FrgLayout{});
    constexpr int kMmaN = size<2>(FrgLayout{});
    constexpr int kGroups = kAtomGroups * kMmaN;  // 8-column groups across the tile
    static_assert(kGroups * 8 == kBlockN);

    const int rows = get<0>(problem_shape_mnkl);
    const int m_tile = get<0>(blk_coord_mnkl) * kBlockM;
    const int n_tile = get<1>(blk_coord_mnkl);  // output block index
    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
    // The (row, column) within the tile of each accumulator this thread holds.
    Tensor coords = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
    // One branch on the activation around the whole tile (scaled_mm_sm90_activation.cuh).
    with_activation(static_cast<Activation>(params_.activation), [&](auto act) {
      CUTLASS_PRAGMA_UNROLL
      for (int mm = 0; mm < kMmaM; ++mm) {
        CUTLASS_PRAGMA_UNROLL
        for (int half = 0; half < 2; ++half) {
          CUTLASS_PRAGMA_UNROLL
          for (int g = 0; g < kGroups / 2; ++g) {
            const int gu = g + kGroups / 2;  // the up columns of gate group g
            auto gate_at = make_coord(make_coord(0, half, g % kAtomGroups), mm, g / kAtomGroups);
            const int row = m_tile + get<0>(coords(gate_at));
            const int col = get<1>(coords(gate_at));  // even: columns come in pairs
            if (row >= rows) continue;
            const float sa = params_.scale_a == nullptr
                                 ? 1.f
                                 : params_.scale_a[params_.scale_a_per_row ? row : 0];
            cutlass::Array<ElementD, 2> out;
            CUTLASS_PRAGMA_UNROLL
            for (int pair = 0; pair < 2; ++pair) {
              auto g_at = make_coord(make_coord(pair, half, g % kAtomGroups), mm, g / kAtomGroups);
              auto u_at =
                  make_coord(make_coord(pair, half, gu % kAtomGroups), mm, gu / kAtomGroups);
              const int64_t packed_gate = int64_t(n_tile) * kBlockN + col + pair;
              const float gate = affine(accumulators(g_at), sa, packed_gate);
              const float up = affine(accumulators(u_at), sa, packed_gate + kGateBlock);
              out[pair] = ElementD(activate(act, gate) * up);
            }
            const int64_t n_out = int64_t(n_tile) * kGateBlock + col;
            *reinterpret_cast<cutlass::Array<ElementD, 2>*>(params_.d + row * params_.ldd + n_out) =
                out;
          }
        }
      }
    });
  }

 private:
  // scale_a * scale_b * acc + bias of one packed column, as ScaledEpilogue computes it.
  CUTLASS_DEVICE float affine(ElementAcc acc, float sa, int64_t packed_col) const {
    const float sb = params_.scale_b == nullptr
                         ? 1.f
                         : params_.scale_b[params_.scale_b_per_col ? packed_col : 0];
    const float bias = params_.bias == nullptr ? 0.f : float(params_.bias[packed_col]);
    return sb * (sa * float(acc)) + bias;
  }

  Params params_;
};

// One gated kernel: operand family, output element, tile configuration (kSwapAB must be false:
// the tile's N mode is the packed weight's).
template <class ElementAB, class ElementD, class Config>
struct Sm90GatedGemm {
  using ElementAcc = typename OperandTraits<ElementAB>::ElementAcc;
  using TileShape = typename Config::TileShape;
  using ClusterShape = typename Config::ClusterShape;
  static_assert(!Config::kSwapAB);

  using CollectiveEpilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<
      GatedEpilogue<ElementAcc, ElementD>>;
  using CollectiveMainloop =
      Sm90Mainloop<Config, ElementAB, cutlass::layout::RowMajor, ElementAB,
                   cutlass::layout::ColumnMajor, ElementAcc, CollectiveEpilogue>;
  using Gemm = Sm90DeviceGemm<Config, CollectiveMainloop, CollectiveEpilogue>;
  using Kernel = typename Gemm::GemmKernel;

  static typename Gemm::Arguments arguments(const ScaledMmParams& p, int sm_count) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    typename GatedEpilogue<ElementAcc, ElementD>::Arguments epilogue{};
    epilogue.d = static_cast<ElementD*>(p.d);
    epilogue.ldd = p.ldd;
    epilogue.n = p.n;
    epilogue.scale_a = p.scale_a;
    epilogue.scale_b = p.scale_b;
    epilogue.scale_a_per_row = p.scale_a_per_row;
    epilogue.scale_b_per_col = p.scale_b_per_col;
    epilogue.bias = static_cast<const ElementD*>(p.bias);
    epilogue.activation = static_cast<int>(p.activation);
    cutlass::KernelHardwareInfo hw{};
    hw.sm_count = sm_count;
    return typename Gemm::Arguments{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {static_cast<int>(p.m), static_cast<int>(2 * p.n), static_cast<int>(p.k), 1},
        {static_cast<const ElementAB*>(p.a), StrideA{p.lda, _1{}, int64_t(0)},
         static_cast<const ElementAB*>(p.b), StrideB{p.ldb, _1{}, int64_t(0)}},
        epilogue,
        hw};
  }

  static size_t workspace_size(const ScaledMmParams& p, int sm_count) {
    return Gemm::get_workspace_size(arguments(p, sm_count));
  }

  static cudaError_t run(const ScaledMmParams& p, void* workspace, int sm_count,
                         cudaStream_t stream) {
    return run_gemm<Gemm>(arguments(p, sm_count), workspace, stream);
  }
};

template <class ElementAB, class ElementD, class Config>
size_t GatedInstance<ElementAB, ElementD, Config>::workspace_size(const ScaledMmParams& p,
                                                                  int sm_count) {
  return Sm90GatedGemm<ElementAB, ElementD, Config>::workspace_size(p, sm_count);
}
template <class ElementAB, class ElementD, class Config>
cudaError_t GatedInstance<ElementAB, ElementD, Config>::run(const ScaledMmParams& p,
                                                            void* workspace, int sm_count,
                                                            cudaStream_t stream) {
  return Sm90GatedGemm<ElementAB, ElementD, Config>::run(p, workspace, sm_count, stream);
}

}  // namespace sm90
}  // namespace cuda
}  // namespace quant
