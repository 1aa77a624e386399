#!/usr/bin/env python3
"""Plots of the benchmark results for the README: generated from the result files, never drawn.

    python scripts/plots.py          rewrite docs/plots/ (PNGs + manifest.json) and README's block
    python scripts/plots.py --check  exit 1 if a plot is missing, stale or hand-edited, or the
                                     README block differs (reads hashes only: no matplotlib)

Inputs
- `<kernel>/benchmarks/results/*.json`, written by `<kernel>/benchmarks/sweep.py` (the schema
  scripts/bench_table.py reads): `environment.device`, `copy_gbs` (the measured copy ceiling),
  optionally `matmul_tflops` (a dense bf16 matmul rate measured in the same run: the roofline's
  compute ceiling, drawn only when present), and `results`, one row per case with `op`, the shape
  keys, `bytes`, optionally `flops`, and per contender `us` (GPU time), `gbs` and, for attention,
  `tflops`. A contender whose time is null rejected the shape and is left out.
- `quant/benchmarks/results/gemm/*.json`, quant's GEMM sweep (quant/benchmarks/gemm_sweep.py):
  rows with `model`, `layer`, `m` and per contender `us`; drawn as the speed-up of each
  contender over bf16 F.linear against M, one panel per Llama-3-8B layer.
- `results/e2e/*.json`, end-to-end model runs of scripts/e2e.py (schema "e2e/1", one file per
  model and device; only these keys are read):

      {"model": "qwen3", "size": "full", "complete": true,
       "environment": {"device": "NVIDIA H100 80GB HBM3", ...},
       "measurements": [{"phase": "prefill", "shape": "1x2048",
                         "config": "eager" | "eager+kit" | "compile" | "compile+kit",
                         "median_ms": 41.0}, ...],
       "profile": {"config": "eager+kit", "phase": "prefill", "shape": "1x2048",
                   "families": {"attention": {"share": 0.31}, ...}}}     (optional)

  Bars: per phase and shape, each configuration's speed-up over eager (a phase and shape
  without an eager time is left out, with a printed note), labelled with its median time;
  `profile`, when present, adds the GPU time share per op family. No such file yet: no e2e
  plot, and a printed note.

Outputs, in docs/plots/: `<kernel>-scaling.png` (time and throughput against size, ours and
every baseline, both axes logarithmic, one line style per device), `<kernel>-roofline.png`
(achieved TFLOP/s against arithmetic intensity under the measured ceilings, one panel per
device), `quant-gemm.png`, `e2e-<file stem>.png`, and `manifest.json`, which records for every PNG the SHA-256 of
its input files, of the PNG itself and of this script. Git does not keep modification times, so
freshness is judged by those hashes (tests/test_plots.py). The figures are rendered with the Agg
backend at a fixed size and resolution, with matplotlib's defaults and no date or software
version in the PNG, so the same inputs and matplotlib version give byte-identical files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parent.parent
PLOTS_DIR = Path("docs") / "plots"
MANIFEST = "manifest.json"
E2E_DIR = Path("results") / "e2e"
E2E_CONFIGS = ("eager", "eager+kit", "compile", "compile+kit")
FIGURE_DPI = 100
README_BLOCK = re.compile(r"(<!-- BEGIN plots -->\n).*?(<!-- END plots -->)", re.S)

# ---- what to plot: inputs and outputs, computed from file names alone ----


@dataclass(frozen=True)
class Plot:
    name: str  # file name under docs/plots/
    kind: str  # "scaling", "roofline" or "e2e"
    subject: str  # the kernel, or the e2e file's stem
    inputs: tuple[Path, ...]  # relative to the repository root


def plan(root: Path = REPO_ROOT) -> list[Plot]:
    """Every plot the committed result files call for."""
    plots = []
    for results in sorted(root.glob("*/benchmarks/results")):
        kernel = results.parent.parent.name
        files = tuple(sorted(p.relative_to(root) for p in results.glob("*.json")))
        if files:
            plots.append(Plot(f"{kernel}-scaling.png", "scaling", kernel, files))
            plots.append(Plot(f"{kernel}-roofline.png", "roofline", kernel, files))
        # A suite of its own writes to a subfolder (benchlib.result_path): quant's GEMMs.
        gemm = tuple(sorted(p.relative_to(root) for p in (results / "gemm").glob("*.json")))
        if gemm:
            plots.append(Plot(f"{kernel}-gemm.png", "gemm", kernel, gemm))
    for path in sorted((root / E2E_DIR).glob("*.json")):
        plots.append(Plot(f"e2e-{path.stem}.png", "e2e", path.stem, (path.relative_to(root),)))
    return plots


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def generator_hash() -> str:
    """This script's hash: a change to how plots are drawn makes every plot stale."""
    return sha256(Path(__file__).resolve())


