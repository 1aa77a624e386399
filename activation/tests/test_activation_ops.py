"""Values, layouts, backward, calling conventions and input validation of the activation ops.

Every check compares the built kernel (`kernel` fixture) with the float64 reference of
`kernel._reference`, under the tolerance table of activation_cases.py. Outputs are pre-filled
with NaN, so an element the kernel does not write fails the bound.
"""

import pytest
import torch
from activation_cases import (
    ALL_NAMES,
    CASE_IDS,
    CASES,
    DEFAULT_CASE_IDS,
    DEFAULT_CASES,
    DTYPES,
    GATED_NAMES,
    assert_within_bound,
    magnitude,
    make_input,
)
from activation_fixture import assert_autograd_routes_agree, run_in_fresh_process

NAN = float("nan")

# (leading dims, output width): 1-D to 4-D inputs, odd and prime widths and token counts,
# one wide row (several CPU chunks), and enough rows for every thread.
SHAPES = [
    ((), 1),
    ((), 127),
    ((1,), 4097),
    ((7,), 13),
    ((13,), 7),
    ((83,), 127),
    ((3, 5), 13),
    ((2, 3, 4), 7),
    ((1, 1, 1), 1),
    ((2, 3), 1031),
]
BWD_SHAPES = [((), 1), ((7,), 13), ((3, 5), 127), ((2, 3, 4), 7), ((5,), 4097)]


def _shape_id(shape):
    leading, width = shape
    return "x".join(str(s) for s in leading + (width,))


def _nan_like_shape(shape, dtype, device):
    return torch.full(shape, NAN, dtype=dtype, device=device)


def _reference_grad(case, kernel, x, grad_out):
    """d(sum(grad_out * ref(x))) / dx by float64 autograd of the reference."""
    x64 = x.detach().double().requires_grad_()
    (grad,) = torch.autograd.grad(case.reference(kernel, x64), x64, grad_out.double())
    return grad


# ---- forward ----


