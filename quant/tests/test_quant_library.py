"""torch.library conformance of the quantize ops: opcheck on every raw op, torch.compile
(fullgraph) parity of the public functions, no recompiles across token counts, CUDA-graph
capture (GPU only)."""

import pytest
import torch
from quant_op_conformance import assert_only_declared_arguments_change, opcheck_all
from test_quant_ops import assert_bitwise, fp8_capable, make_input


@pytest.fixture
def fp8_device(device):
    if not fp8_capable(device):
        pytest.skip("float8_e4m3fn needs compute capability 8.9")
    return device


def _raw_cases(device):
    """(op name, args) for every raw op, with the optional arguments both given and not."""
    x = make_input((5, 64), torch.bfloat16, device)
    f8 = lambda: torch.empty(5, 64, dtype=torch.float8_e4m3fn, device=device)  # noqa: E731
    i8 = lambda: torch.empty(5, 64, dtype=torch.int8, device=device)  # noqa: E731
    one = torch.tensor([0.5], device=device)
    scales = lambda: torch.empty(5, 1, device=device)  # noqa: E731
    zps = torch.empty(5, 1, dtype=torch.int32, device=device)
    azp = torch.tensor([3], dtype=torch.int32, device=device)
    return [
        ("static_scaled_fp8_quant", (f8(), x, one)),
        ("dynamic_scaled_fp8_quant", (f8(), x, torch.empty(1, device=device))),
        ("dynamic_per_token_scaled_fp8_quant", (f8(), x, scales(), None)),
        ("dynamic_per_token_scaled_fp8_quant", (f8(), x, scales(), one)),
        ("static_scaled_int8_quant", (i8(), x, one, None)),
        ("static_scaled_int8_quant", (i8(), x, one, azp)),
        ("dynamic_scaled_int8_quant", (i8(), x, scales(), None)),
        ("dynamic_scaled_int8_quant", (i8(), x, scales(), zps)),
        (
            "per_token_group_fp8_quant",
            (x, f8(), torch.empty(5, 2, device=device), 32, 1e-10, -448.0, 448.0, False),
        ),
        (
            "per_token_group_fp8_quant",
            (x, f8(), torch.empty(2, 5, device=device).t(), 32, 1e-10, -448.0, 448.0, True),
        ),
    ]


@pytest.mark.kernels_ci
def test_opcheck_raw_ops(kernel, fp8_device):
    opcheck_all(kernel, _raw_cases(fp8_device))


@pytest.mark.kernels_ci
def test_only_declared_arguments_change(kernel, fp8_device):
    assert_only_declared_arguments_change(kernel, _raw_cases(fp8_device))


def _all_modes(kernel, x, static_scale, azp):
    """Every public function and mode, for one input."""
    return (
        kernel.scaled_fp8_quant(x, static_scale),
        kernel.scaled_fp8_quant(x),
        kernel.scaled_fp8_quant(x, use_per_token_if_dynamic=True, scale_ub=static_scale),
        kernel.scaled_fp8_quant(x, num_token_padding=x.shape[0] + 3, use_per_token_if_dynamic=True),
        kernel.scaled_int8_quant(x, static_scale),
        kernel.scaled_int8_quant(x, static_scale, azp, symmetric=False),
        kernel.scaled_int8_quant(x),
        kernel.scaled_int8_quant(x, symmetric=False),
        kernel.per_token_group_quant_fp8(x, 32),
        kernel.per_token_group_quant_fp8(x, 32, column_major_scales=True),
        kernel.fp8_act_quant(x, 64),
    )


def _flat(results):
    return [t for r in results for t in r if isinstance(t, torch.Tensor)]


@pytest.mark.kernels_ci
def test_compile_fullgraph_parity(kernel, fp8_device):
    torch._dynamo.reset()
    x = make_input((6, 128), torch.bfloat16, fp8_device)
    scale = torch.tensor([0.25], device=fp8_device)
    azp = torch.tensor([-7], dtype=torch.int32, device=fp8_device)
    eager = _flat(_all_modes(kernel, x, scale, azp))
    compiled = torch.compile(
        lambda x, s, z: _all_modes(kernel, x, s, z), fullgraph=True, backend="aot_eager"
    )
    got = _flat(compiled(x, scale, azp))
    assert len(got) == len(eager)
    for g, e in zip(got, eager):
        if g.shape[0] == x.shape[0] + 3:  # the padding rows are uninitialized
            g, e = g[: x.shape[0]], e[: x.shape[0]]
        assert_bitwise(g.contiguous(), e.contiguous())


def test_compile_inductor_no_recompile(kernel, fp8_device):
    """Inductor, dynamic token counts: one graph serves every count."""
    torch._dynamo.reset()

    def fn(x):
        q, s = kernel.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
        g, gs = kernel.per_token_group_quant_fp8(x, 64)
        return q, s, g, gs

    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for tokens in (3, 17, 64):
            x = make_input((tokens, 128), torch.float16, fp8_device, seed=tokens)
            for g, e in zip(compiled(x), fn(x)):
                assert_bitwise(g, e)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_capture(kernel, fp8_device):
    """Every mode captures (no host sync, no allocation beyond the outputs) and replays with
    fresh input values, matching eager."""
    x = make_input((9, 256), torch.bfloat16, fp8_device)
    scale = torch.tensor([0.25], device=fp8_device)
    azp = torch.tensor([-7], dtype=torch.int32, device=fp8_device)
    _all_modes(kernel, x, scale, azp)  # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _flat(_all_modes(kernel, x, scale, azp))
    x.copy_(make_input((9, 256), torch.bfloat16, fp8_device, seed=11))
    graph.replay()
    torch.cuda.synchronize()
    for g, e in zip(captured, _flat(_all_modes(kernel, x, scale, azp))):
        if g.shape[0] == x.shape[0] + 3:
            g, e = g[: x.shape[0]], e[: x.shape[0]]
        assert_bitwise(g.contiguous(), e.contiguous())
