"""Values of the quantize ops against the documented rounding rules (quant_reference.py), bit
for bit on CPU and CUDA: every mode, every input dtype, odd and empty sizes, 3-D and strided
inputs, ties and saturation, outputs poisoned before each call."""

import pytest
import quant_reference as ref
import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (shape): odd hidden sizes, one row, 1-D, 3-D, empty
SHAPES = [(1, 8), (7, 33), (13, 257), (3, 5, 128), (64,), (0, 64), (5, 3, 0)]
FP8_POISON = 0x7E  # 448 - 32: a valid fp8 value no test input quantizes to by accident
INT8_POISON = 77


def fp8_capable(device: str) -> bool:
    return device == "cpu" or torch.cuda.get_device_capability() >= (8, 9)


@pytest.fixture
def fp8_device(device):
    if not fp8_capable(device):
        pytest.skip("float8_e4m3fn needs compute capability 8.9")
    return device


def make_input(shape, dtype, device, seed=0, scale=3.0):
    """Random values with some exact fp8 ties (1 + 1/16 lies between 1 and 1.125) and a few
    values far beyond the saturation point."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale
    flat = x.view(-1)
    if flat.numel() >= 4:
        flat[0] = 1.0625
        flat[1] = -1.0625
        flat[-1] = 1e4
    return x.to(dtype).to(device)


def bits(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8).cpu() if q.dtype == torch.float8_e4m3fn else q.cpu()


def assert_bitwise(got: torch.Tensor, expected: torch.Tensor):
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    torch.testing.assert_close(bits(got), bits(expected), rtol=0, atol=0)


def poisoned(shape, dtype, device):
    out = torch.empty(shape, dtype=dtype, device=device)
    if dtype == torch.float8_e4m3fn:
        out.view(torch.uint8).fill_(FP8_POISON)
    else:
        out.fill_(INT8_POISON)
    return out


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_static_fp8(kernel, fp8_device, dtype, shape):
    x = make_input(shape, dtype, fp8_device)
    scale = torch.tensor([0.75], device=fp8_device)
    out = poisoned(shape, torch.float8_e4m3fn, fp8_device)
    kernel.ops.static_scaled_fp8_quant(out, x, scale)
    assert_bitwise(out, ref.static_fp8(x.cpu(), scale.cpu()))
    q, s = kernel.scaled_fp8_quant(x, scale)
    assert_bitwise(q, ref.static_fp8(x.cpu(), scale.cpu()))
    assert s is scale


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dynamic_per_tensor_fp8(kernel, fp8_device, dtype, shape):
    x = make_input(shape, dtype, fp8_device)
    q, scale = kernel.scaled_fp8_quant(x)
    q_ref, scale_ref = ref.dynamic_fp8(x.cpu())
    assert_bitwise(scale, scale_ref)
    assert_bitwise(q, q_ref)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 4096), (16, 4096), (17, 4096), (3, 21847)], ids=str)
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
def test_dynamic_per_tensor_fp8_small_and_large(kernel, fp8_device, dtype, shape, strided):
    """Both sides of the CUDA kernel's one-block path for small tensors (65536 elements): the
    same scale and bits either way, also through a view with a row stride twice its width."""
    x = make_input(shape, dtype, fp8_device)
    if strided:
        x = make_input((shape[0], 2 * shape[1]), dtype, fp8_device)[:, : shape[1]]
    q, scale = kernel.scaled_fp8_quant(x)
    q_ref, scale_ref = ref.dynamic_fp8(x.cpu())
    assert_bitwise(scale, scale_ref)
    assert_bitwise(q, q_ref)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("ub", [None, 2.5], ids=["no_ub", "ub"])
def test_dynamic_per_token_fp8(kernel, fp8_device, dtype, shape, ub):
    x = make_input(shape, dtype, fp8_device)
    scale_ub = None if ub is None else torch.tensor([ub], device=fp8_device)
    q, scale = kernel.scaled_fp8_quant(x, scale_ub=scale_ub, use_per_token_if_dynamic=True)
    q_ref, scale_ref = ref.per_token_fp8(x.cpu(), None if ub is None else scale_ub.cpu())
    assert scale.shape == scale_ref.shape == (ref.rows(x).shape[0], 1)
    assert_bitwise(scale, scale_ref)
    assert_bitwise(q, q_ref)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_all_zero_rows_get_the_floor_scale(kernel, fp8_device, dtype):
    x = torch.zeros(4, 96, dtype=dtype, device=fp8_device)
    x[1] = 1.0
    q, scale = kernel.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
    floor = torch.tensor(ref.FP8_MIN_SCALE).item()  # rounded to float32
    assert scale[0].item() == floor and scale[1].item() == torch.tensor(1.0 / 448.0).item()
    assert_bitwise(q, ref.per_token_fp8(x.cpu())[0])
    q, scale = kernel.scaled_fp8_quant(torch.zeros_like(x))
    assert scale.item() == floor and not q.view(torch.uint8).any()


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_padding_and_output(kernel, fp8_device, dtype):
    """num_token_padding pads dim 0 and leaves the padding rows alone; `output` is written."""
    x = make_input((5, 40), dtype, fp8_device)
    out = poisoned((9, 40), torch.float8_e4m3fn, fp8_device)
    q, scale = kernel.scaled_fp8_quant(
        x, num_token_padding=9, use_per_token_if_dynamic=True, output=out
    )
    assert q is out and scale.shape == (5, 1)
    assert_bitwise(q[:5], ref.per_token_fp8(x.cpu())[0])
    assert (q[5:].view(torch.uint8) == FP8_POISON).all()
    q, _ = kernel.scaled_fp8_quant(x, num_token_padding=2)  # fewer than the rows: no padding
    assert q.shape == (5, 40)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("azp", [None, -3], ids=["symmetric", "azp"])
def test_static_int8(kernel, device, dtype, shape, azp):
    # scale 0.5 and inputs on a 0.25 grid: x / scale hits exact halves (round half to even)
    g = torch.Generator().manual_seed(1)
    x = (torch.randint(-300, 300, shape, generator=g) * 0.25).to(dtype).to(device)
    scale = torch.tensor([0.5], device=device)
    zp = None if azp is None else torch.tensor([azp], dtype=torch.int32, device=device)
    out = poisoned(shape, torch.int8, device)
    kernel.ops.static_scaled_int8_quant(out, x, scale, zp)
    expected = ref.static_int8(x.cpu(), scale.cpu(), None if zp is None else zp.cpu())
    assert_bitwise(out, expected)
    q, s, z = kernel.scaled_int8_quant(x, scale, zp, symmetric=azp is None)
    assert_bitwise(q, expected)
    assert s is scale and z is zp


@pytest.mark.kernels_ci
@pytest.mark.parametrize("mode", ["fp8", "int8_sym", "int8_asym"])
def test_per_token_block_shapes(kernel, fp8_device, mode):
    """On CUDA the per-token launcher gives each thread one vector of the row when there are
    fewer rows than SMs and 4 (kRowCache) otherwise: one row count on each side of the switch,
    with hidden 4096 (512 bf16 vectors: 512 threads against 128). The SHAPES above all have
    fewer rows than any fp8 GPU has SMs."""
    sms = 2
    if fp8_device != "cpu":
        sms = torch.cuda.get_device_properties(fp8_device).multi_processor_count
    for rows in (sms - 1, sms):
        x = make_input((rows, 4096), torch.bfloat16, fp8_device, seed=rows)
        if mode == "fp8":
            got = kernel.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
            want = ref.per_token_fp8(x.cpu())
        elif mode == "int8_sym":
            got = kernel.scaled_int8_quant(x)[:2]
            want = ref.per_token_int8_sym(x.cpu())
        else:
            got = kernel.scaled_int8_quant(x, symmetric=False)
            want = ref.per_token_int8_asym(x.cpu())
        for g, w in zip(got, want):
            assert_bitwise(g, w)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "asymmetric"])
def test_dynamic_int8(kernel, device, dtype, shape, symmetric):
    x = make_input(shape, dtype, device, seed=2)
    q, scale, azp = kernel.scaled_int8_quant(x, symmetric=symmetric)
    if symmetric:
        q_ref, scale_ref = ref.per_token_int8_sym(x.cpu())
        assert azp is None
    else:
        q_ref, scale_ref, azp_ref = ref.per_token_int8_asym(x.cpu())
        assert_bitwise(azp, azp_ref)
    assert_bitwise(scale, scale_ref)
    assert_bitwise(q, q_ref)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int8_corner_rows(kernel, device, dtype):
    """All-zero, constant, all-positive, single-element and all-NaN rows."""
    nan = float("nan")
    x = torch.tensor(
        [
            [0.0] * 6,
            [2.0] * 6,
            [-3.0] * 6,
            [5.0, 6.0, 7.0, 8.0, 9.0, 10.0],
            [1.0, 0, 0, 0, 0, 0],
            [nan] * 6,
        ]
    ).to(dtype)
    for symmetric in (True, False):
        q, scale, azp = kernel.scaled_int8_quant(x.to(device), symmetric=symmetric)
        if symmetric:
            q_ref, scale_ref = ref.per_token_int8_sym(x)
        else:
            q_ref, scale_ref, azp_ref = ref.per_token_int8_asym(x)
            assert_bitwise(azp, azp_ref)
            assert azp[0].item() == -128 and (q[0] == -128).all()
        assert_bitwise(scale, scale_ref)
        assert_bitwise(q, q_ref)
        assert scale[0].item() == 0.0 and scale[5].item() == 0.0


def test_nan_handling(kernel, fp8_device):
    """Static quantization: NaN stays NaN in fp8, becomes 0 (or azp) in int8."""
    x = torch.tensor([[1.0, float("nan"), -2.0, 1e6]], device=fp8_device)
    one = torch.ones(1, device=fp8_device)
    q, _ = kernel.scaled_fp8_quant(x, one)
    assert_bitwise(q, ref.static_fp8(x.cpu(), one.cpu()))
    assert q.float().isnan().tolist() == [[False, True, False, False]]
    q, _, _ = kernel.scaled_int8_quant(x, one)
    assert q.tolist() == [[1, 0, -2, 127]]
    zp = torch.tensor([5], dtype=torch.int32, device=fp8_device)
    q, _, _ = kernel.scaled_int8_quant(x, one, zp, symmetric=False)
    assert q.tolist() == [[6, 5, 3, 127]]


GROUP_SHAPES = [((3, 256), 128), ((5, 96), 32), ((2, 3, 128), 64), ((7, 120), 40), ((0, 128), 128)]


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape_group", GROUP_SHAPES, ids=str)
@pytest.mark.parametrize("column_major", [False, True], ids=["row_major", "column_major"])
def test_group_fp8(kernel, fp8_device, dtype, shape_group, column_major):
    shape, group = shape_group
    x = make_input(shape, dtype, fp8_device, seed=3)
    q, scales = kernel.per_token_group_quant_fp8(x, group, column_major_scales=column_major)
    q_ref, scales_ref = ref.group_fp8(x.cpu(), group)
    assert_bitwise(q, q_ref)
    assert_bitwise(scales.contiguous(), scales_ref)
    if column_major and x.dim() == 2 and x.shape[0] > 1:
        assert scales.stride() == (1, x.shape[0])
    q1, s1 = kernel.per_token_group_quant_fp8(x, group, 1e-10, torch.float8_e4m3fn)  # vLLM's order
    assert_bitwise(q1, q_ref)
    q2, s2 = kernel.fp8_act_quant(x, group)
    assert_bitwise(q2, q_ref)
    assert_bitwise(s2, scales_ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=str)
def test_group_fp8_ue8m0_and_zero_groups(kernel, fp8_device, dtype):
    x = make_input((4, 256), dtype, fp8_device, seed=4)
    x[1, :128] = 0
    q, scales = kernel.per_token_group_quant_fp8(x, 128, use_ue8m0=True)
    q_ref, scales_ref = ref.group_fp8(x.cpu(), 128, ue8m0=True)
    assert_bitwise(scales, scales_ref)
    assert_bitwise(q, q_ref)
    assert torch.equal(scales, torch.exp2(torch.log2(scales).round()))  # powers of two
    q, scales = kernel.per_token_group_quant_fp8(x, 128)
    assert scales[1, 0].item() == pytest.approx(1e-10 / 448, rel=1e-6)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_rows_are_read_in_place(kernel, fp8_device, dtype):
    """A row slice of a wider buffer, and a transposed (column-strided) input read via a copy."""
    wide = make_input((9, 200), dtype, fp8_device, seed=5)
    for x in (wide[:, 8:136], wide[:, :130].t()[3:50:2]):
        q, scale = kernel.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
        q_ref, scale_ref = ref.per_token_fp8(x.cpu())
        assert_bitwise(q, q_ref)
        assert_bitwise(scale, scale_ref)
        q, scale, azp = kernel.scaled_int8_quant(x, symmetric=False)
        q_ref, scale_ref, azp_ref = ref.per_token_int8_asym(x.cpu())
        assert_bitwise(q, q_ref)
        assert_bitwise(azp, azp_ref)
    x = wide[:, 8:136]
    q, scales = kernel.per_token_group_quant_fp8(x, 64)
    assert_bitwise(q, ref.group_fp8(x.cpu(), 64)[0])


@pytest.mark.parametrize("hidden", [4096, 14336, 20000], ids=str)
def test_wide_rows(kernel, fp8_device, hidden):
    """Rows longer than the per-token kernel's register cache (re-read path on CUDA)."""
    x = make_input((3, hidden), torch.bfloat16, fp8_device, seed=6)
    q, scale = kernel.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
    q_ref, scale_ref = ref.per_token_fp8(x.cpu())
    assert_bitwise(q, q_ref)
    assert_bitwise(scale, scale_ref)
    q, scale, _ = kernel.scaled_int8_quant(x.float())
    q_ref, scale_ref = ref.per_token_int8_sym(x.cpu().float())
    assert_bitwise(q, q_ref)
    assert_bitwise(scale, scale_ref)