@pytest.mark.parametrize("shape", SHAPES, ids=[_shape_id(s) for s in SHAPES])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_forward(kernel, device, case, dtype, shape):
    leading, width = shape
    x = make_input(case.input_shape(leading, width), dtype, device)
    out = _nan_like_shape(case.out_shape(x.shape), dtype, device)
    assert case.call(kernel, out, x) is out
    assert_within_bound(out, case.reference(kernel, x), magnitude(case, x), f"{case.id} {dtype}")
    # The allocating form runs the same kernel.
    torch.testing.assert_close(case.call(kernel, x), out, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", DEFAULT_CASES, ids=DEFAULT_CASE_IDS)
def test_forward_beyond_one_wave(kernel, device, case, dtype):
    # CUDA: more 16-byte vectors than the device has resident threads, so the unary forward takes
    # two vectors per thread (one below that); an odd width leaves a tail.
    if device == "cpu":
        width = 100_003
    else:
        props = torch.cuda.get_device_properties(device)
        vec = 16 // torch.empty((), dtype=dtype).element_size()
        resident = props.multi_processor_count * props.max_threads_per_multi_processor
        width = resident * vec * 3 // 2 + 5
    x = make_input(case.input_shape((), width), dtype, device)
    out = _nan_like_shape(case.out_shape(x.shape), dtype, device)
    case.call(kernel, out, x)
    assert_within_bound(out, case.reference(kernel, x), magnitude(case, x), f"{case.id} {dtype}")


def _narrow_capacity(device):
    """Thread items that the CUDA forward runs on 4-byte vectors (fp16/bf16, one 128-thread CTA
    per SM at most); CPU: an H100's figure, for the same shapes."""
    sms = 132 if device == "cpu" else torch.cuda.get_device_properties(device).multi_processor_count
    return sms * 128


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_forward_narrow_vector_boundary(kernel, device, case, dtype):
    # fp16/bf16 forwards on the vector path take 2-element vectors up to one CTA per SM of
    # them, 16-byte vectors beyond: widths at the boundary and one vector past it, with and
    # without a tail (unary rows are one long row when contiguous), and row-strided rows.
    cap = _narrow_capacity(device)
    if case.gated:
        widths = [2 * cap, 2 * cap + 8, 1000]  # the split layout vectorizes multiples of 8 only
    else:
        widths = [2 * cap - 1, 2 * cap, 2 * cap + 3]
    for width in widths:
        rows = 3 if width == 1000 else 1
        x = make_input(case.input_shape((rows,), width), dtype, device)
        out = _nan_like_shape(case.out_shape(x.shape), dtype, device)
        case.call(kernel, out, x)
        assert_within_bound(
            out, case.reference(kernel, x), magnitude(case, x), f"{case.id} {dtype} {rows}x{width}"
        )
    in_width = case.input_shape((), 1000 if case.gated else 1001)[-1]
    x = make_input((3, in_width + (-in_width) % 8 + 8), dtype, device)[:, :in_width]  # aligned rows
    out_width = case.out_shape((in_width,))[-1]
    out_buf = _nan_like_shape((3, out_width + (-out_width) % 8 + 8), dtype, device)
    out = out_buf[:, :out_width]
    case.call(kernel, out, x)
    assert_within_bound(
        out, case.reference(kernel, x), magnitude(case, x), f"{case.id} {dtype} strided rows"
    )
    assert out_buf[:, out_width:].isnan().all()


# The first calls of a fresh process, made inside a CUDA-graph capture: their host code (the
# cached device shape that picks the vector width) must not break the capture. A 1-token gated
# forward (narrow vectors), a unary forward past one wave (two vectors per thread) and a backward;
# the replayed graph must equal eager calls made afterwards.
_FIRST_CALLS_IN_CAPTURE = r"""
import kernels, torch
k = kernels.get_kernel("open-kernels/activation", version=1)
props = torch.cuda.get_device_properties(0)
gen = torch.Generator(device="cuda").manual_seed(0)
x1 = torch.randn(1, 2 * 14336, device="cuda", dtype=torch.bfloat16, generator=gen)
xw = torch.randn(props.multi_processor_count * props.max_threads_per_multi_processor * 8 * 2,
                 device="cuda", dtype=torch.bfloat16, generator=gen)
g = torch.randn(1, 14336, device="cuda", dtype=torch.bfloat16, generator=gen)
o1, ow = torch.full((1, 14336), float("nan"), device="cuda", dtype=torch.bfloat16), torch.full_like(xw, float("nan"))
gi = torch.full_like(x1, float("nan"))
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    k.gelu_and_mul(o1, x1)
    k.silu(ow, xw)
    k.ops.silu_and_mul_bwd(gi, g, x1)
graph.replay()
torch.cuda.synchronize()
assert torch.equal(o1, k.gelu_and_mul(x1)) and torch.equal(ow, k.silu(xw))
ref = torch.empty_like(x1)
k.ops.silu_and_mul_bwd(ref, g, x1)
assert torch.equal(gi, ref)
print("ok")
"""


def test_first_calls_inside_graph_capture(kernel, device):
    if device == "cpu":
        pytest.skip("CUDA graphs")
    run_in_fresh_process(_FIRST_CALLS_IN_CAPTURE)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_forward_ci(kernel, device, case, dtype):
    x = make_input(case.input_shape((7, 3), 127), dtype, device)
    out = _nan_like_shape(case.out_shape(x.shape), dtype, device)
    case.call(kernel, out, x)
    assert_within_bound(out, case.reference(kernel, x), magnitude(case, x), f"{case.id} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", DEFAULT_CASES, ids=DEFAULT_CASE_IDS)
def test_special_values(kernel, device, case, dtype):
    # Signed zeros, tiny values, the swigluoai limit, and magnitudes where exp/tanh/erf saturate
    # (exp(90) overflows fp32): no NaN or inf where the reference is finite.
    values = torch.tensor(
        [0.0, -0.0, 1e-3, -1e-3, 30.0, -30.0, 90.0, -90.0, 7.0, -7.0], dtype=torch.float32
    )
    x = values.repeat(2 if case.gated else 1).to(device=device, dtype=dtype)
    out = _nan_like_shape(case.out_shape(x.shape), dtype, device)
    case.call(kernel, out, x)
    assert_within_bound(out, case.reference(kernel, x), magnitude(case, x), f"{case.id} {dtype}")


# ---- backward ----


@pytest.mark.parametrize("shape", BWD_SHAPES, ids=[_shape_id(s) for s in BWD_SHAPES])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_backward(kernel, device, case, dtype, shape):
    leading, width = shape
    x = make_input(case.input_shape(leading, width), dtype, device).requires_grad_()
    y = case.call(kernel, x)
    grad_out = make_input(y.shape, dtype, device, scale=1.0, seed=1)
    (grad,) = torch.autograd.grad(y, x, grad_out)
    assert grad.dtype == dtype and grad.shape == x.shape
    ref = _reference_grad(case, kernel, x, grad_out)
    assert_within_bound(grad, ref, magnitude(case, x.detach(), grad_out), f"{case.id} {dtype} grad")
    # The out-param backward op writes every element (NaN sentinel) with the same values.
    grad_input = _nan_like_shape(x.shape, dtype, device)
    case.call_op(kernel, "_bwd", grad_input, grad_out, x.detach())
    torch.testing.assert_close(grad_input, grad, rtol=0, atol=0)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_eager_autograd_route_matches_the_custom_op(kernel, device, case):
    """Eager calls that autograd records skip the custom op's autograd layer (its host time:
    _eager_path) and give the op's results, the module layers' included."""
    x = make_input(case.input_shape((3, 2), 24), torch.bfloat16, device).requires_grad_()
    eager_name = "".join(part.title() for part in case.name.split("_")) + "Eager"
    assert_autograd_routes_agree(lambda: case.call(kernel, x), (x,), eager_name)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_gradcheck(kernel, device, case):
    x = make_input(case.input_shape((3, 2), 5), torch.float64, device, scale=2.0).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: case.call(kernel, t), (x,))


