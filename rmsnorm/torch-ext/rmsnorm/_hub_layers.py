"""Attach a package's `kernelize` layers to a model's modules by host class (private helper of the
package; its public entry point is the package's `attach_layers`).

One source of truth: common/hub_layers.py, copied by scripts/sync_common.py into each kernel's
Python package as _hub_layers.py (a kernel folder must build on its own);
tests/test_common_sync.py fails when a copy drifts. Edit common/, then run the script.

Why this exists: transformers (5.23+) makes its classes kernelizable (`use_kernel_forward_from_hub`
sets `kernel_layer_name`) only with kernels >= 0.18.2. With an older kernels, `kernelize` finds no
kernelizable module in a transformers model and replaces nothing, without an error; diffusers'
modules are never decorated. `attach` matches modules by their class name instead and says how
many it replaced, raising when there were none.

Why instance forwards are replaced here rather than by calling `kernelize`: the result is the one
`kernelize` produces (`module.forward = MethodType(layer.forward, module)`), but `kernelize` would
need `kernel_layer_name` set on the host classes (global state shared by every model of the
process, for the duration of the call), and it visits every kernelizable module of the model:
with kernels >= 0.18.2, where transformers' decorators are live, the modules its mapping does not
name get their class forward back, which would undo what another package's `attach_layers` had
attached. Matching and replacing the selected instances touches nothing else.

accelerate's hooks (diffusers' `enable_model_cpu_offload`, `enable_sequential_cpu_offload`, a
`device_map` dispatch) and diffusers' own (group offloading) keep the `module.forward` they find
when they are added, as `module._old_forward`, and call it from their wrapper, so a forward
attached before them stays in use. A module that already carries one (`_hf_hook`,
`_diffusers_hook`) is refused: replacing its forward afterwards would drop the hook (no weight
movement to the device).
"""

import inspect
import types
from typing import Callable, Dict, Iterable, Mapping, Optional, Tuple, Union

import torch

# A host entry: the layer, or (layer, condition): the condition says whether one instance can be
# reproduced (torch.nn.RMSNorm over several dimensions cannot).
Entry = Union[type, Tuple[type, Callable[[torch.nn.Module], bool]]]

# kernels' device types -> the dispatch key a kernel for that device registers under.
_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA", "rocm": "CUDA", "mps": "MPS", "xpu": "XPU"}


def _split(entry: Entry) -> Tuple[type, Optional[Callable[[torch.nn.Module], bool]]]:
    return entry if isinstance(entry, tuple) else (entry, None)


def matches(key: str, cls: type) -> bool:
    """Whether host key `key` names `cls`: a bare class name ("LlamaRMSNorm") matches any class of
    that name; "pkg.Name" ("diffusers.RMSNorm", "torch.nn.RMSNorm") only one whose module is
    `pkg` or lies under it (diffusers' RMSNorm and torch.nn.RMSNorm share their name)."""
    prefix, _, name = key.rpartition(".")
    if cls.__name__ != name:
        return False
    module = cls.__module__
    return not prefix or module == prefix or module.startswith(prefix + ".")


def _mode_flags(fn: str, mode) -> Tuple[bool, bool]:
    """(training, torch_compile) of a kernels `Mode`; None is inference."""
    if mode is None:
        return False, False
    from kernels import Mode

    if not isinstance(mode, Mode) or (Mode.INFERENCE not in mode and Mode.TRAINING not in mode):
        raise ValueError(
            f"{fn}: mode must be a kernels Mode containing Mode.INFERENCE or Mode.TRAINING "
            f"(e.g. Mode.TRAINING | Mode.TORCH_COMPILE), got {mode!r}"
        )
    return Mode.TRAINING in mode, Mode.TORCH_COMPILE in mode


def _device_type(fn: str, model: torch.nn.Module, device) -> Optional[str]:
    """The device type the model runs on: `device`'s, else that of its first parameter or buffer,
    None for a model with neither (ROCm tensors are "cuda" tensors; kernels' "rocm" is accepted
    as well)."""
    if device is None:
        for t in list(model.parameters()) + list(model.buffers()):
            return t.device.type
        return None
    if isinstance(device, torch.device):
        return device.type
    if isinstance(device, str):
        return device if device == "rocm" else torch.device(device).type
    raise TypeError(
        f"{fn}: device must be a str, a torch.device or None, got {type(device).__name__}"
    )


def _check_device(fn: str, namespace: str, device_type: str) -> None:
    """Raise unless the package's library has kernels for `device_type` (a CPU build attached to
    a CUDA model would otherwise fail at the first forward, far from the cause)."""
    key = _DISPATCH_KEYS.get(device_type)
    head = namespace + "::"
    ops = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith(head)]
    if key is None or not any(
        torch._C._dispatch_has_kernel_for_dispatch_key(op, key) for op in ops
    ):
        raise ValueError(
            f"{fn}: device {device_type!r} has no kernels in this build ({namespace}); load the "
            "package variant built for that device"
        )


def _select(fn: str, defaults: Mapping[str, Entry], layers, classes) -> Dict[str, Entry]:
    if classes is None:
        return dict(defaults)
    if isinstance(classes, str):
        classes = [classes]
    if isinstance(classes, Mapping):
        chosen = {}
        for key, entry in classes.items():
            layer, cond = _split(entry)
            if isinstance(layer, str):
                found = getattr(layers, layer, None)
                if not (inspect.isclass(found) and issubclass(found, torch.nn.Module)):
                    raise ValueError(
                        f"{fn}: classes[{key!r}] names no layer {layer!r} of this package"
                    )
                layer = found
            if not (inspect.isclass(layer) and issubclass(layer, torch.nn.Module)):
                raise TypeError(
                    f"{fn}: classes[{key!r}] must be a layer class or a layer name, got {layer!r}"
                )
            chosen[key] = layer if cond is None else (layer, cond)
        return chosen
    chosen = {}
    for key in classes:
        if key not in defaults:
            raise ValueError(
                f"{fn}: classes names {key!r}, which has no default layer; known: "
                f"{', '.join(defaults)} (or pass a dict host class -> layer)"
            )
        chosen[key] = defaults[key]
    return chosen


