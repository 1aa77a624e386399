"""Quantized linear layers over the package's GEMMs: ``QuantizedLinear``, putting it in a model
(``replace_linear_with_quantized``), static activation scales (``calibrate_input_scales``) and
int4 checkpoints (``load_int4_checkpoint``).

W8A8 modes quantize weights once and activations at every call:

============  =====================================  ==========================================
quant         weight [N, K] (stored row-major)       activation [M, K]
============  =====================================  ==========================================
``fp8``       float8_e4m3fn, one scale per output    dynamic per token (``amax / 448``), or
              row: ``amax / 448``                    static per tensor (``input_scale``)
``int8``      int8, one scale per output row:        dynamic per token (``amax / 127``), or
              ``amax / 127``, symmetric               static per tensor (``input_scale``)
``fp8_block`` float8_e4m3fn, one scale per 128x128   dynamic per 1x128 group of each row
              block (``max(amax, 1e-10) / 448``)
============  =====================================  ==========================================

``int4`` is weight-only (W4A16, int4.py): 4-bit codes in groups of ``group_size`` input features
(32, 64, 128, or -1 for one group per output), ``w = (q - z) * s`` with ``z = 8`` (symmetric, as
GPTQ) or a zero per group (``zero_point=True``, as AWQ); activations stay 16-bit and
``w4a16_gemm`` computes the product. ``quantize_from_float`` rounds to nearest;
``load_gptq`` / ``load_awq`` (or ``load_int4_checkpoint`` for a whole model) take checkpoint
tensors.

These are not the ``kernelize`` layers of the package (those replace a host module's forward and
hold no state); a QuantizedLinear owns its quantized weight, so it replaces the nn.Linear itself.
"""

import contextlib
import importlib
import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, Optional, Tuple, Union

import torch
import torch.nn as nn

# The package itself: the forward calls its public functions by attribute at call time, so this
# module can be imported from __init__ before every function of the package is defined.
_package = importlib.import_module(__package__)

QUANT_MODES = ("fp8", "int8", "fp8_block", "int4")
INT4_GROUP_SIZES = (32, 64, 128, -1)  # -1: one group spans K (a scale per output)
INT4_TILE_K, INT4_TILE_N = 16, 64  # the int4 layout's tile: K and N multiples of these
ACTIVATIONS = (None, "gelu", "gelu_tanh", "silu")
OUT_DTYPES = (torch.bfloat16, torch.float16)
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FP8_MAX = 448.0
INT8_MAX = 127.0
BLOCK = 128  # fp8_block: weight blocks of BLOCK x BLOCK, activation groups of 1 x BLOCK
GEMM_ALIGN = 16  # the scaled GEMMs need K and N multiples of 16
BLOCK_EPS = 1e-10  # floor of a block's amax, as per_token_group_quant_fp8's eps
SCALE_FLOOR = 1.0 / (FP8_MAX * 512.0)  # floor of an fp8 scale, as the quantize ops'


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def shape_problem(
    in_features: int, out_features: int, quant: str, group_size: int = 128
) -> Optional[str]:
    """Why a [out_features, in_features] weight cannot be quantized with `quant`, or None."""
    if quant == "int4":
        if in_features % INT4_TILE_K or out_features % INT4_TILE_N:
            return (
                f"int4 needs in_features ({in_features}) a multiple of {INT4_TILE_K} and "
                f"out_features ({out_features}) a multiple of {INT4_TILE_N}"
            )
        if group_size != -1 and in_features % group_size:
            return f"int4 needs in_features ({in_features}) a multiple of group_size ({group_size})"
        return None
    if in_features % GEMM_ALIGN or out_features % GEMM_ALIGN:
        return (
            f"in_features ({in_features}) and out_features ({out_features}) must be multiples "
            f"of {GEMM_ALIGN}"
        )
    if quant == "fp8_block" and in_features % BLOCK:
        return f"fp8_block needs in_features ({in_features}) to be a multiple of {BLOCK}"
    return None