# ---- layouts ----


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", DEFAULT_CASES, ids=DEFAULT_CASE_IDS)
def test_strided_views(kernel, device, case, dtype):
    # Input and out are column slices of wider buffers (row stride != width, offset base), and
    # row-strided slices (every other row). Padding outside the out view must stay NaN.
    leading, width = (5, 3), 13
    in_width = case.input_shape((), width)[-1]
    out_width = case.out_shape((in_width,))[-1]
    x_buf = make_input(leading + (in_width + 7,), dtype, device)
    out_buf = _nan_like_shape(leading + (out_width + 5,), dtype, device)
    x, out = x_buf[..., 3 : 3 + in_width], out_buf[..., 2 : 2 + out_width]
    case.call(kernel, out, x)
    assert_within_bound(
        out, case.reference(kernel, x), magnitude(case, x), f"{case.id} {dtype} column slice"
    )
    assert out_buf[..., :2].isnan().all() and out_buf[..., 2 + out_width :].isnan().all()

    x_rows = make_input((10, in_width), dtype, device, seed=2)[::2]
    out_buf = _nan_like_shape((10, out_width), dtype, device)
    out = out_buf[1::2]
    case.call(kernel, out, x_rows)
    assert_within_bound(
        out, case.reference(kernel, x_rows), magnitude(case, x_rows), f"{case.id} {dtype} rows"
    )
    assert out_buf[0::2].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", DEFAULT_CASES, ids=DEFAULT_CASE_IDS)
