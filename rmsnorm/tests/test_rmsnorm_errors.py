"""Bad input: a rejected call raises, and its message names the offending argument.

Memory overlap between a written tensor and another argument is tested exactly by the C++ layer
(torch_checks::may_overlap), also for strided views of one buffer: a real overlap is refused,
interleaved views that share no element run.
"""

import pytest
import torch
from rmsnorm_cases import F32, check_forward, make_input, make_weight

EPS = 1e-6
HIDDEN = 16


def _raises(arg):
    return pytest.raises(RuntimeError, match=rf"(?<![\w.]){arg}(?!\w)")


@pytest.mark.kernels_ci
def test_strided_out_overlapping_input_is_refused(kernel, device):
    # Row views of one [6, 40] buffer (row stride 40): ATen finds them "too hard".
    buf = make_input((6, 40), F32, device)
    w = make_weight("same", HIDDEN, F32, device)
    with _raises("rms_norm: out must be input itself"):  # in place is allowed, overlap is not
        kernel.rms_norm(buf[:, 8:24], buf[:, :16], w, EPS)  # columns 8..15 of each row are both
    with _raises("rms_norm: out must not share memory with weight"):
        kernel.rms_norm(buf[0, 16:32], buf[1, :16], buf[0, 24:40], EPS)
    with _raises("fused_add_rms_norm: input must not share memory with residual"):
        kernel.fused_add_rms_norm(buf[:, :16], buf[:, 12:28], w, EPS)


@pytest.mark.kernels_ci
def test_disjoint_strided_views_of_one_buffer_run(kernel, device):
    # The two halves of the last dimension: their address ranges interleave, no element is shared.
    buf = make_input((6, 2 * HIDDEN), F32, device)
    w = make_weight("same", HIDDEN, F32, device)
    x, out = buf[:, :HIDDEN], buf[:, HIDDEN:]
    x0 = x.clone()
    kernel.rms_norm(out, x, w, EPS)
    assert torch.equal(x, x0)
    check_forward(kernel, out, x0, w, EPS, norm_dtype=F32, what="halves of one buffer")
    # fused add in place on the even and odd rows of one buffer.
    buf = make_input((12, HIDDEN), F32, device, seed=1)
    xi, ri = buf[0::2], buf[1::2]
    x0, r0 = xi.clone(), ri.clone()
    kernel.fused_add_rms_norm(xi, ri, w, EPS)
    expected_r = x0 + r0
    torch.testing.assert_close(ri, expected_r)
    check_forward(kernel, xi, expected_r, w, EPS, norm_dtype=F32, what="even and odd rows")
