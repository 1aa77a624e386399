// torch_binding.cpp: op schemas and device implementations of the activation kernel.
//
// Schemas follow kernels-community/activation v1 (out-param, `Tensor! out` is mutated, returns
// nothing) plus `bool? enable_pdl=None`; each forward op `<name>` has a backward
// `<name>_bwd(Tensor! grad_input, Tensor grad_out, Tensor input, <same scalars>, bool?
// enable_pdl=None) -> ()`. Launchers: torch_binding.h.
#include <torch/library.h>

#include "registration.h"
#include "torch_binding.h"

#if defined(CUDA_KERNEL)
#define ACTIVATION_IMPL(name) ops.impl(#name, c10::kCUDA, &name)
#elif defined(CPU_KERNEL)
#define ACTIVATION_IMPL(name) ops.impl(#name, c10::kCPU, &name)
#else
#error "activation: compile with -DCPU_KERNEL or -DCUDA_KERNEL"
#endif

// Defines `name(Tensor! out, Tensor input<scalars>, bool? enable_pdl=None) -> ()` and
// `name_bwd(Tensor! grad_input, Tensor grad_out, Tensor input<scalars>, bool? enable_pdl=None)
// -> ()`, with impls. enable_pdl: programmatic dependent launch on CUDA (None: the kernel's
// default, off; True: on where the device supports it; False: off; ignored on CPU).
#define ACTIVATION_OP_PAIR(name, scalars)                                               \
  ops.def(#name "(Tensor! out, Tensor input" scalars ", bool? enable_pdl=None) -> ()"); \
  ACTIVATION_IMPL(name);                                                                \
  ops.def(#name "_bwd(Tensor! grad_input, Tensor grad_out, Tensor input" scalars        \
                ", bool? enable_pdl=None) -> ()");                                      \
  ACTIVATION_IMPL(name##_bwd)

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  // Gated: out [..., d], input [..., 2 * d].
  ACTIVATION_OP_PAIR(silu_and_mul, "");
  ACTIVATION_OP_PAIR(mul_and_silu, "");
  ACTIVATION_OP_PAIR(gelu_and_mul, "");
  ACTIVATION_OP_PAIR(gelu_tanh_and_mul, "");
  ACTIVATION_OP_PAIR(fatrelu_and_mul, ", float threshold=0.0");
  ACTIVATION_OP_PAIR(swigluoai_and_mul, ", float alpha=1.702, float limit=7.0");

  // Unary: out and input [..., n].
  ACTIVATION_OP_PAIR(gelu, "");
  ACTIVATION_OP_PAIR(gelu_tanh, "");
  ACTIVATION_OP_PAIR(silu, "");
  ACTIVATION_OP_PAIR(gelu_fast, "");
  ACTIVATION_OP_PAIR(gelu_new, "");
  ACTIVATION_OP_PAIR(gelu_quick, "");
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