def test_strided_views_backward(kernel, device, case, dtype):
    leading, width = (4, 3), 13
    in_width = case.input_shape((), width)[-1]
    out_width = case.out_shape((in_width,))[-1]
    x = make_input(leading + (in_width + 5,), dtype, device)[..., 1 : 1 + in_width]
    grad_out = make_input(leading + (out_width + 3,), dtype, device, scale=1.0, seed=1)[..., 3:]
    gi_buf = _nan_like_shape(leading + (in_width + 4,), dtype, device)
    grad_input = gi_buf[..., 2 : 2 + in_width]
    case.call_op(kernel, "_bwd", grad_input, grad_out, x)
    ref = _reference_grad(case, kernel, x, grad_out)
    assert_within_bound(grad_input, ref, magnitude(case, x, grad_out), f"{case.id} {dtype} grad")
    assert gi_buf[..., :2].isnan().all() and gi_buf[..., 2 + in_width :].isnan().all()


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", DEFAULT_CASES, ids=DEFAULT_CASE_IDS)
def test_non_collapsible_inputs(kernel, device, case, dtype):
    # Read tensors that do not fit one row stride are read through a contiguous copy.
    in_width = case.input_shape((), 13)[-1]
    views = {
        "transposed leading dims": make_input((4, 3, in_width), dtype, device).transpose(0, 1),
        "last-dim stride 2": make_input((5, 2 * in_width), dtype, device)[:, ::2],
        "broadcast rows (stride 0)": make_input((1, in_width), dtype, device).expand(6, in_width),
        "permuted 4-D": make_input((2, 3, 2, in_width), dtype, device).permute(2, 0, 1, 3),
    }
    for what, x in views.items():
        out = _nan_like_shape(case.out_shape(x.shape), dtype, device)
        case.call(kernel, out, x)
        assert_within_bound(out, case.reference(kernel, x), magnitude(case, x), f"{case.id} {what}")
        grad_out = (
            make_input(out.shape, dtype, device, scale=1.0, seed=1)
            .transpose(0, -1)
            .contiguous()
            .transpose(0, -1)
        )
        grad_input = _nan_like_shape(x.shape, dtype, device)
        case.call_op(kernel, "_bwd", grad_input, grad_out, x)
        ref = _reference_grad(case, kernel, x, grad_out)
        assert_within_bound(grad_input, ref, magnitude(case, x, grad_out), f"{case.id} {what} grad")


@pytest.mark.kernels_ci
@pytest.mark.parametrize("shape", [(0, 16), (2, 0, 6), (3, 0), (0,)], ids=str)
@pytest.mark.parametrize("case", DEFAULT_CASES, ids=DEFAULT_CASE_IDS)
def test_empty(kernel, device, case, shape):
    x = torch.empty(shape, device=device, requires_grad=True)
    out = torch.empty(case.out_shape(shape), device=device)
    assert case.call(kernel, out, x.detach()) is out
    y = case.call(kernel, x)
    assert y.shape == case.out_shape(shape)
    (grad,) = torch.autograd.grad(y, x, torch.empty_like(y))
    assert grad.shape == x.shape


@pytest.mark.parametrize("name", [c.name for c in DEFAULT_CASES if not c.gated])
def test_zero_dim_unary(kernel, device, name):
    case = next(c for c in DEFAULT_CASES if c.name == name)
    x = torch.tensor(-1.25, dtype=torch.float64, device=device, requires_grad=True)
    y = case.call(kernel, x)
    assert y.shape == ()
    ref = case.reference(kernel, x.detach())
    assert_within_bound(y, ref, magnitude(case, x.detach()), name)
    (grad,) = torch.autograd.grad(y, x)
    assert_within_bound(
        grad,
        _reference_grad(case, kernel, x, torch.ones_like(y)),
        magnitude(case, x.detach(), torch.ones_like(y)),
        name,
    )


