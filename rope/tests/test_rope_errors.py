"""Bad input: every rejected call raises, and its message names the offending argument.

Shapes, dtypes, devices, strides and overlap are checked by the C++ layer before anything runs.
Table rows are checked by the implementations: the CPU one raises (naming `positions`, the
offsets or `cu_seqlens`) before it writes anything; the CUDA kernel stops with a device-side
assertion that names them, which poisons the CUDA context, so that case runs in a subprocess.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from rope_cases import BF16, F16, F32, make_cos_sin, make_cos_sin_cache, make_input, make_positions

HQ, HK, D = 4, 2, 16


def _raises(arg):
    return pytest.raises(RuntimeError, match=rf"(?<![\w.]){arg}(?!\w)")


def _vllm(device, dtype=BF16, tokens=5, rot=D):
    q = make_input((tokens, HQ * D), dtype, device)
    k = make_input((tokens, HK * D), dtype, device, seed=1)
    positions = make_positions((tokens,), 32, torch.int64, device)
    cache = make_cos_sin_cache(32, rot, F32, device)
    return positions, q, k, cache


def _vllm_bad_calls(kernel, device):
    """(argument named in the message, call) for vLLM's rotary_embedding and friends."""
    pos, q, k, cache = _vllm(device)
    re = kernel.rotary_embedding
    calls = [
        # table shape: odd rot_dim, rot_dim > head_size, not 2-D
        (
            "cos_sin_cache",
            lambda: re(pos, q, k, D, make_cos_sin_cache(32, D, F32, device)[:, :7], True),
        ),
        (
            "cos_sin_cache",
            lambda: re(pos, q, k, D, make_cos_sin_cache(32, 2 * D + 2, F32, device), True),
        ),
        ("cos_sin_cache", lambda: re(pos, q, k, D, cache[None], True)),
        # head size mismatches
        ("query", lambda: re(pos, make_input((5, 3 * D + 2), BF16, device), k, D, cache, True)),
        ("key", lambda: re(pos, q, make_input((5, HK, D // 2), BF16, device), D, cache, True)),
        ("head_size", lambda: re(pos, q, k, 0, cache, True)),
        # positions / query shapes
        ("query", lambda: re(pos[:4], q, k, D, cache, True)),
        ("key", lambda: re(pos, q, k[:4], D, cache, True)),
        ("positions", lambda: re(pos.view(1, 1, 5), q, k, D, cache, True)),
        # dtypes
        ("key", lambda: re(pos, q, k.half(), D, cache, True)),
        ("cos_sin_cache", lambda: re(pos, q, k, D, cache.half(), True)),
        ("query", lambda: re(pos, q.double(), None, D, cache.double(), True)),
        ("positions", lambda: re(pos.float(), q, k, D, cache, True)),
        # strides and overlap of the written tensors
        (
            "query",
            lambda: re(pos, make_input((5, 2 * HQ * D), BF16, device)[:, ::2], k, D, cache, True),
        ),
        (
            "key",
            lambda: re(pos, q, make_input((5, HK, 2 * D), BF16, device)[..., ::2], D, cache, True),
        ),
        ("key", lambda: re(pos, q, q[:, D:], D, cache, True)),  # key overlaps query
        # batched: offsets
        (
            "cos_sin_cache_offsets",
            lambda: kernel.batched_rotary_embedding(pos, q, k, D, cache, True, D, pos[:4]),
        ),
        (
            "cos_sin_cache_offsets",
            lambda: kernel.batched_rotary_embedding(pos, q, k, D, cache, True, D, pos.float()),
        ),
        (
            "cos_sin_cache",
            lambda: kernel.batched_rotary_embedding(pos, q, k, D, cache, True, D - 2, pos),
        ),
    ]
    return calls


@pytest.mark.kernels_ci
def test_vllm_bad_inputs(kernel, device):
    for arg, call in _vllm_bad_calls(kernel, device):
        with _raises(arg):
            call()


@pytest.mark.kernels_ci
@pytest.mark.parametrize("bad", [32, 1000, -1])
def test_positions_out_of_range(kernel, device, bad):
    # The table has 32 rows: a position of 32 (one past), far past, or negative must not read
    # outside it. CPU: a clear error naming positions, nothing written. CUDA: see the subprocess test.
    if device != "cpu":
        pytest.skip("CUDA: test_positions_out_of_range_cuda")
    pos, q, k, cache = _vllm(device)
    pos[3] = bad
    q0, k0 = q.clone(), k.clone()
    with _raises("positions"):
        kernel.rotary_embedding(pos, q, k, D, cache, True)
    assert torch.equal(q, q0) and torch.equal(k, k0), (
        "nothing may be written when a row is out of range"
    )
    with _raises("positions"):
        kernel.batched_rotary_embedding(pos, q, k, D, cache, True, D, torch.zeros_like(pos))
    with _raises("positions"):
        kernel.apply_rope_with_cos_sin_cache_inplace(pos, q, k, D, cache)


_CUDA_ASSERT = textwrap.dedent(
    """
    import sys, torch, kernels
    from pathlib import Path
    k = kernels.get_local_kernel(Path(sys.argv[1]), backend="cuda")
    case = sys.argv[2]
    dev = "cuda"
    if case == "positions":
        q = torch.randn(5, 4 * 16, device=dev, dtype=torch.bfloat16)
        cache = torch.randn(32, 16, device=dev)
        k.rotary_embedding(torch.tensor([0, 1, 32, 3, 4], device=dev), q, None, 16, cache, True)
    else:
        q = torch.randn(1, 10, 4, 16, device=dev, dtype=torch.bfloat16)
        cos = torch.randn(1, 24, 1, 6, device=dev)
        cu = torch.tensor([0, 4, 10] if case == "seqlen_offsets" else [0, 4, 9], dtype=torch.int32, device=dev)
        offs = torch.tensor([0, 30], dtype=torch.int32, device=dev) if case == "seqlen_offsets" else None
        k.ops.rope_inplace(q, None, cos, cos, None, offs, cu, 0, 12, False, False, False)
    torch.cuda.synchronize()
    print("NO ERROR")
    """
)


@pytest.mark.parametrize("case", ["positions", "seqlen_offsets", "cu_seqlens"])
def test_rows_out_of_range_cuda(kernel, device, case):
    # A device-side assertion ends the CUDA context: run it in a fresh process; the process must
    # fail, and what it prints (the kernel's message, then the error raised at the
    # synchronization) must name the argument.
    if device != "cuda":
        pytest.skip("needs a GPU")
    build = Path(kernel.__file__).resolve().parent.parent
    r = subprocess.run(
        [sys.executable, "-c", _CUDA_ASSERT, str(build), case],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "NO ERROR" not in out, out[-4000:]
    # the kernel prints "positions[b, s] = ...", "seqlen_offset(s)/cu_seqlens give row ..." or
    # "... no sequence of cu_seqlens ..."
    assert {
        "positions": "positions",
        "seqlen_offsets": "seqlen_offset",
        "cu_seqlens": "cu_seqlens",
    }[case] in out, out[-4000:]


def _general(device, dtype=BF16):
    b, s, rot = 2, 5, 12
    q = make_input((b, s, HQ, D), dtype, device)
    k = make_input((b, s, HK, D), dtype, device, seed=1)
    cos, sin = make_cos_sin(24, rot // 2, F32, device)
    return q, k, cos[None, :, None], sin[None, :, None], rot


def _general_bad_calls(kernel, device):
    ops = kernel.ops
    q, k, cos, sin, rot = _general(device)
    ri, ro = ops.rope_inplace, ops.rope_out
    i32 = torch.int32
    offs = torch.tensor([1, 2], dtype=i32, device=device)
    cu = torch.tensor([0, 4, 10], dtype=i32, device=device)
    q1, k1 = q.reshape(1, 10, HQ, D), k.reshape(1, 10, HK, D)
    shifted = make_input((2, 5, HQ + 1, D), BF16, device)
    tail = (None, None, None, 0)
    return [
        ("rot_dim", lambda: ri(q, k, cos, sin, *tail, 7, False, False, False)),
        (
            "rot_dim",
            lambda: ri(
                q,
                k,
                torch.cat([cos] * 3, -1),
                torch.cat([sin] * 3, -1),
                *tail,
                18,
                False,
                False,
                False,
            ),
        ),
        ("rot_dim", lambda: ri(q, k, cos, sin, *tail, 0, False, False, False)),
        (
            "cos",
            lambda: ri(q, k, cos, sin, *tail, rot, False, True, False),
        ),  # full table needs rot columns
        ("cos", lambda: ri(q, k, cos[0], sin[0], *tail, rot, False, False, False)),  # not 4-D
        (
            "cos",
            lambda: ri(
                q,
                k,
                cos.expand(3, -1, -1, -1),
                sin.expand(3, -1, -1, -1),
                *tail,
                rot,
                False,
                False,
                False,
            ),
        ),
        (
            "cos",
            lambda: ri(
                q,
                k,
                cos.expand(-1, -1, 3, -1),
                sin.expand(-1, -1, 3, -1),
                *tail,
                rot,
                False,
                False,
                False,
            ),
        ),
        ("sin", lambda: ri(q, k, cos, sin[:, :10], *tail, rot, False, False, False)),
        ("sin", lambda: ri(q, k, cos, sin.half(), *tail, rot, False, False, False)),
        (
            "cos",
            lambda: ri(q, k, cos.half(), sin.half(), *tail, rot, False, False, False),
        ),  # neither fp32 nor q's
        ("k", lambda: ri(q, k.half(), cos, sin, *tail, rot, False, False, False)),
        ("k", lambda: ri(q, k[:, :4], cos, sin, *tail, rot, False, False, False)),
        (
            "q",
            lambda: ri(
                make_input((2, 5, HQ, 2 * D), BF16, device)[..., ::2],
                None,
                cos,
                sin,
                *tail,
                rot,
                False,
                False,
                False,
            ),
        ),
        ("q", lambda: ri(q[0], None, cos, sin, *tail, rot, False, False, False)),
        (
            "q",
            lambda: ri(
                q.double(), None, cos.double(), sin.double(), *tail, rot, False, False, False
            ),
        ),
        (
            "cu_seqlens",
            lambda: ri(q1, k1, cos, sin, None, None, cu.long(), 0, rot, False, False, False),
        ),
        (
            "cu_seqlens",
            lambda: ri(q, k, cos, sin, None, None, cu, 0, rot, False, False, False),
        ),  # batch 2
        (
            "seqlen_offsets",
            lambda: ri(q, k, cos, sin, None, offs.long(), None, 0, rot, False, False, False),
        ),
        (
            "seqlen_offsets",
            lambda: ri(q, k, cos, sin, None, offs[:1], None, 0, rot, False, False, False),
        ),
        (
            "positions",
            lambda: ri(
                q,
                k,
                cos,
                sin,
                make_positions((2, 5), 24, torch.int64, device),
                None,
                cu,
                0,
                rot,
                False,
                False,
                False,
            ),
        ),
        (
            "positions",
            lambda: ri(
                q,
                k,
                cos,
                sin,
                make_positions((2, 4), 24, torch.int64, device),
                None,
                None,
                0,
                rot,
                False,
                False,
                False,
            ),
        ),
        (
            "q_out",
            lambda: ro(
                torch.empty_like(q, dtype=F16),
                q,
                None,
                None,
                cos,
                sin,
                *tail,
                rot,
                False,
                False,
                False,
            ),
        ),
        (
            "q_out",
            lambda: ro(
                torch.empty(2, 5, HQ, 2 * D, dtype=BF16, device=device)[..., ::2],
                q,
                None,
                None,
                cos,
                sin,
                *tail,
                rot,
                False,
                False,
                False,
            ),
        ),
        (
            "q_out",
            lambda: ro(
                torch.empty(2, 5, HQ, D + 1, dtype=BF16, device=device),
                q,
                None,
                None,
                cos,
                sin,
                *tail,
                rot,
                False,
                False,
                False,
            ),
        ),
        (
            "k_out",
            lambda: ro(torch.empty_like(q), q, None, k, cos, sin, *tail, rot, False, False, False),
        ),
        (
            "q_out",
            lambda: ro(
                shifted[:, :, 1:],
                shifted[:, :, :-1],
                None,
                None,
                cos,
                sin,
                *tail,
                rot,
                False,
                False,
                False,
            ),
        ),
    ]


def _row_value_calls(kernel, device):
    """Calls whose tensors are well-formed but whose *values* give a row outside the table (24
    rows) or a malformed cu_seqlens: checked by the implementation (CPU: raises before writing)."""
    q, k, cos, sin, rot = _general(device)
    ri = kernel.ops.rope_inplace
    i32 = torch.int32
    q1, k1 = q.reshape(1, 10, HQ, D), k.reshape(1, 10, HK, D)
    cu = lambda *v: torch.tensor(v, dtype=i32, device=device)  # noqa: E731
    return [
        (
            "positions",
            lambda: ri(
                q,
                k,
                cos,
                sin,
                torch.full((2, 5), 24, device=device),
                None,
                None,
                0,
                rot,
                False,
                False,
                False,
            ),
        ),
        (
            "positions",
            lambda: ri(
                q,
                k,
                cos,
                sin,
                torch.full((2, 5), -1, device=device, dtype=i32),
                None,
                None,
                0,
                rot,
                False,
                False,
                False,
            ),
        ),
        (
            "seqlen_offsets",
            lambda: ri(q, k, cos, sin, None, cu(1, 20), None, 0, rot, False, False, False),
        ),
        (
            "seqlen_offset",
            lambda: ri(q, k, cos, sin, None, None, None, 20, rot, False, False, False),
        ),
        (
            "seqlen_offsets",
            lambda: ri(
                q1, k1, cos, sin, None, cu(0, 30), cu(0, 4, 10), 0, rot, False, False, False
            ),
        ),
        (
            "cu_seqlens",
            lambda: ri(q1, k1, cos, sin, None, None, cu(0, 4, 9), 0, rot, False, False, False),
        ),
        (
            "cu_seqlens",
            lambda: ri(q1, k1, cos, sin, None, None, cu(1, 4, 10), 0, rot, False, False, False),
        ),
        (
            "cu_seqlens",
            lambda: ri(q1, k1, cos, sin, None, None, cu(0, 6, 4, 10), 0, rot, False, False, False),
        ),
    ]


@pytest.mark.kernels_ci
def test_general_bad_inputs(kernel, device):
    for arg, call in _general_bad_calls(kernel, device):
        with _raises(arg):
            call()


@pytest.mark.kernels_ci
def test_row_values_out_of_range(kernel, device):
    if device != "cpu":
        pytest.skip("CUDA: test_rows_out_of_range_cuda")
    for arg, call in _row_value_calls(kernel, device):
        with _raises(arg):
            call()
    # nothing is written when a row is out of range
    q, k, cos, sin, rot = _general(device)
    q0, k0 = q.clone(), k.clone()
    with _raises("seqlen_offset"):
        kernel.ops.rope_inplace(q, k, cos, sin, None, None, None, 20, rot, False, False, False)
    assert torch.equal(q, q0) and torch.equal(k, k0)


@pytest.mark.kernels_ci
def test_apply_rotary_bad_inputs(kernel, device):
    x = make_input((2, 3, 5, 16), BF16, device)
    x1, x2 = x[..., :8], x[..., 8:]
    cos, sin = make_cos_sin(5, 8, BF16, device)
    out = torch.empty_like(x)
    o1, o2 = out[..., :8], out[..., 8:]
    ar = kernel.apply_rotary
    for arg, call in [
        ("x1", lambda: ar(x1.int(), x2.int(), cos, sin, o1.int(), o2.int(), False)),
        ("x2", lambda: ar(x1, x2.half(), cos, sin, o1, o2, False)),
        ("x2", lambda: ar(x1, x2[..., :7], cos, sin, o1, o2, False)),
        ("out1", lambda: ar(x1, x2, cos, sin, o1[..., :7], o2, False)),
        ("out2", lambda: ar(x1, x2, cos, sin, o1, o2.float(), False)),
        ("cos", lambda: ar(x1, x2, cos[:4], sin, o1, o2, False)),
        ("sin", lambda: ar(x1, x2, cos, sin[..., :4], o1, o2, False)),
        ("cos", lambda: ar(x1, x2, cos.int(), sin, o1, o2, False)),
        ("out1", lambda: ar(x1, x2, cos, sin, o1, o1, False)),
    ]:
        with _raises(arg):
            call()


def test_device_mismatch(kernel, device):
    # On CPU-only machines a meta tensor stands in for the second device.
    other = "cpu" if device == "cuda" else "meta"
    pos, q, k, cache = _vllm(device)
    with _raises("key"):
        kernel.rotary_embedding(pos, q, k.to(other), D, cache, True)
    with _raises("cos_sin_cache"):
        kernel.rotary_embedding(pos, q, k, D, cache.to(other), True)
    with _raises("positions"):
        kernel.rotary_embedding(pos.to(other), q, k, D, cache, True)
    qg, kg, cos, sin, rot = _general(device)
    with _raises("cos"):
        kernel.ops.rope_inplace(
            qg, kg, cos.to(other), sin.to(other), None, None, None, 0, rot, False, False, False
        )
    with _raises("q_out"):
        kernel.ops.rope_out(
            torch.empty_like(qg, device=other),
            qg,
            None,
            None,
            cos,
            sin,
            None,
            None,
            None,
            0,
            rot,
            False,
            False,
            False,
        )
    if device == "cuda":
        with _raises("query"):
            kernel.rotary_embedding(pos, q.cpu(), None, D, cache, True)


def _python_bad_calls(kernel, device):
    """The Python functions of the other conventions (ValueError from the wrappers, or the
    RuntimeError of the op they call): the message names the argument."""
    x = make_input((2, 5, 3, D), BF16, device)
    cos, sin = make_cos_sin(12, D // 4, BF16, device)
    q, k = make_input((2, HQ, 5, D), BF16, device), make_input((2, HK, 5, D), BF16, device, seed=1)
    cf, sf = make_cos_sin(5, D, BF16, device)
    cf, sf = cf[None], sf[None]
    xl = make_input((2, 5, 3 * D), BF16, device)
    cl, sl = make_cos_sin(5, 3 * D, F32, device)
    fa, tr, ltx = (
        kernel.apply_rotary_emb,
        kernel.apply_rotary_transformers,
        kernel.apply_rotary_emb_ltx,
    )
    return [
        # flash-attn
        ("x", lambda: fa(x[0], cos, sin)),  # 3-D without cu_seqlens
        ("x", lambda: fa(x.double(), cos.double(), sin.double())),
        (
            "cos",
            lambda: fa(x, cos[:, :1].expand(12, D), sin[:, :1].expand(12, D)),
        ),  # rotary_dim = 2 D > D
        ("sin", lambda: fa(x, cos, sin[:6])),
        ("seqlen_offsets", lambda: fa(x, cos, sin, seqlen_offsets=torch.zeros(2, device=device))),
        (
            "seqlen_offsets",
            lambda: fa(
                x, cos, sin, seqlen_offsets=torch.zeros(3, dtype=torch.int32, device=device)
            ),
        ),
        (
            "cu_seqlens",
            lambda: fa(
                x[0],
                cos,
                sin,
                cu_seqlens=torch.tensor([[0, 2, 5]], dtype=torch.int32, device=device),
            ),
        ),
        (
            "qkv",
            lambda: kernel.apply_rotary_emb_qkv_(
                make_input((2, 5, 4, 3, D), BF16, device), cos, sin
            ),
        ),
        (
            "num_heads_q",
            lambda: kernel.apply_rotary_emb_qkv_(make_input((2, 5, 8, D), BF16, device), cos, sin),
        ),
        (
            "kv",
            lambda: kernel.apply_rotary_emb_kv_(
                make_input((2, 5, 3, 3, D), BF16, device), cos, sin
            ),
        ),
        # transformers
        ("q", lambda: tr(q[0], k, cf, sf)),
        ("k", lambda: tr(q, k[0], cf, sf)),
        ("cos", lambda: tr(q, k, cf[..., :7], sf[..., :7])),
        ("cos", lambda: tr(q, k, torch.cat([cf, cf], -1), torch.cat([sf, sf], -1))),
        ("sin", lambda: tr(q, k, cf, sf[:, :4])),
        ("unsqueeze_dim", lambda: tr(q, k, cf, sf, unsqueeze_dim=3)),
        ("q", lambda: tr(q.double(), k.double(), cf.double(), sf.double())),
        # LTX-Video
        ("freqs", lambda: ltx(xl, cl)),
        ("x", lambda: ltx(xl[0], (cl[None], sl[None]))),
        ("cos", lambda: ltx(xl, (cl[None, :, :7], sl[None, :, :7]))),
        ("freqs", lambda: ltx(xl, (cl[None], sl[None, :4]))),
    ]


@pytest.mark.kernels_ci
def test_python_bad_inputs(kernel, device):
    for arg, call in _python_bad_calls(kernel, device):
        with pytest.raises((ValueError, RuntimeError), match=rf"(?<![\w.]){arg}(?!\w)"):
            call()


@pytest.mark.kernels_ci
def test_bad_inputs_under_tracing(kernel, device):
    # The fakes reject what the C++ layer rejects about shapes, dtypes, devices and rot_dim,
    # naming the same argument, so compiled code fails at trace time with a useful message.
    # (Strides, overlap and row values are checked when the kernel runs: left out here.)
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    pos, q, k, cache = (mode.from_tensor(t) for t in _vllm(device))
    qg, kg, cos, sin, rot = _general(device)
    qg, kg, cos, sin = (mode.from_tensor(t) for t in (qg, kg, cos, sin))
    ops = kernel.ops
    with mode:
        calls = [
            ("cos_sin_cache", lambda: ops.rotary_embedding(pos, q, k, D, cache[:, :7], True)),
            ("cos_sin_cache", lambda: ops.rotary_embedding(pos, q, k, D, cache.half(), True)),
            ("query", lambda: ops.rotary_embedding(pos, q[:, :-2], k, D, cache, True)),
            ("key", lambda: ops.rotary_embedding(pos, q, k.half(), D, cache, True)),
            ("positions", lambda: ops.rotary_embedding(pos.float(), q, k, D, cache, True)),
            (
                "cos_sin_cache_offsets",
                lambda: ops.batched_rotary_embedding(pos, q, k, D, cache, True, D, pos[:4]),
            ),
            (
                "rot_dim",
                lambda: ops.rope_inplace(
                    qg, kg, cos, sin, None, None, None, 0, 7, False, False, False
                ),
            ),
            (
                "cos",
                lambda: ops.rope_inplace(
                    qg, kg, cos, sin, None, None, None, 0, rot, False, True, False
                ),
            ),
            (
                "sin",
                lambda: ops.rope_inplace(
                    qg, kg, cos, sin.half(), None, None, None, 0, rot, False, False, False
                ),
            ),
            (
                "k",
                lambda: ops.rope_inplace(
                    qg, kg.half(), cos, sin, None, None, None, 0, rot, False, False, False
                ),
            ),
            (
                "q_out",
                lambda: ops.rope_out(
                    qg.half(),
                    qg,
                    None,
                    None,
                    cos,
                    sin,
                    None,
                    None,
                    None,
                    0,
                    rot,
                    False,
                    False,
                    False,
                ),
            ),
            (
                "cu_seqlens",
                lambda: ops.rope_inplace(
                    qg,
                    kg,
                    cos,
                    sin,
                    None,
                    None,
                    torch.zeros(3, dtype=torch.int64),
                    0,
                    rot,
                    False,
                    False,
                    False,
                ),
            ),
            (
                "seqlen_offsets",
                lambda: ops.rope_inplace(
                    qg,
                    kg,
                    cos,
                    sin,
                    None,
                    torch.zeros(2, dtype=torch.int64),
                    None,
                    0,
                    rot,
                    False,
                    False,
                    False,
                ),
            ),
            (
                "x2",
                lambda: ops.apply_rotary(
                    qg[..., :6],
                    qg[..., 6:12].half(),
                    cos[0],
                    sin[0],
                    qg[..., :6],
                    qg[..., 6:12],
                    False,
                ),
            ),
        ]
        for arg, call in calls:
            with _raises(arg):
                call()


@pytest.mark.kernels_ci
def test_strided_out_overlapping_input_is_refused(kernel, device):
    # q and q_out are head slices of one [B, S, 2 * HQ, D] buffer: strided views ATen finds "too hard".
    _, _, cos, sin, rot = _general(device)
    buf = make_input((2, 5, 2 * HQ, D), BF16, device)
    flags = (None, None, None, 0, rot, False, False, False)
    with _raises("q_out must not share memory with q"):
        kernel.ops.rope_out(buf[:, :, 1 : HQ + 1], buf[:, :, :HQ], None, None, cos, sin, *flags)
    with _raises("k_out must not share memory with q"):
        kernel.ops.rope_out(
            torch.empty_like(buf[:, :, :HQ]),
            buf[:, :, :HQ],
            buf[:, :, HQ - 1 : HQ + 1],
            buf[:, :, HQ + 1 : HQ + 3].clone(),
            cos,
            sin,
            *flags,
        )


@pytest.mark.kernels_ci
def test_disjoint_strided_views_of_one_buffer_run(kernel, device):
    # q on the first HQ heads of each token, q_out on the last HQ: interleaved address ranges,
    # no element shared. The result equals the call on separate tensors.
    _, _, cos, sin, rot = _general(device)
    buf = make_input((2, 5, 2 * HQ, D), BF16, device)
    q, q_out = buf[:, :, :HQ], buf[:, :, HQ:]
    q0 = q.clone()
    expected = torch.empty_like(q0)
    flags = (None, None, None, 0, rot, False, False, False)
    kernel.ops.rope_out(expected, q0, None, None, cos, sin, *flags)
    kernel.ops.rope_out(q_out, q, None, None, cos, sin, *flags)
    assert torch.equal(q, q0)
    torch.testing.assert_close(q_out, expected, rtol=0, atol=0)


# ---- errors name the public function called, not the op it reached ----


def _public_calls(kernel, device):
    """(public function, message, bad call) for every entry point. The flash-attn forms reach
    the general ops rope_out / rope_inplace, whose C++ checks name those ops."""
    k, i32 = kernel, torch.int32
    q, key, cos, sin, rot = _general(device, F32)  # q [2, 5, HQ, D], cos [1, 24, 1, rot / 2]
    fa_cos, fa_sin = cos[0, :, 0], sin[0, :, 0]  # flash-attn's [seqlen_ro, rot / 2]
    offsets3 = torch.zeros(3, dtype=i32, device=device)  # batch is 2
    offsets_msg = r"seqlen_offsets must have shape \[2\]"
    qkv = make_input((2, 5, 3, HQ, D), F32, device)
    kv = make_input((2, 5, 2, HK, D), F32, device)
    pos, vq, vk, cache = _vllm(device, F32)
    bad_cache = cache[:, :7]
    cache_msg = "cos_sin_cache must"
    x1 = q[..., : rot // 2]
    hf_q, hf_k = q.transpose(1, 2), key.transpose(1, 2)  # [B, H, S, D]
    hf_cos = make_input((2, 5, D), F32, device)
    hf_msg = "cos and sin must have one shape"
    return [
        (
            "rotary_embedding",
            cache_msg,
            lambda: k.rotary_embedding(pos, vq, vk, D, bad_cache, True),
        ),
        (
            "batched_rotary_embedding",
            cache_msg,
            lambda: k.batched_rotary_embedding(
                pos, vq, vk, D, bad_cache, True, D, torch.zeros_like(pos)
            ),
        ),
        (
            "apply_rope_with_cos_sin_cache_inplace",
            cache_msg,
            lambda: k.apply_rope_with_cos_sin_cache_inplace(pos, vq, vk, D, bad_cache),
        ),
        (
            "apply_rotary_emb",
            offsets_msg,
            lambda: k.apply_rotary_emb(q, fa_cos, fa_sin, seqlen_offsets=offsets3),
        ),
        (
            "apply_rotary_emb",
            offsets_msg,
            lambda: k.apply_rotary_emb(q, fa_cos, fa_sin, inplace=True, seqlen_offsets=offsets3),
        ),
        (
            "apply_rotary_emb_qkv_",
            offsets_msg,
            lambda: k.apply_rotary_emb_qkv_(qkv, fa_cos, fa_sin, seqlen_offsets=offsets3),
        ),
        (
            "apply_rotary_emb_kv_",
            offsets_msg,
            lambda: k.apply_rotary_emb_kv_(kv, fa_cos, fa_sin, seqlen_offsets=offsets3),
        ),
        (
            "apply_rotary",
            "cos must broadcast",
            lambda: k.apply_rotary(x1, x1.clone(), fa_cos, fa_sin, x1.clone(), x1.clone(), False),
        ),
        (
            "apply_rotary_transformers",
            hf_msg,
            lambda: k.apply_rotary_transformers(hf_q, hf_k, hf_cos[..., :5], hf_cos),
        ),
        (
            "apply_rotary_pos_emb",
            hf_msg,
            lambda: k.apply_rotary_pos_emb(hf_q, hf_k, hf_cos[..., :5], hf_cos),
        ),
        (
            "apply_rotary_emb_ltx",
            "freqs must be",
            lambda: k.apply_rotary_emb_ltx(q.flatten(2), (hf_cos[..., :5], hf_cos)),
        ),
    ]


@pytest.mark.kernels_ci
def test_errors_name_the_public_function_called(kernel, device):
    calls = _public_calls(kernel, device)
    public = {n for n in kernel.__all__ if callable(getattr(kernel, n))}
    assert {name for name, _, _ in calls} == public, "one bad call per public function"
    for name, message, call in calls:
        with pytest.raises((RuntimeError, ValueError), match=rf"^{name}: {message}"):
            call()


@pytest.mark.kernels_ci
def test_an_argument_of_the_wrong_type_names_the_function_and_its_signature(kernel, device):
    q, _, cos, sin, _ = _general(device, F32)
    with pytest.raises(TypeError, match=r"^apply_rotary_emb: cos must be a tensor, got float"):
        kernel.apply_rotary_emb(q, 1.0, sin[0, :, 0])


@pytest.mark.kernels_ci
def test_errors_through_a_layer_name_the_layer(kernel, device):
    q, key, _, _, _ = _general(device, F32)
    hf_q, hf_k = q.transpose(1, 2), key.transpose(1, 2)
    cos = make_input((2, 5, D), F32, device)
    layer = kernel.layers.apply_rotary_transformers
    with pytest.raises(
        (RuntimeError, ValueError), match=r"^apply_rotary_transformers\.forward: cos and sin"
    ):
        layer.forward(layer(), hf_q, hf_k, cos[..., :5], cos)