def manifest_entry(root: Path, plot: Plot) -> dict:
    return {
        "inputs": {str(p): sha256(root / p) for p in plot.inputs},
        "sha256": sha256(root / PLOTS_DIR / plot.name),
    }


def problems(root: Path = REPO_ROOT, readme: Path | None = None) -> list[str]:
    """Why the committed plots do not match the result files (empty: they do)."""
    plots = plan(root)
    out_dir = root / PLOTS_DIR
    manifest_path = out_dir / MANIFEST
    if not plots:
        return []
    if not manifest_path.is_file():
        return [f"{PLOTS_DIR / MANIFEST} is missing"]
    manifest = json.loads(manifest_path.read_text())
    found = []
    if manifest.get("generator") != generator_hash():
        found.append("scripts/plots.py changed since the plots were drawn")
    recorded = manifest.get("plots", {})
    for plot in plots:
        png = out_dir / plot.name
        entry = recorded.get(plot.name)
        if not png.is_file():
            found.append(f"{PLOTS_DIR / plot.name} is missing")
        elif entry is None:
            found.append(f"{PLOTS_DIR / plot.name} is not in the manifest")
        elif entry != manifest_entry(root, plot):
            if entry.get("sha256") != sha256(png):
                found.append(f"{PLOTS_DIR / plot.name} differs from the one the script drew")
            else:
                found.append(f"{PLOTS_DIR / plot.name} is older than its inputs")
    planned = {p.name for p in plots}
    for stray in sorted(set(recorded) - planned):
        found.append(f"{PLOTS_DIR / stray} has no inputs any more")
    for png in sorted(out_dir.glob("*.png")):
        if png.name not in planned and png.name not in recorded:
            found.append(f"{PLOTS_DIR / png.name} is not generated by scripts/plots.py")
    readme = readme or root / "README.md"
    text = readme.read_text() if readme.is_file() else ""
    if README_BLOCK.search(text) is None:
        found.append(f"{readme.name} has no `<!-- BEGIN plots -->` … `<!-- END plots -->` block")
    elif readme_with_block(text, plots) != text:
        found.append(f"the plots block of {readme.name} differs from the plots")
    return found


# ---- the README block ----

_CAPTIONS = {
    "scaling": "{subject}: GPU time and throughput against size, ours and the baselines",
    "roofline": "{subject}: roofline",
    "gemm": "{subject} GEMMs: speed-up over bf16 F.linear against M, per layer",
    "e2e": "end to end, {subject}: speed-up of each configuration over eager PyTorch",
}


def readme_block(plots: list[Plot]) -> str:
    """A heading per kernel (and one for the end-to-end runs), each plot in a paragraph of its
    own so that the images stack."""
    lines = []
    for plot in plots:
        heading = "#### end to end" if plot.kind == "e2e" else f"#### {plot.subject}"
        if heading not in lines:
            lines += [heading, ""]
        alt = _CAPTIONS[plot.kind].format(subject=plot.subject)
        lines += [f"![{alt}]({(PLOTS_DIR / plot.name).as_posix()})", ""]
    if not any(p.kind == "e2e" for p in plots):
        lines.append(
            f"No end-to-end plot yet: it appears once `{E2E_DIR.as_posix()}/*.json` exists."
        )
    return "\n".join(lines).rstrip("\n")


def readme_with_block(text: str, plots: list[Plot]) -> str:
    return README_BLOCK.sub(lambda m: m.group(1) + readme_block(plots) + "\n" + m.group(2), text)


# ---- series: which rows each scaling panel shows ----


def _is(**want) -> Callable[[dict], bool]:
    return lambda r: all(r.get(k) == v for k, v in want.items())


