"""When a public function may skip its torch.library custom op (private helper of the package).

One source of truth: common/eager_path.py, copied by scripts/sync_common.py into each kernel's
Python package as _eager_path.py (a kernel folder must build on its own); tests/test_common_sync.py
fails when a copy drifts. Edit common/, then run the script.

The allocating custom ops are what autograd needs, but a call through one crosses the
dispatcher twice, the custom op's autograd and redispatch layers and dynamo's disable wrapper:
tens of microseconds of host time, more than the kernel of a decode step takes on the GPU. Where
autograd is not involved, a public function calls the op's body (the C++ out-parameter op on a
new output) itself: the same kernel and the same result. That holds under torch.compile too:
dynamo traces the body (the out-parameter ops have fake kernels) and the compiled code calls the
C++ op directly, about 45 us less host time per call on an H200's host than through the custom
op, which decides whether a compiled prefill is bound by the host or by the GPU.

Where autograd is the only reason for the op (plain_eager), a public function runs the op's
body, setup_context and backward under a torch.autograd.Function of its own instead (OpRoutes):
the custom op's autograd layer fills in its schema's defaults at every call
(torch._library.utils.fill_defaults reads schema.arguments once per argument, and each read
rebuilds the whole list), quadratic in the number of arguments: attention's 20 cost about 140 us
of host time per call on a CPU where the op's own work takes 17 (torch 2.13).
"""

from typing import Callable, Optional

import torch


def custom_op_needed(*tensors: Optional[torch.Tensor]) -> bool:
    """True when the call must go through the custom op: autograd records the call (grad mode on
    and an input requiring grad), or, outside torch.compile's tracing, a TorchDispatchMode is
    active (FakeTensorMode, FunctionalTensorMode, a FlopCounterMode...) or an input is a tensor
    subclass other than Parameter (FakeTensor, DTensor...)."""
    grad = torch.is_grad_enabled()
    if torch.compiler.is_compiling():
        return grad and any(t is not None and t.requires_grad for t in tensors)
    if torch._C._len_torch_dispatch_stack() > 0:
        return True
    for t in tensors:
        if t is None:
            continue
        if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
            return True
        if grad and t.requires_grad:
            return True
    return False


def plain_eager(*tensors: Optional[torch.Tensor]) -> bool:
    """True outside torch.compile's tracing and torch.func's transforms, with no TorchDispatchMode
    active and every input a plain tensor or Parameter: then autograd is the only reason left to
    go through the custom op, and a torch.autograd.Function over the op's body records the same
    call and backward (one without setup_context: torch.func needs that, and it costs an
    inspect.signature per call)."""
    if (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack() > 0
        or torch._C._are_functorch_transforms_active()
    ):
        return False
    return all(
        t is None or type(t) is torch.Tensor or type(t) is torch.nn.Parameter for t in tensors
    )


def body_unless_recorded(op: Callable, body: Callable) -> Callable:
    """Calls `body` (an op's implementation) where grad mode is off, as in a backward without
    create_graph, and `op` otherwise, so that a double backward meets the op and its autograd
    (or its error) as it would through the op's own formula."""

    def call(*args):
        return (op if torch.is_grad_enabled() else body)(*args)

    return call


class OpRoutes:
    """An allocating custom op's autograd formula, and the three ways a public function can run
    the op, with the choice between them.

    `formula(backward)` builds the op's backward formula (the function register_autograd takes),
    computing the gradients with `backward`, which is called as `backward_op` is. The op gets
    formula(backward_op), so that AOT autograd traces the backward op. The routes: `body` (the
    op's implementation) where no autograd, tracing or dispatch mode is involved; `eager`, the
    body under setup_context and formula(backward_body where nothing records the call:
    body_unless_recorded) in a torch.autograd.Function named `name`, where autograd is the only
    reason for the op (plain_eager); else `op`. The inputs go positionally, in the op's schema
    order, which is how setup_context reads them."""

    def __init__(
        self,
        name: str,
        op,
        body: Callable,
        setup_context: Callable,
        formula: Callable,
        backward_op: Callable,
        backward_body: Callable,
    ):
        torch.library.register_autograd(op, formula(backward_op), setup_context=setup_context)

        def forward(ctx, *inputs):
            output = body(*inputs)
            setup_context(ctx, inputs, output)
            return output

        backward = formula(body_unless_recorded(backward_op, backward_body))
        function = type(
            name,
            (torch.autograd.Function,),
            {"forward": staticmethod(forward), "backward": staticmethod(backward)},
        )
        self.op, self.body, self.eager = op, body, function.apply

    def pick(self, *tensors: Optional[torch.Tensor]) -> Callable:
        """The route for a call whose tensor inputs are `tensors`."""
        if not custom_op_needed(*tensors):
            return self.body
        return self.eager if plain_eager(*tensors) else self.op
