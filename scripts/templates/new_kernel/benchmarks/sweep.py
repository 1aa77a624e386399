"""Sweep of the newkernel ops against eager PyTorch and torch.compile, same run (CUDA).

    python newkernel/benchmarks/sweep.py [--quick] [--out PATH] [--budget-s S]

Loads the *built* kernel (newkernel/build, via kernels.get_local_kernel), measures the copy
ceiling, checks each op against the fp32 reference before timing it, then times ours and the
baselines in the same process with CUDA-graph replay (scripts/benchlib.py). Cases run in priority
order and the sweep starts no new case once --budget-s, counted from process start, would be
exceeded. Writes benchmarks/results/<device>.json with device, versions and commit; README.md's
table is generated from it (scripts/bench_table.py).
"""

from __future__ import annotations

import time

_START = time.perf_counter()  # the time budget counts imports and compilation too

import functools  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

KERNEL_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(KERNEL_DIR.parent / "scripts"))
import benchlib  # noqa: E402

DEVICE = "cuda"
ALPHA = 0.5
TOKENS = [1, 64, 4096, 65536]
WIDTHS = [4096, 14336]
DECODE_MAX_TOKENS = 64  # per-call (wall) times up to here, where launches dominate
BUDGET_S = {"full": 300.0, "quick": 90.0}
BASELINES = ("eager", "compile")
METHOD = (
    "GPU time = median of CUDA-graph replay (triton do_bench_cudagraph); per-call time at <= "
    f"{DECODE_MAX_TOKENS} tokens = median of back-to-back launches (triton do_bench); bytes = "
    "input read once + output written once; each op is checked against an fp32 reference before "
    "timing; copy ceiling = 1 GiB device-to-device copy, best of before and after the sweep; "
    "torch.compile: default mode, dynamic=False, one compilation per shape"
)
BASELINES_NOTE = "eager = alpha * x in the input dtype; torch.compile compiles that code"

check = functools.partial(benchlib.check_close, ulps=1.0, rms_ulps=0.0)


def eager_scale(x):
    return ALPHA * x


@dataclass(frozen=True)
class Case:
    op: str
    dtype: str  # torch dtype name, e.g. "bfloat16"
    tokens: int
    width: int


def cases(quick: bool) -> list[Case]:
    """Every case, in priority order: bf16 first (the README's rows), then fp32."""
    dtypes = ["bfloat16"] if quick else ["bfloat16", "float32"]
    widths = WIDTHS[:1] if quick else WIDTHS
    return [Case("scale", d, t, w) for d in dtypes for w in widths for t in TOKENS]


def run_case(kernel, case: Case, l2_bytes: int | None) -> dict:
    dtype = getattr(torch, case.dtype)
    x = torch.randn(case.tokens, case.width, dtype=dtype, device=DEVICE)
    out = torch.full_like(x, float("nan"))  # poisoned: an unwritten element fails the check
    kernel.scale(x, ALPHA, out=out)
    check(f"{case}", out, kernel._reference.scale(x, ALPHA).to(dtype))
    compiled = benchlib.compiled(eager_scale, f"{case.dtype}_{case.tokens}x{case.width}")
    timed = {
        "ours": lambda: kernel.scale(x, ALPHA, out=out),
        "eager": lambda: eager_scale(x),
        "compile": lambda: compiled(x),
    }
    us = {k: benchlib.gpu_time_us(fn) for k, fn in timed.items()}
    wall = {}
    if case.tokens <= DECODE_MAX_TOKENS:
        wall = {k: benchlib.wall_time_us(timed[k]) for k in ("ours", "compile")}
    nbytes = 2 * x.numel() * x.element_size()
    return benchlib.timing_row(case, nbytes, l2_bytes, us, wall, BASELINES)


def parse_args(argv=None):
    parser = benchlib.sweep_arguments(__doc__.split("\n\n")[0], "bf16, width 4096", BUDGET_S)
    return parser.parse_args(argv)


def main():
    args = parse_args()
    benchlib.run_budgeted_sweep(
        kernel_name="newkernel",
        kernel_dir=KERNEL_DIR,
        start=_START,
        args=args,
        budget_s=BUDGET_S,
        cases=cases(args.quick),
        run_case=run_case,
        summary=lambda r: benchlib.summary_line(
            f"{r['op']} {r['dtype']} {r['tokens']}x{r['width']}", r, BASELINES
        ),
        sort_key=lambda r: (r["op"], r["dtype"], r["width"], r["tokens"]),
        notes={"method": METHOD, "baselines": BASELINES_NOTE},
    )


if __name__ == "__main__":
    main()
