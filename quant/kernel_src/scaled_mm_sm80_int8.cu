// scaled_mm_sm80_int8.cu: the int8 instances of the mma.sync scaled GEMM (2 output dtypes x 4
// tiles; scaled_mm_sm80_tiles.h), sm_80 and newer.
#include "scaled_mm_sm80_gemm.cuh"

template cudaError_t quant::cuda::sm80::run_operand<quant::GemmOperand::kInt8>(
    const quant::ScaledMmParams&, int, cudaStream_t);