@dataclass(frozen=True)
class Panel:
    title: str
    keep: Callable[[dict], bool]
    x: str  # the row's key for the x axis
    xlabel: str
    rate: str = "gbs"  # "gbs" or "tflops": the right-hand axis


_TOKENS = "tokens"
SCALING: dict[str, list[Panel]] = {
    # Llama-3-8B's intermediate width, the token counts the sweep covers in full
    "activation": [
        Panel(
            f"{op}, bf16, width 14336", _is(op=op, dtype="bfloat16", width=14336), _TOKENS, "tokens"
        )
        for op in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul")
    ],
    "rmsnorm": [
        Panel(
            f"{op}, bf16, hidden 4096", _is(op=op, dtype="bfloat16", hidden=4096), _TOKENS, "tokens"
        )
        for op in ("rms_norm", "fused_add_rms_norm", "apply_rms_norm_backward")
    ],
    "rope": [
        Panel(
            f"{op}, bf16, (32 + 8) heads × 128",
            _is(op=op, dtype="bfloat16", head_dim=128),
            _TOKENS,
            "tokens",
        )
        for op in ("rotary_embedding", "apply_rotary_transformers")
    ],
    # Prefill at a fixed 16K tokens (B × S), so the x axis is the sequence length; decode from a
    # contiguous cache (the baselines read that one), GQA 32/8.
    "attention": [
        Panel(
            f"prefill, bf16, head_dim 128, {'causal' if causal else 'not causal'}, B × S = 16K",
            _is(op="prefill", dtype="bfloat16", head_dim=128, causal=causal),
            "seqlen",
            "sequence length S",
            rate="tflops",
        )
        for causal in (True, False)
    ]
    + [
        Panel(
            f"decode, bf16, batch {batch}, H 32/8 × 128, contiguous cache",
            _is(op="decode", dtype="bfloat16", head_dim=128, batch=batch, layout="contiguous"),
            "seqlen",
            "KV length",
        )
        for batch in (1, 64)
    ],
}

_SHAPE_SKIP = {"op", "tokens", "bytes", "flops", "l2_resident", "copy_fraction"}


def generic_panels(rows: list[dict]) -> list[Panel]:
    """For a kernel without an entry in SCALING: per op, the rows with the first row's shape
    (every scalar field but the token count), against tokens."""
    panels = []
    for op in dict.fromkeys(r["op"] for r in rows if "tokens" in r):
        first = next(r for r in rows if r["op"] == op and "tokens" in r)
        shape = {
            k: v
            for k, v in first.items()
            if k not in _SHAPE_SKIP and isinstance(v, (str, int)) and not k.startswith("speedup")
        }
        title = ", ".join([op] + [f"{k} {v}" for k, v in shape.items() if k != "op"])
        panels.append(Panel(title, _is(op=op, **shape), _TOKENS, "tokens"))
    return panels


# ---- arithmetic intensity: FLOP counts ----

# The sweeps of the bandwidth-bound kernels record bytes, not FLOPs. For the roofline each op is
# given a nominal count per element it produces: the adds, multiplies and special functions of
# the reference formula, each counted as one (a row's own `flops`, if recorded, wins). They place
# each op on the x axis; its distance below the bandwidth roof does not depend on them.
NOMINAL_FLOPS_PER_ELEMENT = {
    "activation": {
        "silu_and_mul": 5,  # x / (1 + exp(-x)) * y
        "mul_and_silu": 5,
        "gelu_and_mul": 6,  # 0.5 x (1 + erf(x / sqrt 2)) * y
        "gelu_tanh_and_mul": 10,  # 0.5 x (1 + tanh(c (x + 0.044715 x^3))) * y
        "fatrelu_and_mul": 2,  # (x > t ? x : 0) * y
        "swigluoai_and_mul": 11,  # clamps, (up + 1) * g * sigmoid(alpha g)
        "silu": 4,
        "gelu": 5,
        "gelu_tanh": 9,
        "gelu_fast": 9,
        "gelu_new": 9,
        "gelu_quick": 5,  # x * sigmoid(1.702 x)
    },
    "rmsnorm": {
        "rms_norm": 4,  # square, sum, times rstd, times weight
        "fused_add_rms_norm": 5,  # the residual add first
        "apply_rms_norm_backward": 9,  # g w, its dot with x, the correction, dweight's sum
    },
    "rope": {
        # out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin: 6 per pair of elements
        "rotary_embedding": 3,
        "apply_rotary_transformers": 3,
    },
    "quant": {
        # static: times 1/scale, clamp (2); dynamic: |x| and max for the amax pass besides (4)
        "fp8_static": 2,
        "int8_static": 2,
        "fp8_per_tensor": 4,
        "fp8_per_token": 4,
        "fp8_group128": 4,
        "int8_sym": 4,
        "int8_asym": 5,  # min and max, then the zero point
    },
}