def test_nan_is_skipped_by_dynamic_scales(kernel, fp8_device):
    """A NaN does not poison its row's (or tensor's) scale: amax, min and max skip it."""
    x = make_input((3, 64), torch.float32, fp8_device, seed=7)
    x[1, 5] = float("nan")
    xc = x.cpu()
    q, scale = kernel.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
    q_ref, scale_ref = ref.per_token_fp8(xc)
    assert_bitwise(scale, scale_ref)
    assert_bitwise(q, q_ref)
    assert scale.isfinite().all() and q[1, 5].float().isnan()
    q, scale = kernel.scaled_fp8_quant(x)
    assert_bitwise(scale, ref.dynamic_fp8(xc)[1])
    q, scale, _ = kernel.scaled_int8_quant(x)
    assert_bitwise(q, ref.per_token_int8_sym(xc)[0])
    q, scale, azp = kernel.scaled_int8_quant(x, symmetric=False)
    q_ref, scale_ref, azp_ref = ref.per_token_int8_asym(xc)
    assert_bitwise(q, q_ref)
    assert_bitwise(azp, azp_ref)
    assert q[1, 5].item() == azp[1, 0].item()
    q, scales = kernel.per_token_group_quant_fp8(x, 32)
    assert_bitwise(scales, ref.group_fp8(xc, 32)[1])
