"""Plain-PyTorch references of the newkernel ops (private, not in ``__all__``).

Used by the tests and the benchmarks through the loaded kernel (``kernel._reference``). Each
computes in ``torch.promote_types(x.dtype, compute_dtype)``: ``torch.float64`` for an accuracy
reference, ``torch.float32`` for the one the benchmarks round to the output dtype. Scalars are
rounded to float32 first, as the kernels receive them.
"""

import torch


def scale(x: torch.Tensor, alpha: float = 1.0, compute_dtype=torch.float32) -> torch.Tensor:
    alpha32 = float(torch.tensor(alpha, dtype=torch.float32))
    return x.to(torch.promote_types(x.dtype, compute_dtype)) * alpha32
