// torch_binding.cpp: op schemas and device implementations of the newkernel kernel.
//
// Ops mutate a `Tensor! out` and return nothing; the allocating, differentiable forms are Python
// custom ops over them (newkernel/_custom_ops.py). Launchers: torch_binding.h.
#include <torch/library.h>

#include "registration.h"
#include "torch_binding.h"

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def("scale(Tensor! out, Tensor input, float alpha=1.0) -> ()");
#if defined(CUDA_KERNEL)
  ops.impl("scale", c10::kCUDA, &scale);
#elif defined(CPU_KERNEL)
  ops.impl("scale", c10::kCPU, &scale);
#else
#error "newkernel: compile with -DCPU_KERNEL or -DCUDA_KERNEL"
#endif
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