def _elements(kernel: str, r: dict) -> int | None:
    if kernel == "activation":
        return r["tokens"] * r["width"]
    if kernel == "rmsnorm":
        return r["tokens"] * r["hidden"]
    if kernel == "rope":
        return r["tokens"] * (r["q_heads"] + r["kv_heads"]) * r["head_dim"]
    if kernel == "quant":
        return r["tokens"] * r["hidden"]
    return None


def flops(kernel: str, r: dict) -> float | None:
    if r.get("flops"):
        return float(r["flops"])
    per = NOMINAL_FLOPS_PER_ELEMENT.get(kernel, {}).get(r["op"])
    n = _elements(kernel, r) if per else None
    return float(per * n) if n else None


# ---- drawing ----

LABELS = {
    "ours": "ours",
    "compile": "torch.compile",
    "eager": "eager",
    "F.rms_norm": "F.rms_norm",
    "inplace_compile": "in-place, torch.compile",
    "inplace_eager": "in-place, eager",
    "sdpa_flash": "SDPA flash",
    "sdpa_cudnn": "SDPA cuDNN",
    "sdpa_efficient": "SDPA efficient",
}
COLORS = {
    "ours": "#d62728",
    "compile": "#1f77b4",
    "eager": "#7f7f7f",
    "F.rms_norm": "#2ca02c",
    "inplace_compile": "#9467bd",
    "inplace_eager": "#8c564b",
    "sdpa_flash": "#1f77b4",
    "sdpa_cudnn": "#ff7f0e",
    "sdpa_efficient": "#7f7f7f",
}
DEVICE_STYLES = ["-", "--", ":", "-."]
# The roofline shows ours against the usual alternative: torch.compile, or for attention the two
# fastest SDPA backends.
ROOFLINE_CONTENDERS = {"attention": ("ours", "sdpa_flash", "sdpa_cudnn")}
ROOFLINE_MARKERS = {"ours": "o", "compile": "s", "sdpa_flash": "^", "sdpa_cudnn": "D"}


def _matplotlib():
    """pyplot on the Agg backend with matplotlib's default style, whatever the user's matplotlibrc
    says (the PNGs must not depend on the machine)."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcdefaults()
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 9, "legend.fontsize": 8})
    return plt


def device_label(env: dict) -> str:
    return env["device"].removeprefix("NVIDIA ").strip()


def _size_label(v: float) -> str:
    v = int(v)
    return f"{v // 1024}K" if v >= 1024 and v % 1024 == 0 else str(v)


def _size_axis(ax, xs) -> None:
    ax.set_xscale("log")
    ticks = sorted(set(xs))
    ax.set_xticks(ticks, [_size_label(t) for t in ticks])
    ax.minorticks_off()


def _plain_log_ticks(ax, axes: str = "y") -> None:
    """Log-axis tick labels as plain numbers (600, not 6 × 10^2); minor ticks are labelled only
    when the axis spans about a decade or less, as matplotlib does by default."""
    from matplotlib import ticker

    class Plain(ticker.LogFormatter):
        def _num_to_string(self, x, vmin, vmax):
            return f"{x:g}"

    for name in axes:
        axis = getattr(ax, f"{name}axis")
        axis.set_major_formatter(Plain())
        axis.set_minor_formatter(Plain(labelOnlyBase=False))


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # No "Software" entry (it names the matplotlib version) and no date: reruns are identical.
    fig.savefig(path, dpi=FIGURE_DPI, metadata={"Software": None})


def _contenders(rows: list[dict]) -> list[str]:
    names = dict.fromkeys(k for r in rows for k in r["us"])
    return ["ours"] + [n for n in names if n != "ours"]


def _legend_handles(plt, names: list[str], devices: list[str], extra: list) -> list:
    """Proxy artists for a figure legend: colour = contender, line style = device."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D(
            [],
            [],
            color=COLORS.get(n),
            linewidth=1.8 if n == "ours" else 1.1,
            label=LABELS.get(n, n),
        )
        for n in names
    ]
    handles += [
        Line2D([], [], color="black", linestyle=style, linewidth=1.0, label=device)
        for style, device in zip(DEVICE_STYLES, devices)
    ]
    return handles + extra


