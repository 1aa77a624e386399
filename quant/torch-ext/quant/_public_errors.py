"""Errors that name the public function the user called (private helper of the package).

One source of truth: common/public_errors.py, copied by scripts/sync_common.py into each kernel's
Python package as _public_errors.py (a kernel folder must build on its own);
tests/test_common_sync.py fails when a copy drifts. Edit common/, then run the script.

The checks of the C++ ops and of their fake kernels start their messages with the op's name
("rms_norm_fwd: weight must ...", "rope_out: cos must ..."), and one op serves several public
functions, so only the Python function the user called knows which name to show. `wrap_public`
replaces the public functions of a module (`wrap_layers`: the forwards of its `kernelize` layers,
named "<Layer>.forward") by wrappers that, when the call raises:

* RuntimeError (what TORCH_CHECK and torch._check raise) or ValueError (the packages' Python
  checks) whose message starts with "<name>: ", <name> an op of the kernel's library (C++ op or
  custom op) or another public function: the prefix becomes the wrapped function's name. The
  exception is the same object (same type and traceback), only its message changes. Nested
  public calls end up naming the outermost one.
* any error from a call whose arguments do not fit the function's signature, a tensor
  parameter (annotated Tensor or Optional[Tensor]) given something else: TypeError
  "<function>: <parameter> must be a tensor ..., got <type>" with the signature, instead of the
  schema error of whichever op the value reached ("Expected a value of type 'Tensor' for
  argument 'input' but instead found type 'float'").

Both happen on the error path only: a successful call costs one extra Python call and the
torch.compiler.is_compiling() test. While torch.compile traces, the wrapper calls the function
directly (Dynamo inlines it; the fake kernels' trace-time messages keep the op names).
Schemas and ops are unchanged, so opcheck and torch.compile see the same ops as before.
"""

import functools
import inspect
import re
import typing
from typing import Callable, Dict, FrozenSet, Iterable, Optional, Tuple

import torch

_PREFIX = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*): ")


def _op_names(namespace: str) -> FrozenSet[str]:
    """Names of the ops registered in `namespace` (C++ schemas and Python custom ops)."""
    head = namespace + "::"
    return frozenset(
        name[len(head) :].split(".")[0]
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith(head)
    )


def _is_tensor_annotation(annotation) -> bool:
    """Tensor or Optional[Tensor] (not a union with other types: Union[int, Tensor])."""
    if annotation is torch.Tensor:
        return True
    return typing.get_origin(annotation) is typing.Union and set(typing.get_args(annotation)) == {
        torch.Tensor,
        type(None),
    }


def _plain_signature(sig: inspect.Signature) -> str:
    """The signature without annotations: "(out=None, x=None, threshold=0.0)"."""
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def _misfit(sig: inspect.Signature, args, kwargs) -> Optional[Tuple[str, object, bool]]:
    """(parameter, value, optional) of the first tensor parameter given a non-tensor, if any."""
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return None
    for name, value in bound.arguments.items():
        param = sig.parameters[name]
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if not _is_tensor_annotation(param.annotation) or isinstance(value, torch.Tensor):
            continue
        optional = param.annotation is not torch.Tensor
        if value is None and optional:
            continue
        return name, value, optional
    return None


def _hint(sig: inspect.Signature, name: str, param: str, value) -> str:
    """For a number given to an optional tensor parameter followed by scalar ones (the functional
    form of activation's fatrelu_and_mul(out=None, x=None, threshold=0.0) called as
    fatrelu_and_mul(x, 0.5)): how to pass the scalar."""
    params = list(sig.parameters.values())
    index = [p.name for p in params].index(param)
    if sig.parameters[param].default is not None or not isinstance(value, (int, float)):
        return ""
    scalars = [
        p.name
        for p in params[index + 1 :]
        if p.kind == p.POSITIONAL_OR_KEYWORD and not _is_tensor_annotation(p.annotation)
    ]
    if not scalars:
        return ""
    return f"; pass scalars by keyword, e.g. {name}(..., {scalars[0]}={value!r})"


class _Scope:
    """The names an error prefix may carry in one package: its ops and its public functions."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.public: set = set()
        self._ops: Optional[FrozenSet[str]] = None

    def known(self, name: str) -> bool:
        if name in self.public:
            return True
        if self._ops is None:  # computed at the first error: every op is registered by then
            self._ops = _op_names(self.namespace)
        return name in self._ops


def _wrap(fn: Callable, name: str, scope: _Scope) -> Callable:
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def public(*args, **kwargs):
        if torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            misfit = _misfit(sig, args, kwargs)
            if misfit is not None:
                param, value, optional = misfit
                kind = "a tensor or None" if optional else "a tensor"
                raise TypeError(
                    f"{name}: {param} must be {kind}, got {type(value).__name__} "
                    f"(signature: {name}{_plain_signature(sig)}){_hint(sig, name, param, value)}"
                ) from exc
            if (
                not isinstance(exc, (RuntimeError, ValueError))
                or not exc.args
                or not isinstance(exc.args[0], str)
            ):
                raise
            match = _PREFIX.match(exc.args[0])
            if match is not None and match.group(1) != name and scope.known(match.group(1)):
                exc.args = (name + exc.args[0][match.end(1) :],) + exc.args[1:]
            raise

    return public


_SCOPES: Dict[str, _Scope] = {}


def _scope(add_op_namespace_prefix: Callable[[str], str]) -> _Scope:
    namespace = add_op_namespace_prefix("x").rsplit("::", 1)[0]
    return _SCOPES.setdefault(namespace, _Scope(namespace))


def wrap_public(
    namespaces: Iterable[dict],
    names: Iterable[str],
    add_op_namespace_prefix: Callable[[str], str],
) -> None:
    """Replace each function `names` lists, in every dict of `namespaces` that holds it (a
    module's globals(), vars(module)), by its error-naming wrapper (one wrapper per function).

    `add_op_namespace_prefix` is the package's (from _ops.py): it gives the ops' namespace. Names
    that are not functions (modules, classes) are skipped."""
    scope = _scope(add_op_namespace_prefix)
    dicts = list(namespaces)
    for name in names:
        holders = [d for d in dicts if inspect.isfunction(d.get(name))]
        if not holders:
            continue
        fn = holders[0][name]
        if getattr(fn, "_names_public_errors", False):
            continue
        scope.public.add(name)
        wrapper = _wrap(fn, name, scope)
        wrapper._names_public_errors = True
        for d in holders:
            if d[name] is fn:
                d[name] = wrapper


def wrap_layers(module, add_op_namespace_prefix: Callable[[str], str]) -> None:
    """Wrap the forward of every nn.Module class defined in the `kernelize` layers module
    `module`, in place: its errors name "<Layer>.forward" (the layer a model's module became).
    A subclass that inherits its forward gets its own wrapper, with its own name. The classes
    gain no member (kernels' layer rules) and inspect.signature sees the original forward."""
    scope = _scope(add_op_namespace_prefix)
    for cls in list(vars(module).values()):
        if not (
            inspect.isclass(cls)
            and issubclass(cls, torch.nn.Module)
            and cls.__module__ == module.__name__
        ):
            continue
        own = cls.__dict__.get("forward")
        if getattr(own, "_names_public_errors", False):
            continue
        fn = cls.forward
        fn = getattr(fn, "__wrapped__", fn) if getattr(fn, "_names_public_errors", False) else fn
        shown = f"{cls.__name__}.forward"
        scope.public.add(shown)
        wrapper = _wrap(fn, shown, scope)
        wrapper._names_public_errors = True
        cls.forward = wrapper
