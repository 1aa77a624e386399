// attention_sm90_cute.h: CuTe for the Hopper kernels, with the wgmma shapes they need.
//
// The kernels' S = Q K^T GEMMs are 64 x kBlockN with kBlockN = 80 (head dim 256) or 112 (192).
// CuTe's wgmma selectors pick 64x80 or 64x112 atoms only with its extended shapes enabled;
// without them they fall back to 64x16 atoms, five or seven wgmmas per k step, each reading the
// whole Q slice again from shared memory. Every Hopper unit includes CuTe through this header,
// and the kernels static_assert that each GEMM got one atom across N.
#pragma once

#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#endif

#include <cute/tensor.hpp>