def _check_config(
    name: str, in_features, out_features, quant, activation, dtype, group_size=128
) -> None:
    for arg, value in (("in_features", in_features), ("out_features", out_features)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}: {arg} must be a positive int, got {value!r}")
    if quant not in QUANT_MODES:
        raise ValueError(f"{name}: quant must be one of {QUANT_MODES}, got {quant!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{name}: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if dtype not in OUT_DTYPES:
        raise ValueError(f"{name}: dtype must be bfloat16 or float16, got {dtype}")
    if quant == "int4" and group_size not in INT4_GROUP_SIZES:
        raise ValueError(
            f"{name}: group_size must be one of {INT4_GROUP_SIZES}, got {group_size!r}"
        )
    problem = shape_problem(in_features, out_features, quant, group_size)
    if problem is not None:
        raise ValueError(f"{name}: {problem}")


def _static_scale(name: str, act_scale, quant: str, device) -> Optional[torch.Tensor]:
    """act_scale (None, a positive number or a one-element tensor) as a float32 [1] buffer."""
    if act_scale is None:
        return None
    if quant in ("fp8_block", "int4"):
        raise ValueError(
            f"{name}: act_scale must be None with quant={quant!r} (its activations are not "
            "quantized per tensor)"
        )
    scale = torch.as_tensor(act_scale, dtype=torch.float32).reshape(-1)
    if scale.numel() != 1 or not bool(torch.isfinite(scale).all() and (scale > 0).all()):
        raise ValueError(
            f"{name}: act_scale must be one positive finite number (a per-tensor scale), got "
            f"{act_scale!r}"
        )
    return scale.to(device)


def quantize_weight_per_row(weight: torch.Tensor, quant: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """(q [N, K], scale [N]) with one scale per output row, through the package's per-token
    quantize ops (fp8: ``amax / 448`` floored at 1 / (448 * 512); int8: ``amax / 127``)."""
    w = weight.detach().float()
    if quant == "fp8":
        q, scale = _package.scaled_fp8_quant(w, use_per_token_if_dynamic=True)
    else:
        q, scale, _ = _package.scaled_int8_quant(w)
    return q, scale.reshape(-1)


def quantize_weight_blocks(weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(q [N, K] float8_e4m3fn, scale [ceil(N / 128), K / 128]): one scale per 128x128 block,
    ``max(amax, 1e-10) / 448``, the layout of the checkpoints' ``weight_scale_inv``; the last
    row of blocks may be partial. K must be a multiple of 128."""
    w = weight.detach().float()
    n, k = w.shape
    n_blocks = math.ceil(n / BLOCK)
    padded = torch.zeros(n_blocks * BLOCK, k, dtype=torch.float32, device=w.device)
    padded[:n] = w
    blocks = padded.view(n_blocks, BLOCK, k // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = amax.clamp(min=BLOCK_EPS) / torch.full_like(amax, FP8_MAX)
    per_element = scale[:, None, :, None].expand_as(blocks).reshape(n_blocks * BLOCK, k)[:n]
    q = (w / per_element).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


class QuantizedLinear(nn.Module):
    """``y = act(x @ dequant(weight).T + bias)``: an 8-bit weight and 8-bit activations through
    ``cutlass_scaled_mm`` (exact int32 or float32 accumulation, rounded once), or a 4-bit weight
    and 16-bit activations through ``w4a16_gemm`` (``quant="int4"``).

    Args:
        in_features, out_features: K and N, multiples of 16 (``fp8_block``: K a multiple of 128;
            ``int4``: N a multiple of 64, K of 16 and of ``group_size``).
        bias: whether the layer adds a bias (stored in ``dtype``).
        quant: ``"fp8"``, ``"int8"``, ``"fp8_block"`` or ``"int4"`` (module docstring).
        activation: None, ``"gelu"``, ``"gelu_tanh"`` or ``"silu"``, fused into the GEMM.
        act_scale: None for dynamic activation scales; a positive number for a static
            per-tensor scale (``fp8`` and ``int8``), kept in the ``input_scale`` buffer.
        group_size, zero_point: ``int4`` only: input features per scale (32, 64, 128, or -1 for
            all of K) and whether each group has a zero point (AWQ) or is symmetric (GPTQ).
        device: where the buffers live.
        dtype: bfloat16 or float16: the dtype of ``bias`` (and of ``int4``'s scales and zeros),
            and of the GEMM's result for float32 inputs (cast back to float32).

    Buffers (the state_dict): ``weight`` [N, K] (float8_e4m3fn or int8, row-major; the GEMM
    reads ``weight.t()``), ``weight_scale`` float32 ([N], or [ceil(N / 128), K / 128] for
    ``fp8_block``), ``bias`` [N], and ``input_scale`` [1] when static. ``int4``: ``weight`` int32
    [K / 16, 2 N] (int4_pack's layout), ``weight_scale`` and ``weight_zero`` [K / group, N] of
    ``dtype``, and ``perm`` int32 [K] after an act-order GPTQ load. A fresh layer is zero; fill
    it with ``quantize_from_float`` or ``load_state_dict`` (which turns a dynamic layer static
    when the state holds an ``input_scale``), or build it with ``from_linear``.

    ``forward(x)``: x ``[..., K]`` of bfloat16, float16 or float32 -> ``[..., N]`` of x's dtype.
    ``.to(dtype)`` / ``.half()`` keep the 8-bit weight and float32 scales (only the bias follows).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        quant: str = "fp8",
        activation: Optional[str] = None,
        *,
        act_scale: Union[None, float, torch.Tensor] = None,
        group_size: int = 128,
        zero_point: bool = False,
        device=None,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        super().__init__()
        name = "QuantizedLinear"
        _check_config(name, in_features, out_features, quant, activation, dtype, group_size)
        self.in_features = in_features
        self.out_features = out_features
        self.quant = quant
        self.activation = activation
        self.dtype = dtype
        if quant == "int4":
            self._init_int4(group_size, zero_point, bias, device)
            self.register_buffer("input_scale", _static_scale(name, act_scale, quant, device))
            return
        self.group_size = self.zero_point = None
        storage = torch.int8 if quant == "int8" else torch.float8_e4m3fn
        if quant == "fp8_block":
            scale_shape = (math.ceil(out_features / BLOCK), in_features // BLOCK)
        else:
            scale_shape = (out_features,)
        self.register_buffer(
            "weight", torch.zeros(out_features, in_features, dtype=storage, device=device)
        )
        self.register_buffer(
            "weight_scale", torch.zeros(scale_shape, dtype=torch.float32, device=device)
        )
        self.register_buffer(
            "bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None
        )
        self.register_buffer("input_scale", _static_scale(name, act_scale, quant, device))

    def _init_int4(self, group_size: int, zero_point: bool, bias: bool, device) -> None:
        k, n = self.in_features, self.out_features
        self.group_size = k if group_size == -1 else group_size
        self.zero_point = bool(zero_point)
        groups = k // self.group_size
        self.register_buffer(
            "weight", torch.zeros(k // INT4_TILE_K, 2 * n, dtype=torch.int32, device=device)
        )
        table = (groups, n)
        self.register_buffer("weight_scale", torch.zeros(table, dtype=self.dtype, device=device))
        self.register_buffer(
            "weight_zero",
            torch.zeros(table, dtype=self.dtype, device=device) if zero_point else None,
        )
        self.register_buffer("perm", None)
        self.register_buffer(
            "bias", torch.zeros(n, dtype=self.dtype, device=device) if bias else None
        )

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        quant: str = "fp8",
        activation: Optional[str] = None,
        *,
        act_scale: Union[None, float, torch.Tensor] = None,
        group_size: int = 128,
        zero_point: bool = False,
        dtype: Optional[torch.dtype] = None,
    ) -> "QuantizedLinear":
        """A QuantizedLinear holding `linear`'s weight and bias, quantized, on its device.
        ``dtype`` None: the linear's dtype when bfloat16 or float16, else bfloat16."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(
                f"QuantizedLinear.from_linear: linear must be a torch.nn.Linear, got "
                f"{type(linear).__name__}"
            )
        if dtype is None:
            dtype = linear.weight.dtype if linear.weight.dtype in OUT_DTYPES else torch.bfloat16
        layer = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            quant=quant,
            activation=activation,
            act_scale=act_scale,
            group_size=group_size,
            zero_point=zero_point,
            device=linear.weight.device,
            dtype=dtype,
        )
        return layer.quantize_from_float(linear.weight, linear.bias)

    @torch.no_grad()
    def quantize_from_float(
        self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None
    ) -> "QuantizedLinear":
        """Quantize a float ``weight`` [N, K] (and copy ``bias`` [N]) into this layer; returns
        the layer. The layer keeps its device; a bias is required exactly when it has one."""
        name = "QuantizedLinear.quantize_from_float"
        expected = (self.out_features, self.in_features)
        if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
            raise TypeError(f"{name}: weight must be a floating-point tensor, got {weight!r:.80}")
        if tuple(weight.shape) != expected:
            raise ValueError(
                f"{name}: weight must have shape {list(expected)} [out_features, in_features], "
                f"got {list(weight.shape)}"
            )
        if (bias is None) != (self.bias is None):
            raise ValueError(
                f"{name}: bias must be given exactly when the layer has one (bias="
                f"{self.bias is not None}), got {'None' if bias is None else 'a tensor'}"
            )
        if bias is not None and tuple(bias.shape) != (self.out_features,):
            raise ValueError(
                f"{name}: bias must have shape [{self.out_features}], got {list(bias.shape)}"
            )
        if not bool(torch.isfinite(weight).all()):
            raise ValueError(f"{name}: weight must be finite (it holds inf or NaN)")
        weight = weight.to(self.weight.device)
        if self.quant == "int4":
            codes, scales, zeros = _package.int4.quantize_rtn(
                weight, self.group_size, self.zero_point, self.dtype
            )
            self.weight.copy_(_package.int4_pack(codes))
            self.weight_scale.copy_(scales)
            if zeros is not None:
                self.weight_zero.copy_(zeros)
            self.perm = None
            if bias is not None:
                self.bias.copy_(bias)
            return self
        if self.quant == "fp8_block":
            q, scale = quantize_weight_blocks(weight)
        else:
            q, scale = quantize_weight_per_row(weight, self.quant)
        self.weight.copy_(q)
        self.weight_scale.copy_(scale)
        if bias is not None:
            self.bias.copy_(bias)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in INPUT_DTYPES:
            raise ValueError(
                f"QuantizedLinear.forward: x must be bfloat16, float16 or float32, got "
                f"{_dtype_name(x.dtype)}"
            )
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(
                f"QuantizedLinear.forward: x must have shape [..., {self.in_features}] "
                f"(in_features last), got {list(x.shape)}"
            )
        if self.quant == "int4":
            return self._forward_int4(x)
        # float32 inputs are quantized as they are; the GEMM only writes 16-bit results.
        out_dtype = x.dtype if x.dtype in OUT_DTYPES else self.dtype
        rows = x.reshape(-1, self.in_features)
        if self.quant == "fp8_block":
            # The GEMM reads the group scales token-major: [M, K / 128] with unit stride over M.
            a, scale_a = _package.per_token_group_quant_fp8(rows, BLOCK, column_major_scales=True)
            scale_b = self.weight_scale.t()
        elif self.quant == "fp8":
            a, scale_a = _package.scaled_fp8_quant(
                rows, self.input_scale, use_per_token_if_dynamic=True
            )
            scale_b = self.weight_scale
        else:
            a, scale_a, _ = _package.scaled_int8_quant(rows, self.input_scale)
            scale_b = self.weight_scale
        bias = self.bias
        if bias is not None and bias.dtype != out_dtype:
            bias = bias.to(out_dtype)
        out = _package.cutlass_scaled_mm(
            a, self.weight.t(), scale_a, scale_b, out_dtype, bias, activation=self.activation
        )
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def _forward_int4(self, x: torch.Tensor) -> torch.Tensor:
        # The GEMM takes activations of the scales' dtype: other inputs are cast there and back.
        rows = x.reshape(-1, self.in_features).to(self.weight_scale.dtype)
        bias = self.bias.to(rows.dtype) if self.bias is not None else None
        out = _package.w4a16_gemm(
            rows, self.weight, self.weight_scale, self.weight_zero, self.perm, bias, self.activation
        )
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    @torch.no_grad()
    def load_gptq(
        self,
        qweight: torch.Tensor,
        scales: torch.Tensor,
        g_idx: Optional[torch.Tensor] = None,
        qzeros: Optional[torch.Tensor] = None,
        bias: Optional[torch.Tensor] = None,
    ) -> "QuantizedLinear":
        """Load a symmetric GPTQ checkpoint's tensors (``qweight`` int32 [K / 8, N], ``scales``
        [K / group, N], ``g_idx`` [K] for act-order, ``qzeros`` checked to be GPTQ's symmetric
        7s when given) into this ``int4`` layer without zero points; returns the layer."""
        name = "QuantizedLinear.load_gptq"
        self._check_int4_load(name, zero_point=False)
        if qzeros is not None:
            stored = _package.int4.awq_unpack(qzeros.to(torch.int32).cpu())
            if bool((stored != 7).any()):
                raise ValueError(
                    f"{name}: qzeros must all be 7 (symmetric GPTQ, zero point 8); asymmetric "
                    "GPTQ checkpoints are not supported"
                )
        k, n = self.in_features, self.out_features
        _check_tensor_shape(name, "qweight", qweight, (k // 8, n))
        _check_tensor_shape(name, "scales", scales, tuple(self.weight_scale.shape))
        device = self.weight.device
        packed, perm = _package.gptq_repack(
            qweight.to(device), None if g_idx is None else g_idx.to(device)
        )
        self.weight.copy_(packed)
        self.weight_scale.copy_(scales)
        self.perm = perm
        return self._load_bias(name, bias)

    @torch.no_grad()
    def load_awq(
        self,
        qweight: torch.Tensor,
        qzeros: torch.Tensor,
        scales: torch.Tensor,
        bias: Optional[torch.Tensor] = None,
    ) -> "QuantizedLinear":
        """Load an AWQ checkpoint's tensors (``qweight`` int32 [K, N / 8], ``qzeros`` int32
        [K / group, N / 8], ``scales`` [K / group, N]) into this ``int4`` layer with zero points;
        returns the layer."""
        name = "QuantizedLinear.load_awq"
        self._check_int4_load(name, zero_point=True)
        k, n = self.in_features, self.out_features
        groups = self.weight_scale.shape[0]
        _check_tensor_shape(name, "qweight", qweight, (k, n // 8))
        _check_tensor_shape(name, "qzeros", qzeros, (groups, n // 8))
        _check_tensor_shape(name, "scales", scales, (groups, n))
        device = self.weight.device
        self.weight.copy_(_package.awq_repack(qweight.to(device)))
        self.weight_zero.copy_(_package.awq_zeros(qzeros.to(device), self.weight_zero.dtype))
        self.weight_scale.copy_(scales)
        self.perm = None
        return self._load_bias(name, bias)

    def _check_int4_load(self, name: str, zero_point: bool) -> None:
        if self.quant != "int4" or self.zero_point != zero_point:
            want = "with zero_point=True" if zero_point else "with zero_point=False"
            raise ValueError(
                f"{name}: needs a quant='int4' layer {want}, got quant={self.quant!r}, "
                f"zero_point={self.zero_point}"
            )

    def _load_bias(self, name: str, bias: Optional[torch.Tensor]) -> "QuantizedLinear":
        if (bias is None) != (self.bias is None):
            raise ValueError(f"{name}: bias must be given exactly when the layer has one")
        if bias is not None:
            _check_tensor_shape(name, "bias", bias, (self.out_features,))
            self.bias.copy_(bias)
        return self

    def _apply(self, fn, recurse=True):
        # nn.Module.to(dtype) / .half() / .float() cast every floating-point tensor, fp8 included:
        # they would turn the weight into floats and round the scales. Move those buffers only.
        kept = {}
        for name in ("weight", "weight_scale", "weight_zero", "input_scale"):
            buf = self._buffers.get(name)
            if buf is not None:
                kept[name] = buf
        super()._apply(fn, recurse)
        for name, before in kept.items():
            after = self._buffers[name]
            if after.dtype != before.dtype:
                self._buffers[name] = before.to(after.device)
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # An act-order int4 state carries perm: a layer without one takes it.
        if self.quant == "int4" and self.perm is None and prefix + "perm" in state_dict:
            self.perm = torch.zeros(self.in_features, dtype=torch.int32, device=self.weight.device)
        # A calibrated (static) state loads into a layer built dynamic: it becomes static.
        if self.input_scale is None and prefix + "input_scale" in state_dict:
            if self.quant == "fp8_block":
                raise ValueError(
                    "QuantizedLinear.load_state_dict: an input_scale does not apply to "
                    "quant='fp8_block' (dynamic 1x128 groups)"
                )
            self.input_scale = torch.ones(1, dtype=torch.float32, device=self.weight.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        if self.quant == "int4":
            return (
                f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, quant=int4, group_size={self.group_size}, "
                f"zero_point={self.zero_point}, act_order={self.perm is not None}, "
                f"activation={self.activation}, dtype={_dtype_name(self.dtype)}"
            )
        scales = "dynamic" if self.input_scale is None else "static"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, quant={self.quant}, activation={self.activation}, "
            f"input_scale={scales}, dtype={_dtype_name(self.dtype)}"
        )


# The act_fn classes of transformers' and torch's gated MLPs, by class name, and the fused
# epilogue that computes them (exact gelu and its tanh form are different functions).
_GATED_ACTIVATIONS = {
    "SiLU": "silu",
    "SiLUActivation": "silu",
    "GELUTanh": "gelu_tanh",
    "PytorchGELUTanh": "gelu_tanh",
    "GELUActivation": "gelu",
}


def gated_activation(act_fn: nn.Module) -> Optional[str]:
    """The epilogue name of a gated MLP's ``act_fn`` module, or None when no fused epilogue
    computes it."""
    if isinstance(act_fn, nn.GELU):
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(act_fn.approximate)
    return _GATED_ACTIVATIONS.get(type(act_fn).__name__)


class QuantizedGatedMLP(nn.Module):
    """A gated MLP, ``down(act(x @ gate.T + b_g) * (x @ up.T + b_u))``, in two int4 kernels:
    gate and up as one weight through ``w4a16_gemm_gated`` (the activation and the product in
    its epilogue, so the [..., 2 I] product is never written), then ``down``.

    ``gate_up`` is an int4 ``QuantizedLinear(hidden, 2 I)`` holding gate and up interleaved in
    blocks of 64 output features (``pack_gate_up``'s order; its own forward would return the
    product without the epilogue), ``down`` an int4 ``QuantizedLinear(I, hidden)``. I must be a
    multiple of 64. ``forward(x)``: x ``[..., hidden]`` -> ``[..., hidden]`` of x's dtype.
    """

    def __init__(
        self,
        hidden_features: int,
        intermediate_features: int,
        activation: str = "silu",
        *,
        bias: bool = False,
        group_size: int = 128,
        zero_point: bool = False,
        device=None,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS[1:]:
            raise ValueError(
                f"QuantizedGatedMLP: activation must be one of {ACTIVATIONS[1:]}, got "
                f"{activation!r}"
            )
        args = dict(quant="int4", group_size=group_size, zero_point=zero_point, device=device)
        self.gate_up = QuantizedLinear(
            hidden_features, 2 * intermediate_features, bias=bias, dtype=dtype, **args
        )
        self.down = QuantizedLinear(
            intermediate_features, hidden_features, bias=bias, dtype=dtype, **args
        )
        self.hidden_features = hidden_features
        self.intermediate_features = intermediate_features
        self.activation = activation

    @classmethod
    def from_linears(
        cls,
        gate: nn.Linear,
        up: nn.Linear,
        down: nn.Linear,
        activation: str = "silu",
        *,
        group_size: int = 128,
        zero_point: bool = False,
        dtype: Optional[torch.dtype] = None,
    ) -> "QuantizedGatedMLP":
        """The MLP of `gate`, `up` and `down` (nn.Linear, biases on all three or on none),
        quantized to nearest in groups of `group_size` on their device. Gate and up are
        quantized as they are (each output feature's groups on its own), then interleaved."""
        name = "QuantizedGatedMLP.from_linears"
        for arg, linear in (("gate", gate), ("up", up), ("down", down)):
            if not isinstance(linear, nn.Linear):
                raise TypeError(
                    f"{name}: {arg} must be a torch.nn.Linear, got {type(linear).__name__}"
                )
        if gate.weight.shape != up.weight.shape or down.weight.shape != gate.weight.t().shape:
            raise ValueError(
                f"{name}: gate and up must be [I, H] and down [H, I], got gate "
                f"{list(gate.weight.shape)}, up {list(up.weight.shape)}, down "
                f"{list(down.weight.shape)}"
            )
        biases = [lin.bias is not None for lin in (gate, up, down)]
        if any(biases) and not all(biases):
            raise ValueError(f"{name}: gate, up and down must all have a bias or none")
        if dtype is None:
            dtype = gate.weight.dtype if gate.weight.dtype in OUT_DTYPES else torch.bfloat16
        layer = cls(
            gate.in_features,
            gate.out_features,
            activation,
            bias=all(biases),
            group_size=group_size,
            zero_point=zero_point,
            device=gate.weight.device,
            dtype=dtype,
        )
        bias = _package.pack_gate_up(gate.bias, up.bias) if gate.bias is not None else None
        layer.gate_up.quantize_from_float(_package.pack_gate_up(gate.weight, up.weight), bias)
        layer.down.quantize_from_float(down.weight, down.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 1 or x.shape[-1] != self.hidden_features:
            raise ValueError(
                f"QuantizedGatedMLP.forward: x must have shape [..., {self.hidden_features}], "
                f"got {list(x.shape)}"
            )
        if x.dtype not in INPUT_DTYPES:
            raise ValueError(
                f"QuantizedGatedMLP.forward: x must be bfloat16, float16 or float32, got "
                f"{_dtype_name(x.dtype)}"
            )
        g = self.gate_up
        rows = x.reshape(-1, self.hidden_features).to(g.weight_scale.dtype)
        bias = g.bias.to(rows.dtype) if g.bias is not None else None
        h = _package.w4a16_gemm_gated(
            rows, g.weight, g.weight_scale, g.weight_zero, g.perm, bias, self.activation
        )
        return self.down(h).to(x.dtype).reshape(*x.shape[:-1], self.hidden_features)

    def extra_repr(self) -> str:
        return (
            f"hidden_features={self.hidden_features}, "
            f"intermediate_features={self.intermediate_features}, activation={self.activation!r}"
        )


def _gated_mlp_parts(module: nn.Module) -> Optional[Tuple[nn.Linear, nn.Linear, nn.Linear, str]]:
    """(gate_proj, up_proj, down_proj, activation) of a transformers-style gated MLP that
    QuantizedGatedMLP.from_linears takes (plain nn.Linear projections of [I, H], [I, H] and
    [H, I], biases on all three or none, an act_fn with a fused epilogue), else None."""
    parts = [getattr(module, attr, None) for attr in ("gate_proj", "up_proj", "down_proj")]
    if not all(type(lin) is nn.Linear for lin in parts):
        return None
    gate, up, down = parts
    if up.weight.shape != gate.weight.shape or down.weight.shape != gate.weight.t().shape:
        return None
    if len({lin.bias is None for lin in parts}) != 1:
        return None
    act = getattr(module, "act_fn", None)
    activation = gated_activation(act) if isinstance(act, nn.Module) else None
    return None if activation is None else (*parts, activation)


def _check_tensor_shape(name: str, arg: str, t, expected: Tuple[int, ...]) -> None:
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(expected):
        got = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name}: {arg} must have shape {list(expected)}, got {got}")


@dataclass
class ReplaceReport:
    """What ``replace_linear_with_quantized`` did: the qualified names of the modules it
    replaced, and of those it left, each with the reason."""

    replaced: Tuple[str, ...] = ()
    skipped: Dict[str, str] = field(default_factory=dict)

    @property
    def num_replaced(self) -> int:
        return len(self.replaced)

    @property
    def num_skipped(self) -> int:
        return len(self.skipped)

    def __str__(self) -> str:
        lines = [f"replaced {self.num_replaced} linear(s), skipped {self.num_skipped}"]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


def _skip_reason(
    name: str, module: nn.Module, quant: str, skip: Tuple[str, ...], group_size: int = 128
) -> Optional[str]:
    matched = [pattern for pattern in skip if pattern in name]
    if matched:
        return f"name matches skip pattern {matched[0]!r}"
    if type(module) is not nn.Linear:
        # Subclasses (nn.MultiheadAttention's out_proj) are read by their owner, not called.
        return f"a subclass of nn.Linear ({type(module).__name__})"
    if not module.weight.is_floating_point() or module.weight.device.type == "meta":
        return f"weight of {module.weight.dtype} on {module.weight.device} (not a float weight)"
    return shape_problem(module.in_features, module.out_features, quant, group_size)


@torch.no_grad()
def replace_linear_with_quantized(
    model: nn.Module,
    quant: str = "fp8",
    *,
    skip: Iterable[str] = ("lm_head",),
    dtype: Optional[torch.dtype] = None,
    group_size: int = 128,
    zero_point: bool = False,
    fuse_gated_mlp: bool = False,
) -> ReplaceReport:
    """Replace, in place, every ``torch.nn.Linear`` of `model` by a ``QuantizedLinear`` with its
    weight and bias quantized (``quant``: ``"fp8"``, ``"int8"`` or ``"fp8_block"``, dynamic
    activation scales that ``calibrate_input_scales`` makes static; or ``"int4"`` with
    ``group_size`` and ``zero_point``, rounded to nearest); returns a ``ReplaceReport``. Prints
    nothing.

    ``fuse_gated_mlp`` (``int4`` only): first replace each transformers-style gated MLP (a module
    with nn.Linear ``gate_proj``, ``up_proj`` and ``down_proj`` and an ``act_fn`` of silu, gelu
    or tanh-gelu, as Llama's, Qwen3's, Mistral's and Gemma's) by a ``QuantizedGatedMLP``: two
    kernels where the unfused MLP runs three GEMMs and the activation. The report names the MLP
    module; an MLP whose shapes or name keep it out stays a module of linears.

    Left as they are, with the reason in the report: modules whose qualified name contains one
    of the ``skip`` substrings (default: ``lm_head``, whose logits are the most sensitive),
    subclasses of nn.Linear, and linears whose shape the GEMM cannot take (K or N not a multiple
    of 16; ``fp8_block``: K not a multiple of 128; ``int4``: N not a multiple of 64 or K not one
    of 16 and of the group). ``dtype``: as in ``QuantizedLinear.from_linear``.
    """
    name = "replace_linear_with_quantized"
    if not isinstance(model, nn.Module):
        raise TypeError(f"{name}: model must be a torch.nn.Module, got {type(model).__name__}")
    if quant not in QUANT_MODES:
        raise ValueError(f"{name}: quant must be one of {QUANT_MODES}, got {quant!r}")
    if quant == "int4" and group_size not in INT4_GROUP_SIZES:
        raise ValueError(
            f"{name}: group_size must be one of {INT4_GROUP_SIZES}, got {group_size!r}"
        )
    if fuse_gated_mlp and quant != "int4":
        raise ValueError(f"{name}: fuse_gated_mlp needs quant='int4', got {quant!r}")
    int4_args = {"group_size": group_size, "zero_point": zero_point} if quant == "int4" else {}
    if isinstance(skip, str):
        skip = (skip,)
    skip = tuple(skip)
    replaced, skipped = [], {}
    for qualified, module in list(model.named_modules()) if fuse_gated_mlp else ():
        parts = _gated_mlp_parts(module) if qualified else None
        if parts is None:
            continue
        gate, up, down, activation = parts
        # Every projection must fit on its own (the gated form needs I a multiple of 64 too).
        problems = [
            _skip_reason(f"{qualified}.{attr}", lin, quant, skip, group_size)
            for attr, lin in (("gate_proj", gate), ("up_proj", up), ("down_proj", down))
        ]
        if any(problems):
            continue  # the linear walk below reports each projection it leaves
        parent_name, _, child = qualified.rpartition(".")
        fused = QuantizedGatedMLP.from_linears(
            gate, up, down, activation, dtype=dtype, group_size=group_size, zero_point=zero_point
        )
        setattr(model.get_submodule(parent_name), child, fused)
        replaced.append(qualified)
    for qualified, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or not qualified:
            continue
        reason = _skip_reason(qualified, module, quant, skip, group_size)
        if reason is not None:
            skipped[qualified] = reason
            continue
        parent_name, _, child = qualified.rpartition(".")
        parent = model.get_submodule(parent_name)
        layer = QuantizedLinear.from_linear(module, quant=quant, dtype=dtype, **int4_args)
        setattr(parent, child, layer)
        replaced.append(qualified)
    return ReplaceReport(tuple(replaced), skipped)


@contextlib.contextmanager
def calibrate_input_scales(model: nn.Module) -> Iterator[Dict[str, float]]:
    """Record the activation amax of every ``fp8`` / ``int8`` QuantizedLinear of `model` over
    the forward passes run inside the block, then make its activation scale static:
    ``input_scale = amax / 448`` (fp8, floored at 1 / (448 * 512)) or ``amax / 127`` (int8).

        with quant.calibrate_input_scales(model) as scales:
            for batch in batches:
                model(**batch)
        # scales: {qualified name: input_scale}

    Inside the block the layers run with dynamic scales (a layer already static included). A
    layer no forward reached keeps its previous scale (the block raises ValueError when no
    layer was reached); on an exception nothing changes. ``fp8_block`` and ``int4`` layers are
    left out.
    """
    name = "calibrate_input_scales"
    if not isinstance(model, nn.Module):
        raise TypeError(f"{name}: model must be a torch.nn.Module, got {type(model).__name__}")
    layers = {
        qualified: module
        for qualified, module in model.named_modules()
        if isinstance(module, QuantizedLinear) and module.quant in ("fp8", "int8")
    }
    if not layers:
        raise ValueError(f"{name}: the model has no fp8 or int8 QuantizedLinear to calibrate")
    amax: Dict[str, torch.Tensor] = {}
    previous = {qualified: layer.input_scale for qualified, layer in layers.items()}

    def recorder(qualified):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs["x"]
            seen = x.detach().abs().amax().float()
            amax[qualified] = (
                seen if qualified not in amax else torch.maximum(amax[qualified], seen)
            )

        return hook

    handles = [
        layer.register_forward_pre_hook(recorder(q), with_kwargs=True)
        for q, layer in layers.items()
    ]
    scales: Dict[str, float] = {}
    try:
        for layer in layers.values():
            layer.input_scale = None
        yield scales
    except BaseException:
        for qualified, layer in layers.items():
            layer.input_scale = previous[qualified]
        raise
    finally:
        for handle in handles:
            handle.remove()
    for qualified, layer in layers.items():
        if qualified not in amax:
            layer.input_scale = previous[qualified]
            continue
        top = FP8_MAX if layer.quant == "fp8" else INT8_MAX
        scale = (amax[qualified] / top).clamp(min=SCALE_FLOOR).reshape(1)
        layer.input_scale = scale.to(device=layer.weight.device, dtype=torch.float32)
        scales[qualified] = float(scale)
    if not scales:
        raise ValueError(f"{name}: no forward pass inside the block reached a QuantizedLinear")


@torch.no_grad()
def load_int4_checkpoint(
    model: nn.Module, state_dict: Dict[str, torch.Tensor], fmt: str
) -> Tuple[str, ...]:
    """Load a GPTQ (``fmt="gptq"``: ``<name>.qweight``, ``.scales``, ``.g_idx``, ``.qzeros``) or
    AWQ (``fmt="awq"``: ``.qweight``, ``.qzeros``, ``.scales``) state_dict into every ``int4``
    QuantizedLinear of `model` that it has a ``qweight`` for (``.bias`` too when the layer has
    one); returns the names loaded. Build the layers first, e.g. ``replace_linear_with_quantized
    (model, "int4", group_size=..., zero_point=fmt == "awq")`` on the float model."""
    name = "load_int4_checkpoint"
    if fmt not in ("gptq", "awq"):
        raise ValueError(f'{name}: fmt must be "gptq" or "awq", got {fmt!r}')
    loaded = []
    for qualified, layer in model.named_modules():
        if not isinstance(layer, QuantizedLinear) or layer.quant != "int4":
            continue
        key = f"{qualified}." if qualified else ""
        if key + "qweight" not in state_dict:
            continue
        bias = state_dict.get(key + "bias") if layer.bias is not None else None
        if fmt == "gptq":
            layer.load_gptq(
                state_dict[key + "qweight"],
                state_dict[key + "scales"],
                state_dict.get(key + "g_idx"),
                state_dict.get(key + "qzeros"),
                bias,
            )
        else:
            layer.load_awq(
                state_dict[key + "qweight"],
                state_dict[key + "qzeros"],
                state_dict[key + "scales"],
                bias,
            )
        loaded.append(qualified)
    return tuple(loaded)