def draw_scaling(kernel: str, payloads: list[dict], path: Path) -> None:
    from matplotlib.lines import Line2D

    plt = _matplotlib()
    all_rows = [r for p in payloads for r in p["results"]]
    panels = SCALING.get(kernel) or generic_panels(all_rows)
    panels = [p for p in panels if any(p.keep(r) for r in all_rows)]
    fig, axes = plt.subplots(
        len(panels),
        2,
        figsize=(10, 3.0 * len(panels) + 1.4),
        squeeze=False,
        layout="constrained",
    )
    names = _contenders([r for r in all_rows if any(p.keep(r) for p in panels)])
    for row_axes, panel in zip(axes, panels):
        t_ax, r_ax = row_axes
        xs = []
        for style, payload in zip(DEVICE_STYLES, payloads):
            rows = sorted(
                (r for r in payload["results"] if panel.keep(r)), key=lambda r: r[panel.x]
            )
            for name in names:
                pts = [
                    (
                        r[panel.x],
                        r["us"][name],
                        (r.get(panel.rate) or {}).get(name),
                        r.get("l2_resident"),
                    )
                    for r in rows
                    if r["us"].get(name)
                ]
                if not pts:
                    continue
                x, us, rate, in_l2 = zip(*pts)
                xs += x
                color = COLORS.get(name)
                line = dict(color=color, linestyle=style, linewidth=1.8 if name == "ours" else 1.1)
                series = [(t_ax, us)] + ([(r_ax, rate)] if None not in rate else [])
                for ax, ys in series:
                    ax.plot(x, ys, **line)
                    # hollow markers: the bytes fit in L2 (replays read cached data)
                    for hollow in (False, True):
                        sel = [(a, b) for a, b, c in zip(x, ys, in_l2) if bool(c) == hollow]
                        if sel:
                            ax.plot(
                                *zip(*sel),
                                linestyle="none",
                                marker="o",
                                markersize=3.5,
                                color=color,
                                markerfacecolor="white" if hollow else color,
                            )
            if panel.rate == "gbs":
                r_ax.axhline(payload["copy_gbs"], color="black", linestyle=style, linewidth=0.7)
        for ax in row_axes:
            _size_axis(ax, xs)
            ax.set_yscale("log")
            _plain_log_ticks(ax)
            ax.set_xlabel(panel.xlabel)
            ax.grid(True, which="both", linewidth=0.3)
        t_ax.set_ylabel("GPU time, µs (lower is better)")
        rate = "TFLOP/s" if panel.rate == "tflops" else "GB/s"
        r_ax.set_ylabel(f"{rate} (higher is better)")
        t_ax.set_title(panel.title, loc="left")
    devices = [device_label(p["environment"]) for p in payloads]
    extra = [Line2D([], [], color="black", linewidth=0.7, label="copy ceiling (thin black)")]
    if any(r.get("l2_resident") for r in all_rows):
        extra.append(
            Line2D(
                [],
                [],
                linestyle="none",
                marker="o",
                color="black",
                markerfacecolor="white",
                label="hollow: bytes fit in L2",
            )
        )
    fig.legend(
        handles=_legend_handles(plt, names, devices, extra),
        loc="outside lower center",
        ncols=5,
        frameon=False,
    )
    fig.suptitle(
        f"{kernel}: GPU time (median of CUDA-graph replays) and throughput against size, "
        f"from {kernel}/benchmarks/results/",
        fontsize=10,
    )
    _save(fig, path)
    plt.close(fig)