def attach(
    fn: str,
    namespace: str,
    layers,
    defaults: Mapping[str, Entry],
    model: torch.nn.Module,
    *,
    mode=None,
    device=None,
    classes: Optional[Union[Iterable[str], Mapping[str, Entry]]] = None,
) -> Dict[str, int]:
    """Replace the forward of every module of `model` whose class a host key names by its layer's
    forward; return {host key: modules replaced} (keys with no module left out).

    `fn` is the public name errors start with, `namespace` the package's op namespace, `layers`
    its layers module and `defaults` its map host key -> layer or (layer, condition). Raises
    ValueError before touching the model when a layer does not support `mode`, when the build
    has no kernels for the device, when a module carries an accelerate or diffusers hook, or
    when no module matched (naming the classes looked for and those the model has)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{fn}: model must be a torch.nn.Module, got {type(model).__name__}")
    training, compile_ = _mode_flags(fn, mode)
    chosen = _select(fn, defaults, layers, classes)
    for key, entry in chosen.items():
        layer, _ = _split(entry)
        if training and not getattr(layer, "has_backward", True):
            raise ValueError(
                f"{fn}: layer {layer.__name__} (for {key}) has no backward; mode asks TRAINING"
            )
        if compile_ and not getattr(layer, "can_torch_compile", False):
            raise ValueError(
                f"{fn}: layer {layer.__name__} (for {key}) does not support torch.compile; "
                "mode asks TORCH_COMPILE"
            )

    plan = []
    taken = []  # names of the modules replaced: their submodules no longer run (SwiGLU's SiLU)
    for name, module in model.named_modules():
        if any(name.startswith(t + ".") for t in taken):
            continue
        for key, entry in chosen.items():
            layer, cond = _split(entry)
            if matches(key, type(module)) and (cond is None or cond(module)):
                if hasattr(module, "_hf_hook") or hasattr(module, "_diffusers_hook"):
                    raise ValueError(
                        f"{fn}: module {name or '(the model)'} ({type(module).__name__}) carries an "
                        "accelerate or diffusers hook; call attach_layers before "
                        "enable_model_cpu_offload / enable_sequential_cpu_offload / "
                        "enable_group_offload / device_map dispatch"
                    )
                plan.append((module, key, layer))
                taken.append(name)
                break
    if not plan:
        present = sorted({f"{type(m).__module__}.{type(m).__name__}" for m in model.modules()})
        shown = ", ".join(present[:40]) + (
            f", ... ({len(present)} in all)" if len(present) > 40 else ""
        )
        raise ValueError(
            f"{fn}: no module of the model matched; looked for {', '.join(chosen) or '(nothing)'}; "
            f"the model's module classes are: {shown}"
        )
    device_type = _device_type(fn, model, device)
    if device_type is not None:  # a model without tensors (bare activations) runs anywhere
        _check_device(fn, namespace, device_type)

    counts: Dict[str, int] = {}
    for module, key, layer in plan:
        module.forward = types.MethodType(layer.forward, module)
        # Read back through attribute lookup, as a call does: what runs is the layer's function.
        if getattr(module.forward, "__func__", None) is not layer.forward:
            raise RuntimeError(
                f"{fn}: the forward of a {type(module).__name__} did not take {layer.__name__}"
            )
        counts[key] = counts.get(key, 0) + 1
    return counts


# The part of attach_layers' docstring every package shares.
_SHARED_DOC = """
    ``classes`` narrows the default map (names of it) or replaces it (a dict host class -> layer
    class or layer name). A bare class name matches any class of that name, ``"pkg.Name"`` one
    defined under ``pkg`` (diffusers' and PyTorch's classes share names).

    ``mode``: a kernels ``Mode`` (None: inference); TRAINING needs the layers' ``has_backward``,
    TORCH_COMPILE their ``can_torch_compile`` (all of ours have both). ``device``: the device
    type the model runs on (None: its first parameter's, if any); this build must have kernels
    for it. Raises ValueError, leaving the model untouched, when no module matched (naming the
    classes looked for and those the model contains), or when a matched module already carries
    an accelerate or diffusers hook: attach before ``enable_model_cpu_offload()`` and the like.
    Instance forwards are replaced, as ``kernelize`` does; the model is not copied.
    """


def entry_point(package: str, layers, add_op_namespace_prefix: Callable[[str], str], doc: str):
    """The package's public ``attach_layers(model, *, mode=None, device=None, classes=None)``
    over ``layers.HOST_CLASSES``; `doc` is the package's own part of its docstring (what it
    attaches to), `add_op_namespace_prefix` the package's (from _ops.py)."""
    namespace = add_op_namespace_prefix("x").rsplit("::", 1)[0]

    def attach_layers(
        model: torch.nn.Module,
        *,
        mode=None,
        device=None,
        classes: Optional[Union[Iterable[str], Mapping[str, Entry]]] = None,
    ) -> Dict[str, int]:
        return attach(
            "attach_layers",
            namespace,
            layers,
            layers.HOST_CLASSES,
            model,
            mode=mode,
            device=device,
            classes=classes,
        )

    attach_layers.__module__ = package
    attach_layers.__doc__ = doc.rstrip() + "\n" + _SHARED_DOC
    return attach_layers
