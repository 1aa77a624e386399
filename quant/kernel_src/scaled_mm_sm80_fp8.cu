// scaled_mm_sm80_fp8.cu: the fp8 e4m3 instances of the mma.sync scaled GEMM (2 output dtypes x 4
// tiles; scaled_mm_sm80_tiles.h), sm_89 and newer.
#include "scaled_mm_sm80_gemm.cuh"

template cudaError_t quant::cuda::sm80::run_operand<quant::GemmOperand::kFp8E4m3>(
    const quant::ScaledMmParams&, int, cudaStream_t);
