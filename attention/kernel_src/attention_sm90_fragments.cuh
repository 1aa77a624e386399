// attention_sm90_fragments.cuh: register-level helpers shared by the Hopper attention forward
// (attention_sm90_fwd.cuh) and backward (attention_sm90_bwd.cuh): views of a wgmma accumulator
// fragment, the exp2 (and tanh) they use and packed conversion to the input type.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attention_sm90_cute.h"
#include <cutlass/numeric_types.h>

namespace attention {
namespace sm90 {

using namespace cute;

// An accumulator fragment (C of an SS wgmma, e.g. S) reinterpreted as the A register operand of
// an RS wgmma (e.g. O += P V): ((2, 2, V), M, N) -> ((2, 2, 2), M, (V / 2) * N), K chunks of 16.
template <class Layout>
CUTE_HOST_DEVICE auto acc_as_a_operand(Layout acc) {
  auto l = logical_divide(acc, Shape<Shape<Underscore, Underscore, _2>, Underscore, Underscore>{});
  return make_layout(make_layout(get<0, 0>(l), get<0, 1>(l), get<0, 2, 0>(l)), get<1>(l),
                     coalesce(make_layout(get<0, 2, 1>(l), get<2>(l))));
}

// The accumulator fragment with (row, column) modes: ((2, 2, V), M, N) -> ((2, M), (2, V, N)),
// rows (the second value mode, 8 rows apart) first.
template <class Layout>
CUTE_HOST_DEVICE auto acc_rows_cols(Layout acc) {
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
}

constexpr float kLog2e = 1.44269504088896340736f, kLn2 = 0.69314718055994530942f;

// exp2 on the MUFU unit, subnormal results flushed to zero (they vanish in the fp32 sums).
CUTE_DEVICE float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// tanh on the MUFU unit (relative error about 2^-11, below the bf16 / fp16 rounding of P).
CUTE_DEVICE float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Two floats rounded to one packed pair of the element type (one cvt for both).
template <class Element>
CUTE_DEVICE uint32_t pack_pair(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

}  // namespace sm90
}  // namespace attention