def draw_roofline(kernel: str, payloads: list[dict], path: Path) -> None:
    from matplotlib.lines import Line2D

    plt = _matplotlib()
    fig, axes = plt.subplots(
        1,
        len(payloads),
        figsize=(4.6 * len(payloads) + 2.4, 4.8),
        squeeze=False,
        layout="constrained",
    )
    contenders = ROOFLINE_CONTENDERS.get(kernel, ("ours", "compile"))
    skipped = set()
    # One colour per op, the same in every panel; tab20 has enough distinct ones for activation's
    # twelve ops (dark shades first).
    groups = list(dict.fromkeys(r["op"] for p in payloads for r in p["results"]))
    palette = plt.get_cmap("tab20")
    colors = {g: palette((2 * i) % 20 + (2 * i) // 20 % 2) for i, g in enumerate(groups)}
    drawn_groups, drawn_names = [], []
    for ax, payload in zip(axes[0], payloads):
        ai_all, tf_all = [], []
        for group in groups:
            for name in contenders:
                pts = []
                for r in payload["results"]:
                    if r["op"] != group or not r["us"].get(name):
                        continue
                    f = flops(kernel, r)
                    if f is None:
                        skipped.add(r["op"])
                        continue
                    pts.append((f / r["bytes"], f / (r["us"][name] * 1e-6) / 1e12))
                if not pts:
                    continue
                drawn_groups.append(group)
                drawn_names.append(name)
                ai, tf = zip(*pts)
                ai_all += ai
                tf_all += tf
                ours = name == "ours"
                ax.scatter(
                    ai,
                    tf,
                    s=16 if ours else 22,
                    marker=ROOFLINE_MARKERS.get(name, "x"),
                    facecolors=[colors[group]] if ours else "none",
                    edgecolors=[colors[group]],
                    linewidths=0.8,
                    alpha=0.85,
                    zorder=3,
                )
        if not ai_all:
            ai_all = tf_all = [1.0]
        lo, hi = min(ai_all) / 4, max(ai_all) * 4
        peak = payload.get("matmul_tflops")
        if peak:
            hi = max(hi, 4 * peak * 1e12 / (payload["copy_gbs"] * 1e9))
        grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        roof = [payload["copy_gbs"] * 1e9 * a / 1e12 for a in grid]
        if peak:
            roof = [min(v, peak) for v in roof]
        ax.plot(grid, roof, color="black", linewidth=1.2)
        note = f"bandwidth roof: measured copy, {payload['copy_gbs']:.0f} GB/s"
        note += (
            f"\ncompute roof: measured matmul, {peak:.0f} TFLOP/s"
            if peak
            else "\nno measured tensor-core ceiling in this result file"
        )
        ax.text(0.02, 0.98, note, transform=ax.transAxes, va="top", fontsize=8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        # Without a compute roof the bandwidth roof would climb far above any kernel: the axis
        # ends a little above the measurements (or the measured compute roof) instead.
        ax.set_ylim(min(tf_all) / 3, max(max(tf_all), peak or 0) * 4)
        _plain_log_ticks(ax, "xy")
        ax.set_xlabel("arithmetic intensity (FLOP / byte)")
        ax.set_ylabel("achieved TFLOP/s")
        ax.set_title(device_label(payload["environment"]))
        ax.grid(True, which="both", linewidth=0.3)
    # Legend: colour = op, marker = contender (filled: ours), and the roof.
    handles = [
        Line2D([], [], linestyle="none", marker="o", color=colors[g], label=g)
        for g in dict.fromkeys(drawn_groups)
    ]
    handles += [
        Line2D(
            [],
            [],
            linestyle="none",
            marker=ROOFLINE_MARKERS.get(n, "x"),
            color="black",
            markerfacecolor="black" if n == "ours" else "none",
            label=LABELS.get(n, n),
        )
        for n in dict.fromkeys(drawn_names)
    ]
    handles.append(Line2D([], [], color="black", linewidth=1.2, label="roof"))
    fig.legend(handles=handles, loc="outside right center", frameon=False)
    basis = (
        "FLOPs and bytes as the sweep counts them"
        if kernel not in NOMINAL_FLOPS_PER_ELEMENT
        else "bytes as the sweep counts them, FLOPs a nominal count per element"
    )
    fig.suptitle(f"{kernel}: roofline, every measured size\n({basis})", fontsize=10)
    _save(fig, path)
    plt.close(fig)
    for op in sorted(skipped):
        print(f"note: {kernel} {op}: no FLOP count, left out of the roofline")


# The GEMM plot's contenders (gemm_sweep.py's keys), each drawn as bf16 time / its time.
GEMM_CONTENDERS = {
    "ours": ("ours fp8 per-token", "#d62728"),
    "ours_fp8_tensor": ("ours fp8 per-tensor", "#ff7f0e"),
    "ours_int8": ("ours int8", "#9467bd"),
    "ours_fp8_block": ("ours fp8 blockwise", "#8c564b"),
    "e2e_ours": ("per-token quantize + ours", "#e377c2"),
    "scaled_mm_row": ("_scaled_mm row-wise", "#1f77b4"),
    "scaled_mm_tensor": ("_scaled_mm per-tensor", "#17becf"),
    "int_mm_compile": ("_int_mm + scaling, compiled", "#2ca02c"),
}
GEMM_LAYERS = ("qkv", "o", "gate_up", "down")


def draw_gemm(kernel: str, payloads: list[dict], path: Path) -> None:
    """Speed-up over bf16 F.linear (cuBLAS) against M, one panel per Llama-3-8B layer (qkv and o
    are Qwen3-8B's too), one line style per device."""
    from matplotlib.lines import Line2D

    plt = _matplotlib()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.4), squeeze=False, layout="constrained")
    for ax, layer in zip(axes.flat, GEMM_LAYERS):
        shape = ""
        for style, payload in zip(DEVICE_STYLES, payloads):
            rows = sorted(
                (
                    r
                    for r in payload["results"]
                    if r["layer"] == layer and "llama" in r["model"] and r["us"].get("bf16")
                ),
                key=lambda r: r["m"],
            )
            for name, (_, color) in GEMM_CONTENDERS.items():
                pts = [(r["m"], r["us"]["bf16"] / r["us"][name]) for r in rows if r["us"].get(name)]
                if pts:
                    ax.plot(
                        *zip(*pts),
                        color=color,
                        linestyle=style,
                        marker="o",
                        markersize=3,
                        linewidth=1.8 if name == "ours" else 1.1,
                    )
            if rows:
                shape = f" ({rows[0]['k']} → {rows[0]['n']})"
        ax.axhline(1.0, color="black", linewidth=0.7)
        ms = [r["m"] for p in payloads for r in p["results"] if r["layer"] == layer]
        if ms:
            _size_axis(ax, ms)
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel("bf16 time / time (higher is better)")
        ax.grid(True, which="both", linewidth=0.3)
        ax.set_title(f"{layer}{shape}", loc="left")
    handles = [Line2D([], [], color=c, label=label) for label, c in GEMM_CONTENDERS.values()]
    handles += [
        Line2D(
            [],
            [],
            color="black",
            linestyle=style,
            linewidth=1.0,
            label=device_label(p["environment"]),
        )
        for style, p in zip(DEVICE_STYLES, payloads)
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=4, frameon=False)
    fig.suptitle(
        f"{kernel} W8A8 GEMMs, Llama-3-8B layers: speed-up over bf16 F.linear (the line at 1)\n"
        f"median of CUDA-graph replays, weights read from DRAM; from "
        f"{kernel}/benchmarks/results/gemm/",
        fontsize=10,
    )
    _save(fig, path)
    plt.close(fig)


def e2e_groups(payload: dict) -> list[tuple[str, dict]]:
    """[(label, {config: median ms})] per phase and shape, in the order first measured."""
    groups: dict[tuple, dict] = {}
    for m in payload.get("measurements", []):
        if m.get("median_ms") and m.get("config") in E2E_CONFIGS:
            groups.setdefault((m["phase"], m["shape"]), {})[m["config"]] = m["median_ms"]
    kept = []
    for (phase, shape), ms in groups.items():
        if "eager" not in ms:
            print(f"note: e2e {payload.get('model')} {phase} {shape}: no eager time, left out")
            continue
        kept.append((f"{phase}\n{shape}", ms))
    return kept


def draw_e2e(payload: dict, path: Path) -> None:
    plt = _matplotlib()
    groups = e2e_groups(payload)
    profile = payload.get("profile") or {}
    families = {k: v.get("share", 0.0) for k, v in (profile.get("families") or {}).items()}
    fig, axes = plt.subplots(
        1,
        2 if families else 1,
        figsize=(max(6.0, 1.6 * len(groups) + 2.5) + (3.2 if families else 0), 4.6),
        squeeze=False,
        layout="constrained",
        width_ratios=[max(6.0, 1.6 * len(groups) + 2.5), 3.2] if families else None,
    )
    ax = axes[0][0]
    width = 0.8 / len(E2E_CONFIGS)
    for i, config in enumerate(E2E_CONFIGS):
        xs, speedups, times = [], [], []
        for g, (_, ms) in enumerate(groups):
            if config in ms:
                xs.append(g + (i - (len(E2E_CONFIGS) - 1) / 2) * width)
                speedups.append(ms["eager"] / ms[config])
                times.append(ms[config])
        bars = ax.bar(xs, speedups, width, label=config, color=f"C{i}")
        for bar, t in zip(bars, times):
            ax.annotate(
                f"{t:.3g} ms",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
                rotation=90,
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_xticks(range(len(groups)), [label for label, _ in groups])
    ax.set_ylabel("speed-up over eager (higher is better)")
    ax.set_ylim(0, max([1.0] + [p.get_height() for p in ax.patches]) * 1.35)
    ax.legend(frameon=False, ncols=len(E2E_CONFIGS), loc="upper left")
    ax.set_title("bars: eager time / time; labels: median time per call (decode: per token)")
    if families:
        fam_ax = axes[0][1]
        names = sorted(families, key=lambda k: -families[k])
        fam_ax.barh(names, [100 * families[n] for n in names], color="#7f7f7f")
        fam_ax.invert_yaxis()
        fam_ax.set_xlabel("share of GPU time (%)")
        fam_ax.set_title(
            f"{profile.get('config', '?')}, {profile.get('phase', '?')} {profile.get('shape', '')}"
        )
    incomplete = "" if payload.get("complete", True) else " (incomplete run)"
    fig.suptitle(
        f"end to end: {payload.get('model')} ({payload.get('size', '?')} size), "
        f"{device_label(payload['environment'])}{incomplete}",
        fontsize=10,
    )
    _save(fig, path)
    plt.close(fig)


def draw(root: Path, plot: Plot) -> None:
    path = root / PLOTS_DIR / plot.name
    payloads = [json.loads((root / p).read_text()) for p in plot.inputs]
    if plot.kind == "scaling":
        draw_scaling(plot.subject, payloads, path)
    elif plot.kind == "roofline":
        draw_roofline(plot.subject, payloads, path)
    elif plot.kind == "gemm":
        draw_gemm(plot.subject, payloads, path)
    else:
        draw_e2e(payloads[0], path)


def generate(root: Path = REPO_ROOT, readme: Path | None = None) -> list[Plot]:
    """Draw every plot, write the manifest, remove PNGs nothing generates, update the README."""
    plots = plan(root)
    out_dir = root / PLOTS_DIR
    for plot in plots:
        draw(root, plot)
        print(f"wrote {PLOTS_DIR / plot.name}")
    planned = {p.name for p in plots}
    for png in out_dir.glob("*.png"):
        if png.name not in planned:
            png.unlink()
            print(f"removed {PLOTS_DIR / png.name} (no inputs)")
    if not any(p.kind == "e2e" for p in plots):
        print(f"note: no {E2E_DIR}/*.json yet: no end-to-end plot")
    manifest = {
        "generator": generator_hash(),
        "plots": {p.name: manifest_entry(root, p) for p in plots},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    readme = readme or root / "README.md"
    text = readme.read_text()
    if README_BLOCK.search(text) is None:
        raise SystemExit(f"{readme} has no `<!-- BEGIN plots -->` … `<!-- END plots -->` block")
    readme.write_text(readme_with_block(text, plots))
    return plots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if any plot is missing or stale"
    )
    args = parser.parse_args(argv)
    if args.check:
        found = problems()
        for line in found:
            print(line)
        if found:
            print("run: python scripts/plots.py")
        return 1 if found else 0
    generate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