@pytest.mark.parametrize("shape", [(300, 2 * 1031), (1, 2 * 100003), (4099, 2 * 3)], ids=str)
def test_thread_count_does_not_change_results(kernel, device, shape):
    # The CPU work split (row, chunk) depends on the thread count; results must not.
    if device != "cpu":
        pytest.skip("CPU threading")
    x = make_input(shape, torch.bfloat16, device)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, max(2, threads)):
            torch.set_num_threads(n)
            results.append((kernel.silu_and_mul(x), kernel.gelu(x)))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(results[0], results[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---- calling conventions and API ----


@pytest.mark.kernels_ci
def test_public_api(kernel):
    # attach_layers puts the layers on a model's modules by host class
    assert sorted(kernel.__all__) == sorted(ALL_NAMES + ["layers", "attach_layers"])
    assert "ops" not in kernel.__all__ and hasattr(kernel, "ops")
    for name in ALL_NAMES + ["attach_layers"]:
        assert callable(getattr(kernel, name))
    assert kernel.attach_layers.__doc__


@pytest.mark.kernels_ci
def test_calling_conventions(kernel, device):
    x = make_input((4, 12), torch.float32, device)
    out = torch.empty(4, 6, device=device)
    assert kernel.silu_and_mul(out, x) is out  # kernels-community form
    for result in (
        kernel.silu_and_mul(x),
        kernel.silu_and_mul(x=x),
        kernel.silu_and_mul(None, x),
        kernel.silu_and_mul(out=None, x=x),
    ):
        torch.testing.assert_close(result, out, rtol=0, atol=0)
    with pytest.raises(TypeError, match=r"silu_and_mul\(\) needs an input tensor"):
        kernel.silu_and_mul()

    # Scalars: positional in the out form (KC), keyword in the functional form, schema defaults.
    out2 = torch.empty_like(out)
    kernel.fatrelu_and_mul(out, x, 0.5)
    kernel.ops.fatrelu_and_mul(out2, x, 0.5)
    torch.testing.assert_close(kernel.fatrelu_and_mul(x, threshold=0.5), out, rtol=0, atol=0)
    torch.testing.assert_close(out2, out, rtol=0, atol=0)
    kernel.ops.fatrelu_and_mul(out2, x)
    torch.testing.assert_close(kernel.fatrelu_and_mul(x), out2, rtol=0, atol=0)
    kernel.swigluoai_and_mul(out, x, 1.0, 1.5)
    torch.testing.assert_close(
        kernel.swigluoai_and_mul(x, alpha=1.0, limit=1.5), out, rtol=0, atol=0
    )
    kernel.ops.swigluoai_and_mul(out2, x)
    torch.testing.assert_close(kernel.swigluoai_and_mul(x), out2, rtol=0, atol=0)

    # The out form is the non-differentiable fast path; the functional form is differentiable.
    xg = x.clone().requires_grad_()
    kernel.silu_and_mul(out, xg)
    assert out.grad_fn is None
    assert kernel.silu_and_mul(xg).grad_fn is not None


@pytest.mark.kernels_ci
@pytest.mark.parametrize("name", ALL_NAMES)
def test_keyword_out_convention(kernel, device, name):
    # sgl-kernel / FlashInfer: `silu_and_mul(input, out=None)`, the output by keyword (also
    # `input=`), next to kernels-community's positional `(out, x)` and `(out, x=x)`.
    fn = getattr(kernel, name)
    gated = name in GATED_NAMES
    x = make_input((4, 12), torch.float32, device, scale=2.0)
    shape = (4, 6) if gated else (4, 12)
    expected = fn(x)
    for call in (
        lambda o: fn(x, out=o),
        lambda o: fn(input=x, out=o),
        lambda o: fn(x=x, out=o),
        lambda o: fn(o, x=x),
        lambda o: fn(o, x),
    ):
        o = torch.full(shape, float("nan"), device=device)
        assert call(o) is o
        torch.testing.assert_close(o, expected, rtol=0, atol=0)
    assert fn(x, out=None).shape == shape  # out=None: the functional form
    torch.testing.assert_close(fn(input=x), expected, rtol=0, atol=0)

    o = torch.empty(shape, device=device)
    with pytest.raises(TypeError, match="two positional tensors"):
        fn(o, x, out=o)
    with pytest.raises(TypeError, match="input twice"):
        fn(x=x, input=x)
    with pytest.raises(TypeError, match="out twice"):
        fn(o, x=x, out=o)
    with pytest.raises(TypeError, match="needs an input tensor"):
        fn(out=o)
    if gated:
        # sgl / FlashInfer's positional (input, out) reads as (out, x): refused, the keyword
        # form named, and nothing written.
        o = torch.full(shape, float("nan"), device=device)
        with pytest.raises(ValueError, match=rf"{name}\(x, out=out\)"):
            fn(x, o)
        assert torch.isnan(o).all()


@pytest.mark.kernels_ci
def test_keyword_out_scalars(kernel, device):
    x = make_input((3, 10), torch.float32, device, scale=2.0)
    o = torch.empty(3, 5, device=device)
    assert kernel.fatrelu_and_mul(x, out=o, threshold=0.5) is o
    torch.testing.assert_close(o, kernel.fatrelu_and_mul(x, threshold=0.5), rtol=0, atol=0)
    kernel.swigluoai_and_mul(x, out=o, alpha=1.0, limit=1.5)
    torch.testing.assert_close(o, kernel.swigluoai_and_mul(x, alpha=1.0, limit=1.5), rtol=0, atol=0)


def _raises(match):
    return pytest.raises(RuntimeError, match=match)


@pytest.mark.kernels_ci
def test_bad_inputs(kernel, device):
    x = make_input((5, 8), torch.float32, device)
    out = torch.empty(5, 4, device=device)
    with _raises(r"silu_and_mul: input last dimension must be even \(2 \* d\), got 7"):
        kernel.silu_and_mul(
            torch.empty(5, 3, device=device), make_input((5, 7), torch.float32, device)
        )
    with _raises(r"silu_and_mul: input last dimension must be even \(2 \* d\), got 7"):
        kernel.silu_and_mul(make_input((5, 7), torch.float32, device))
    with _raises(r"gelu_and_mul: input must have at least one dimension"):
        kernel.gelu_and_mul(torch.empty((), device=device), torch.tensor(1.0, device=device))
    with _raises(
        r"silu_and_mul: out must have shape \[5, 4\] \(the input shape with the last dimension halved\), got \[5, 3\]"
    ):
        kernel.silu_and_mul(torch.empty(5, 3, device=device), x)
    with _raises(r"gelu: out must have shape \[5, 8\] \(the input shape\), got \[5, 4\]"):
        kernel.gelu(out, x)
    with _raises(
        r"silu_and_mul: out must have the dtype of input \(expected float32, got float16\)"
    ):
        kernel.silu_and_mul(out.half(), x)
    with _raises(r"silu_and_mul: input must be float32, float16, bfloat16 or float64, got int32"):
        kernel.silu_and_mul(out.int(), x.int())
    with _raises(r"silu: input must be float32, float16, bfloat16 or float64, got int64"):
        kernel.silu(torch.ones(3, dtype=torch.long, device=device))
    with _raises(r"silu: out must have stride 1 along its last dimension, got strides \[1, 5\]"):
        kernel.silu(torch.empty(8, 5, device=device).t(), x)
    with _raises(r"silu: out must have leading dimensions that collapse into one row stride"):
        kernel.silu(
            torch.empty(3, 2, 8, device=device).transpose(0, 1),
            make_input((2, 3, 8), torch.float32, device),
        )
    with _raises(r"silu: out rows must not overlap \(expected a row stride >= 8, got 0\)"):
        kernel.silu(torch.empty(1, 8, device=device).expand(5, 8), x)
    with _raises(r"silu: out must not share memory with input"):
        kernel.silu(x, x)
    with _raises(r"silu_and_mul: out must not share memory with input"):
        kernel.silu_and_mul(x[:, :4], x)

    # Backward ops name their arguments too.
    grad_in = torch.empty(5, 8, device=device)
    with _raises(
        r"silu_and_mul_bwd: grad_out must have shape \[5, 4\] \(the input shape with the last dimension halved\), got \[5, 8\]"
    ):
        kernel.ops.silu_and_mul_bwd(grad_in, x, x.clone())
    with _raises(
        r"silu_and_mul_bwd: grad_input must have shape \[5, 8\] \(the input shape\), got \[5, 4\]"
    ):
        kernel.ops.silu_and_mul_bwd(out.clone(), out, x)
    with _raises(
        r"gelu_bwd: grad_out must have the dtype of input \(expected float32, got float64\)"
    ):
        kernel.ops.gelu_bwd(grad_in, x.double(), x)


def test_device_mismatch(kernel, device):
    if device != "cuda":
        pytest.skip("needs a second device type")
    x = make_input((5, 8), torch.float32, device)
    with _raises(r"silu_and_mul: out must be on the device of input \(expected cuda:\d, got cpu\)"):
        kernel.silu_and_mul(torch.empty(5, 4), x)
