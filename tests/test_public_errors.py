"""common/public_errors.py, the wrapper every kernel package puts around its public functions so
that errors name the function called: its rules, on a toy op library (the kernels' own tests check
each public function of the built kernels)."""

import importlib.util
import inspect
import types
from pathlib import Path
from typing import Optional, Union

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "public_errors", REPO / "common" / "public_errors.py"
)
public_errors = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(public_errors)

NAMESPACE = "public_errors_test"


@torch.library.custom_op(f"{NAMESPACE}::general_op", mutates_args=())
def _general_op(x: torch.Tensor, width: int) -> torch.Tensor:
    torch._check(x.shape[-1] == width, lambda: f"general_op: x must have width {width}")
    return x.clone()


@_general_op.register_fake
def _(x, width):
    torch._check(x.shape[-1] == width, lambda: f"general_op: x must have width {width}")
    return torch.empty_like(x)


def _prefix(name: str) -> str:
    return f"{NAMESPACE}::{name}"


def _module():
    """The globals of a toy package: public functions over general_op."""

    def plain(x: torch.Tensor, width: int = 4) -> torch.Tensor:
        return torch.ops.public_errors_test.general_op(x, width)

    def nested(x: torch.Tensor) -> torch.Tensor:
        return scope["plain"](x, 3)

    def foreign(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("other_library_op: an error of another library")

    def offsets(x: torch.Tensor, offset: Union[int, torch.Tensor] = 0) -> torch.Tensor:
        return torch.ops.public_errors_test.general_op(x, 5)

    def gated(
        out: Optional[torch.Tensor] = None, x: Optional[torch.Tensor] = None, threshold=0.0
    ) -> torch.Tensor:
        return torch.ops.public_errors_test.general_op(x if x is not None else out, 4)

    scope = dict(plain=plain, nested=nested, foreign=foreign, offsets=offsets, gated=gated)
    public_errors.wrap_public([scope], list(scope), _prefix)
    return scope


def test_an_op_prefix_becomes_the_public_name_on_the_same_exception():
    m = _module()
    with pytest.raises(RuntimeError, match="^plain: x must have width 4$") as info:
        m["plain"](torch.ones(2, 3))
    assert type(info.value) is RuntimeError  # the op's exception, only its message renamed


def test_the_outermost_public_function_is_named():
    m = _module()
    with pytest.raises(RuntimeError, match="^nested: x must have width 3$"):
        m["nested"](torch.ones(2, 4))


def test_a_prefix_that_is_not_the_kernels_is_kept():
    m = _module()
    with pytest.raises(RuntimeError, match="^other_library_op: "):
        m["foreign"](torch.ones(1))


def test_a_non_tensor_for_a_tensor_parameter_is_a_type_error_with_the_signature():
    m = _module()
    with pytest.raises(
        TypeError,
        match=r"^gated: x must be a tensor or None, got float \(signature: "
        r"gated\(out=None, x=None, threshold=0\.0\)\); pass scalars by keyword, "
        r"e\.g\. gated\(\.\.\., threshold=0\.5\)$",
    ):
        m["gated"](torch.ones(2, 4), 0.5)
    with pytest.raises(TypeError, match=r"^plain: x must be a tensor, got str \(signature"):
        m["plain"]("x")


def test_an_int_for_a_union_of_int_and_tensor_is_not_a_type_error():
    m = _module()
    with pytest.raises(RuntimeError, match="^offsets: x must have width 5$"):
        m["offsets"](torch.ones(2, 4), 3)


def test_wrapping_twice_keeps_one_wrapper():
    m = _module()
    wrapped = m["plain"]
    public_errors.wrap_public([m], ["plain"], _prefix)
    assert m["plain"] is wrapped and wrapped.__wrapped__.__name__ == "plain"


def test_torch_compile_traces_through_the_wrapper_without_a_graph_break():
    m = _module()
    compiled = torch.compile(m["plain"], backend="eager", fullgraph=True, dynamic=True)
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), x)
    with pytest.raises(Exception, match="general_op: x must have width 4"):
        compiled(torch.randn(3, 5))  # trace time: the fake's message, with the op's name


def test_a_value_error_of_a_python_check_is_renamed_too():
    def check(x: torch.Tensor) -> None:
        raise ValueError("plain: x must be 2-D")

    scope = {"outer": check}
    public_errors.wrap_public([scope], ["outer"], _prefix)
    public_errors.wrap_public([{"plain": lambda: None}], ["plain"], _prefix)  # a public name
    with pytest.raises(ValueError, match="^outer: x must be 2-D$"):
        scope["outer"](torch.ones(1))


def test_layers_name_themselves_and_gain_no_member():

    class Base(torch.nn.Module):
        has_backward = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.public_errors_test.general_op(x, 4)

    class Sub(Base):
        pass

    module = types.ModuleType("toy_layers")
    Base.__module__ = Sub.__module__ = module.__name__
    module.Base, module.Sub = Base, Sub
    members = {n for n, _ in inspect.getmembers(Sub)}
    public_errors.wrap_layers(module, _prefix)
    public_errors.wrap_layers(module, _prefix)  # idempotent
    assert {n for n, _ in inspect.getmembers(Sub)} == members
    assert list(inspect.signature(Sub.forward).parameters) == ["self", "x"]
    for cls in (Base, Sub):
        with pytest.raises(RuntimeError, match=rf"^{cls.__name__}\.forward: x must have width 4"):
            cls()(torch.ones(2, 3))
