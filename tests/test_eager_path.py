"""common/eager_path.py: when the kernels' public functions may call a custom op's body directly
(eager inference) and when they must go through the op (autograd, tracing, dispatch modes,
tensor subclasses)."""

import importlib.util
import sys
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

spec = importlib.util.spec_from_file_location(
    "eager_path", Path(__file__).resolve().parent.parent / "common" / "eager_path.py"
)
eager_path = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = eager_path  # torch.compile looks the module up
spec.loader.exec_module(eager_path)
needed = eager_path.custom_op_needed
plain = eager_path.plain_eager


def test_plain_inference_skips_the_op():
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8))
    assert not needed(x, None)
    with torch.no_grad():
        assert not needed(x, w)  # a Parameter is a plain tensor, and grad mode is off


def test_autograd_takes_the_op():
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8))
    assert needed(x, w)  # grad mode on, w requires grad
    assert needed(x.requires_grad_())
    with torch.inference_mode():
        assert not needed(torch.randn(2))


def test_modes_and_subclasses_take_the_op():
    x = torch.randn(4, 8)
    with FlopCounterMode(display=False):
        assert needed(x)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
    assert needed(fake)  # a FakeTensor outside its mode is still a subclass
    with mode:
        assert needed(fake)


def test_plain_eager_only_without_tracing_modes_or_subclasses():
    x, w = torch.randn(4, 8).requires_grad_(), torch.nn.Parameter(torch.randn(8))
    assert plain(x, w, None)
    with FlopCounterMode(display=False):
        assert not plain(x)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
    assert not plain(fake)
    seen = []
    torch.func.grad(lambda t: (seen.append(plain(t)), t.sum())[1])(torch.randn(3))
    assert seen == [False]  # torch.func's transforms need the op (or a setup_context Function)
    seen.clear()
    torch.compile(lambda t: (seen.append(plain(t)), t + 1)[1], backend="eager", fullgraph=True)(
        torch.randn(3)
    )
    assert seen == [False]


def test_op_routes_pick_and_agree():
    """OpRoutes on a toy op: the body without autograd, its own Function under eager autograd
    (the op's formula, same gradient), the op under a dispatch mode or torch.compile; and the
    formula it registers with the op."""

    def body(x: torch.Tensor, factor: float) -> torch.Tensor:
        return x * factor

    op = torch.library.custom_op("eager_path_test::scale", body, mutates_args=())

    def setup_context(ctx, inputs, output):
        ctx.factor = inputs[1]

    def formula(scale):  # d(x * factor) / dx = factor: the backward is the op itself
        def backward(ctx, grad):
            return scale(grad, ctx.factor), None

        return backward

    routes = eager_path.OpRoutes("ScaleEager", op, body, setup_context, formula, op, body)
    x = torch.randn(5)
    assert routes.pick(x) is body
    xg = x.clone().requires_grad_()
    assert routes.pick(xg) is routes.eager
    y = routes.eager(xg, 3.0)
    assert type(y.grad_fn).__name__ == "ScaleEagerBackward"
    (g,) = torch.autograd.grad(y.sum(), xg)
    assert torch.equal(g, torch.full_like(x, 3.0))
    (g_op,) = torch.autograd.grad(op(xg, 3.0).sum(), xg)
    assert torch.equal(g_op, g)
    with FlopCounterMode(display=False):
        assert routes.pick(xg) is op
    picked = []
    torch.compile(lambda t: (picked.append(routes.pick(t)), t + 1)[1], backend="eager")(xg)
    assert picked == [op]


def test_body_unless_recorded_keeps_the_op_for_double_backward():
    calls = []
    call = eager_path.body_unless_recorded(
        lambda x: calls.append("op"), lambda x: calls.append("body")
    )
    with torch.no_grad():
        call(1)
    call(1)
    assert calls == ["body", "op"]
