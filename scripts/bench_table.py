#!/usr/bin/env python3
"""Regenerate the benchmark tables of README.md from <kernel>/benchmarks/results/*.json.

    python scripts/bench_table.py          rewrite README.md in place
    python scripts/bench_table.py --check  exit 1 if README.md differs from the result files

The end-to-end tables (scripts/e2e_table.py, from results/e2e/*.json) are regenerated too.

Each kernel's table sits between `<!-- BEGIN bench:<kernel> -->` and `<!-- END bench:<kernel> -->`.
A suite of its own (`SUITES`: quant's GEMM sweep) has its own markers and result folder.
Numbers are never typed into the README: tests/test_bench_table.py fails on any drift.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_table  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"


def _activation_rows(result: dict) -> bool:
    """The rows the README shows for activation: the headline shapes (Llama-3-8B width)."""
    if result["width"] != 14336:
        return False
    if result["op"] in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"):
        return result["tokens"] in (1, 128, 8192, 32768)
    return result["tokens"] == 8192


def _rmsnorm_rows(result: dict) -> bool:
    """bf16 at the Llama-3-8B and -70B hidden sizes; decode (1, 64) and prefill (4096, 65536)
    token counts; forward, fused add and backward (the sweep measures these first)."""
    return (
        result["dtype"] == "bfloat16"
        and result["hidden"] in (4096, 8192)
        and result["tokens"] in (1, 64, 4096, 65536)
    )


def _rope_rows(result: dict) -> bool:
    """Llama-3-8B heads (32 / 8, head_dim 128), bf16: vLLM's in-place rotary_embedding at decode
    (1, 64) and prefill (4096, 65536) token counts, and the transformers form at every size the
    sweep measures (1, 4096, 16384); the sweep measures these first."""
    if result["dtype"] != "bfloat16" or result["head_dim"] != 128:
        return False
    if result["op"] == "rotary_embedding":
        return result["tokens"] in (1, 64, 4096, 65536)
    return result["op"] == "apply_rotary_transformers"


def _attention_rows(result: dict) -> bool:
    """bf16 prefill at head_dim 128 (B * S = 16K tokens, S = 512 .. 16K, causal and not, and the
    varlen batch of mixed lengths) and
    decode (GQA 32/8, head_dim 128) at batch 1 / 64 and KV length 4K / 32K, and batch 8 at 4K (where
    the split merge in a cluster shows), from a contiguous and a 16-token paged cache."""
    if result["dtype"] != "bfloat16" or result["head_dim"] != 128:
        return False
    if result["op"] in ("prefill", "varlen"):
        return True
    return (result["batch"], result["seqlen"]) in {
        (1, 4096),
        (1, 32768),
        (8, 4096),
        (64, 4096),
        (64, 32768),
    } and result["layout"] in ("contiguous", "paged16")


def _gemm_rows(result: dict) -> bool:
    """Llama-3-8B's layers (the qkv and o rows are Qwen3-8B's too) at decode (1, 16), mid (128)
    and prefill (2048, 8192) token counts, and the squares."""
    if result["layer"] == "square":
        return True
    return "llama" in result["model"] and result["m"] in (1, 16, 128, 2048, 8192)


def _int4_rows(result: dict) -> bool:
    """Every layer at the decode token counts of the issue's bars (1, 4, 16) and at 64 and 128."""
    return result["m"] in (1, 4, 16, 64, 128)


ROW_FILTERS = {
    "activation": _activation_rows,
    "rmsnorm": _rmsnorm_rows,
    "rope": _rope_rows,
    "attention": _attention_rows,
    "quant-gemm": _gemm_rows,
    "quant-int4": _int4_rows,
}

# suite -> (its kernel folder, its results folder in there, the script that writes them)
SUITES = {
    "attention-bwd": ("attention", "benchmarks/results/backward", "benchmarks/sweep_bwd.py"),
    "quant-gemm": ("quant", "benchmarks/results/gemm", "benchmarks/gemm_sweep.py"),
    "quant-int4": ("quant", "benchmarks/results/int4", "benchmarks/int4_sweep.py"),
}


def results_dir(kernel: str) -> str:
    """Where a kernel's (or a suite's) result files are, relative to the repository root."""
    folder, results, _ = SUITES.get(kernel, (kernel, "benchmarks/results", None))
    return f"{folder}/{results}"


def _speedup(key: str):
    return lambda r: f"{r[key]:.2f}×" if key in r else "–"


def _per_call(*names: str):
    """Per-call times (`wall_us`, measured at decode sizes only) of the named contenders."""

    def cell(r: dict) -> str:
        wall = r.get("wall_us")
        return " / ".join(f"{wall[n]:.1f}" for n in names) if wall else "–"

    return cell


def _copy_fraction(r: dict) -> str:
    return f"{100 * r['copy_fraction']:.1f}%" + ("†" if r.get("l2_resident") else "")


# (header, alignment, cell) per column. Activation rows are tokens × width (the output width).
_COMMON = [
    ("op", "---", lambda r: f"`{r['op']}`"),
    ("dtype", "---", lambda r: r["dtype"]),
]
_OURS = [
    ("ours (µs)", "---:", lambda r: f"{r['us']['ours']:.2f}"),
    ("ours (GB/s)", "---:", lambda r: f"{r['gbs']['ours']:.0f}"),
    ("% of copy", "---:", _copy_fraction),
]
DEFAULT_COLUMNS = [
    *_COMMON,
    ("tokens × width", "---", lambda r: f"{r['tokens']} × {r['width']}"),
    *_OURS,
    ("vs torch.compile", "---:", _speedup("speedup_vs_compile")),
    ("vs eager", "---:", _speedup("speedup_vs_eager")),
    ("per call: ours / compile (µs)", "---:", _per_call("ours", "compile")),
]


def _after_producer(r: dict) -> str:
    """Decode GPU time after a kernel that does not use PDL (`us_after_producer`), ours / compile."""
    after = r.get("us_after_producer")
    return f"{after['ours']:.2f} / {after['compile']:.2f}" if after else "–"


COLUMNS = {
    # The activation kernels launch with PDL; the extra column shows decode sizes after a
    # producer kernel that does not, where that overlap is gone.
    "activation": [
        *DEFAULT_COLUMNS[:-1],
        ("after a non-PDL kernel: ours / compile (µs)", "---:", _after_producer),
        DEFAULT_COLUMNS[-1],
    ],
    "rmsnorm": [
        *_COMMON,
        ("tokens × hidden", "---", lambda r: f"{r['tokens']} × {r['hidden']}"),
        *_OURS,
        ("vs F.rms_norm", "---:", _speedup("speedup_vs_F.rms_norm")),
        ("vs torch.compile", "---:", _speedup("speedup_vs_compile")),
        ("vs eager", "---:", _speedup("speedup_vs_eager")),
        (
            "per call: ours / F.rms_norm / compile (µs)",
            "---:",
            _per_call("ours", "F.rms_norm", "compile"),
        ),
    ],
    # Quantize ops: the baselines are the reference formula in eager and under torch.compile.
    "quant": [
        *_COMMON,
        ("tokens × hidden", "---", lambda r: f"{r['tokens']} × {r['hidden']}"),
        *_OURS,
        ("vs torch.compile", "---:", _speedup("speedup_vs_compile")),
        ("vs eager", "---:", _speedup("speedup_vs_eager")),
    ],
    # rotary_embedding rows have two more baselines (vLLM's in-place formulation, eager and
    # compiled); the transformers rows show "–" there.
    "rope": [
        *_COMMON,
        (
            "tokens × (q + kv heads) × head_dim",
            "---",
            lambda r: f"{r['tokens']} × ({r['q_heads']} + {r['kv_heads']}) × {r['head_dim']}",
        ),
        *_OURS,
        ("vs torch.compile", "---:", _speedup("speedup_vs_compile")),
        ("vs eager", "---:", _speedup("speedup_vs_eager")),
        ("vs in-place compile", "---:", _speedup("speedup_vs_inplace_compile")),
        ("vs in-place eager", "---:", _speedup("speedup_vs_inplace_eager")),
        ("per call: ours / compile (µs)", "---:", _per_call("ours", "compile")),
    ],
}


def _ratio(key: str):
    """A speedup that may be null (the baseline rejected the shape); † where the baseline was
    timed by plain launches because a CUDA graph could not hold its call (timed_without_graph)."""

    def cell(r: dict) -> str:
        if not r.get(key):
            return "–"
        eager = key.removeprefix("speedup_vs_") in r.get("timed_without_graph", ())
        return f"{r[key]:.2f}×" + ("†" if eager else "")

    return cell


def _attention_shape(r: dict) -> str:
    if r["op"] == "varlen":
        tokens = sum(r["lengths"])
        return (
            f"{r['batch']} sequences, {tokens} tokens (longest {r['seqlen']}) × H{r['heads_q']} × "
            f"D{r['head_dim']}" + (", causal" if r["causal"] else "")
        )
    if r["op"] == "prefill":
        return f"B{r['batch']} × S{r['seqlen']} × H{r['heads_q']} × D{r['head_dim']}" + (
            ", causal" if r["causal"] else ""
        )
    layout = (
        "contiguous"
        if r["layout"] == "contiguous"
        else f"paged {r['layout'].removeprefix('paged')}"
    )
    return f"B{r['batch']} × KV{r['seqlen']}, H{r['heads_q']}/{r['heads_kv']} × D{r['head_dim']}, {layout}"


def _attention_rate(r: dict) -> str:
    if r["op"] != "decode":
        return f"{r['tflops']['ours']:.0f} TFLOP/s"
    return f"{r['gbs']['ours']:.0f} GB/s"


def _attention_peak(r: dict) -> str:
    peak = r.get("peak_mib")
    if not peak:
        return "–"
    return " / ".join(
        "–" if peak.get(n) is None else f"{peak[n]:.0f}" for n in ("ours", "sdpa_flash")
    )


COLUMNS["attention"] = [
    ("workload", "---", lambda r: r["op"]),
    ("dtype", "---", lambda r: r["dtype"]),
    ("shape", "---", _attention_shape),
    ("ours (µs)", "---:", lambda r: f"{r['us']['ours']:.2f}"),
    ("ours", "---:", _attention_rate),
    (
        "% of copy",
        "---:",
        lambda r: f"{100 * r['copy_fraction']:.1f}%" if r.get("copy_fraction") else "–",
    ),
    ("vs SDPA flash", "---:", _ratio("speedup_vs_sdpa_flash")),
    ("vs SDPA cuDNN", "---:", _ratio("speedup_vs_sdpa_cudnn")),
    ("vs SDPA efficient", "---:", _ratio("speedup_vs_sdpa_efficient")),
    ("vs stage 1", "---:", _ratio("speedup_vs_ours_stage1")),
    ("peak MiB at 16K: ours / flash", "---:", _attention_peak),
]


def _bwd_cell(kind: str, what: str):
    """A cell of the backward suite: ours' time (ms) or TFLOP/s, or a baseline's time over ours,
    for `kind` = bwd | fwd_bwd; – where a contender rejected the shape."""

    def cell(r: dict) -> str:
        if what == "ms":
            t = r["us"][kind]["ours"]
            return f"{t / 1000:.2f}" if t else "–"
        if what == "tflops":
            v = r["tflops"][kind]["ours"]
            return f"{v:.0f}" if v else "–"
        v = r["speedup"][kind].get(what)
        return f"{v:.2f}×" if v else "–"

    return cell


def _bwd_peak(r: dict) -> str:
    peak = r.get("peak_mib") or {}
    if not peak:
        return "–"
    return " / ".join(
        "–" if peak.get(n) is None else f"{peak[n]:.0f}"
        for n in ("ours", "sdpa_flash", "sdpa_cudnn")
    )


COLUMNS["attention-bwd"] = [
    (
        "shape",
        "---",
        lambda r: (
            f"B{r['batch']} × S{r['seqlen']} × H{r['heads_q']}/{r['heads_kv']} × "
            f"D{r['head_dim']}" + (", causal" if r["causal"] else "")
        ),
    ),
    ("bwd (ms)", "---:", _bwd_cell("bwd", "ms")),
    ("bwd TFLOP/s", "---:", _bwd_cell("bwd", "tflops")),
    ("bwd vs SDPA flash", "---:", _bwd_cell("bwd", "sdpa_flash")),
    ("bwd vs SDPA cuDNN", "---:", _bwd_cell("bwd", "sdpa_cudnn")),
    ("bwd vs SDPA efficient", "---:", _bwd_cell("bwd", "sdpa_efficient")),
    ("fwd+bwd (ms)", "---:", _bwd_cell("fwd_bwd", "ms")),
    ("fwd+bwd vs SDPA cuDNN", "---:", _bwd_cell("fwd_bwd", "sdpa_cudnn")),
    ("peak MiB at 16K: ours / flash / cuDNN", "---:", _bwd_peak),
]


def quantize_bar_line(results: list[dict], tokens: int = 4096, bar: float = 0.9) -> str:
    """Which quantize ops reach `bar` of the copy ceiling at every size of at least `tokens`
    tokens (the quant issue's bar), and the lowest fraction of each op that does not."""
    worst: dict[str, float] = {}
    for r in results:
        if r["tokens"] >= tokens:
            worst[r["op"]] = min(worst.get(r["op"], 1e9), r["copy_fraction"])
    met = [op for op, f in worst.items() if f >= bar]
    short = [f"{op} {100 * f:.1f}%" for op, f in worst.items() if f < bar]
    return (
        f"At {tokens} tokens and more, {bar:.0%} of copy or better at every size: "
        f"{', '.join(met) or 'none'}; lowest of the others: {', '.join(short) or 'none'} "
        "(quant/benchmarks/NOTES.md)."
    )


def _gemm_ratio(*keys: str):
    """Speed-ups of ours from the row's `speedup` (null: a contender did not run the shape)."""

    def cell(r: dict) -> str:
        values = [r["speedup"].get(k) for k in keys]
        return " / ".join("–" if v is None else f"{v:.2f}×" for v in values)

    return cell


def _gemm_weight_rate(r: dict, copy_gbs: float) -> str:
    """Weight GB/s of ours and its share of the copy ceiling, at decode sizes (M <= 16) only."""
    if r["m"] > 16:
        return "–"
    return f"{r['gbs']['ours']:.0f} ({100 * r['gbs']['ours'] / copy_gbs:.0f}%)"


COLUMNS["quant-gemm"] = [
    ("layer (K→N)", "---", lambda r: f"{r['model']} {r['layer']} ({r['k']}→{r['n']})"),
    ("M", "---:", lambda r: str(r["m"])),
    ("ours fp8 (µs)", "---:", lambda r: f"{r['us']['ours']:.2f}"),
    ("TFLOP/s", "---:", lambda r: f"{r['tflops']['ours']:.0f}"),
    ("weights GB/s (% copy)", "---:", None),  # filled by render: needs the payload's ceiling
    ("fp8 token / tensor vs bf16", "---:", _gemm_ratio("fp8_token_vs_bf16", "fp8_tensor_vs_bf16")),
    (
        "vs _scaled_mm: token / tensor",
        "---:",
        _gemm_ratio("fp8_token_vs_scaled_mm_row", "fp8_tensor_vs_scaled_mm_tensor"),
    ),
    ("int8 vs bf16", "---:", _gemm_ratio("int8_vs_bf16")),
    (
        "int8 vs _int_mm: eager / compile",
        "---:",
        _gemm_ratio("int8_vs_int_mm_eager", "int8_vs_int_mm_compile"),
    ),
    ("blockwise vs _scaled_mm tensor", "---:", _gemm_ratio("block_vs_scaled_mm_tensor")),
    (
        "fused vs unfused: silu / gelu_tanh",
        "---:",
        _gemm_ratio("silu_fused_vs_unfused", "gelu_tanh_fused_vs_unfused"),
    ),
    ("quantize + ours vs bf16", "---:", _gemm_ratio("e2e_fp8_token_vs_bf16")),
]


COLUMNS["quant-int4"] = [
    ("layer (K→N)", "---", lambda r: f"{r['model']} {r['layer']} ({r['k']}→{r['n']})"),
    ("M", "---:", lambda r: str(r["m"])),
    (
        "ours GPTQ / AWQ (µs)",
        "---:",
        lambda r: f"{r['us']['ours']:.2f} / {r['us']['ours_awq']:.2f}",
    ),
    ("weights GB/s", "---:", lambda r: f"{r['gbs']['ours']:.0f}"),
    ("% of copy", "---:", lambda r: f"{100 * r['copy_fraction']:.1f}%"),
    ("bf16 F.linear (µs)", "---:", lambda r: f"{r['us']['bf16']:.2f}"),
    ("vs bf16", "---:", _speedup("speedup_vs_bf16")),
    (
        "vs fp8 / int8 W8A8",
        "---:",
        lambda r: f"{_speedup('speedup_vs_fp8_w8a8')(r)} / {_speedup('speedup_vs_int8_w8a8')(r)}",
    ),
]


def int4_bar_lines(verdicts: list[dict]) -> list[str]:
    """One table row per bar of the int4 issue: the worst value over the rows it covers."""
    lines = ["| bar | worst | rows | verdict |", "|---|---:|---:|---|"]
    for v in verdicts:
        worst = "–" if v["worst"] is None else f"{v['worst']:.2f}"
        lines.append(f"| {v['bar']} | {worst} | {v['rows']} | {v['verdict']} |")
    return lines


def gemm_bar_lines(verdicts: list[dict]) -> list[str]:
    """One table row per bar of the quant GEMM issue: its worst ratio over every M it covers and
    the M that miss it (the sweep's `bars`, one entry per bar and M)."""
    lines = ["| bar | worst | where | M below the bar | verdict |", "|---|---:|---|---|---|"]
    for bar in dict.fromkeys(v["bar"] for v in verdicts):
        measured = [v for v in verdicts if v["bar"] == bar and v["pass"] is not None]
        if not measured:
            lines.append(f"| {bar} | – | – | – | not measured |")
            continue
        worst = min(measured, key=lambda v: v["worst"])
        failing = ", ".join(str(v["m"]) for v in measured if not v["pass"]) or "–"
        verdict = "PASS" if all(v["pass"] for v in measured) else "FAIL"
        lines.append(
            f"| {bar} | {worst['worst']:.2f}× | M={worst['m']}, {worst['where']} | {failing} "
            f"| {verdict} |"
        )
    return lines


_DEFAULT_NOTE = (
    "GPU times and ratios are medians of CUDA-graph replay (launch overhead excluded for every "
    "contender); the last column is the per-call time an eager caller sees."
)
NOTES = {
    "quant": (
        "GPU times and ratios are medians of CUDA-graph replay (launch overhead excluded for every "
        "contender); a ratio is the baseline's time over ours (above 1: ours is faster)."
    ),
    "attention": (
        "GPU times and ratios are medians of CUDA-graph replay (launch overhead excluded for every "
        "contender); a ratio is the baseline's time over ours (above 1: ours is faster), – where the "
        "backend rejects the shape; decode baselines read a contiguous cache; `vs stage 1` (H100 / "
        "H200 prefill) is the sm_80+ kernel on the calls the Hopper kernel takes (ATTENTION_HOPPER=0); "
        "† marks a baseline timed by plain back-to-back launches (triton do_bench) because a CUDA graph "
        "cannot hold its call (SDPA cuDNN on nested tensors); the last column is the memory each call "
        "allocates beyond its inputs."
    ),
    "attention-bwd": (
        "The backward (`torch.autograd.grad` of a stored forward) and the forward + backward of "
        "flash_attn_func against SDPA's backends on the same inputs, GQA 32/8; a ratio is the "
        "baseline's time over ours (above 1: ours is faster), – where a contender rejects the "
        "shape."
    ),
    "quant-gemm": (
        "GPU times are medians of CUDA-graph replay, each call reading its weight from DRAM "
        "(rotated copies larger than twice the L2); a ratio is the baseline's time over ours "
        "(above 1: ours is faster), – where that contender did not run the shape; `ours` is fp8 "
        "per-token × per-channel; the quantized activation is an input, except in the last "
        "column (per-token quantize + ours against bf16 F.linear)."
    ),
    "quant-int4": (
        "GPU times are medians of CUDA-graph replay, each call reading its weight from DRAM "
        "(rotated copies larger than twice the L2); `ours` is symmetric int4 (GPTQ's format) in "
        "groups of 128, AWQ adds zero points; GB/s and % of copy count the int4 weight bytes and "
        "the scales over our time; a ratio is the baseline's time over ours (above 1: ours is "
        "faster); the W8A8 baselines take pre-quantized activations."
    ),
}


def render(kernel: str, payload: dict) -> str:
    env = payload["environment"]
    keep = ROW_FILTERS.get(kernel, lambda r: True)
    columns = COLUMNS.get(kernel, DEFAULT_COLUMNS)
    if kernel == "quant-gemm":
        rate = (
            "weights GB/s (% copy)",
            "---:",
            lambda r: _gemm_weight_rate(r, payload["copy_gbs"]),
        )
        columns = [rate if c[2] is None else c for c in columns]
    rows = [r for r in payload["results"] if keep(r)]
    ceiling = (
        f" Copy ceiling measured in the same run: {payload['copy_gbs']:.0f} GB/s."
        if "copy_gbs" in payload
        else ""
    )
    lines = [
        f"{env['device']}, torch {env['torch']}, CUDA {env['cuda']}, triton {env.get('triton')}, "
        f"commit `{env['commit'][:12]}`, build `{env.get('kernel_id', '?')}`, {env['date'][:10]}."
        + ceiling,
        "",
        "| " + " | ".join(header for header, _, _ in columns) + " |",
        "|" + "|".join(align for _, align, _ in columns) + "|",
    ]
    lines += ["| " + " | ".join(cell(r) for _, _, cell in columns) + " |" for r in rows]
    lines.append("")
    lines.append(
        f"{NOTES.get(kernel, _DEFAULT_NOTE)} Full results: `{results_dir(kernel)}/`. "
        f"Method: {payload['method']}."
    )
    if "baselines" in payload:
        lines.append(f"Baselines: {payload['baselines']}.")
    if any(r.get("l2_resident") for r in rows):
        lines.append(
            "† The bytes moved fit in the L2 cache: replays read cached data (for every contender "
            "alike), so GB/s may exceed the copy ceiling."
        )
    if kernel == "quant":
        lines.append(quantize_bar_line(payload["results"]))
    if payload.get("bars"):
        bar_lines = int4_bar_lines if kernel == "quant-int4" else gemm_bar_lines
        lines += ["", *bar_lines(payload["bars"])]
    return "\n".join(lines)


def no_results(kernel: str) -> str:
    folder, _, script = SUITES.get(kernel, (kernel, None, "benchmarks/sweep.py"))
    return (
        f"No results yet: this table is generated from `{results_dir(kernel)}/*.json` and "
        f"appears after the first GPU run of `{folder}/{script}`."
    )


_BEGIN = re.compile(r"<!-- BEGIN bench:([^\s>]+) -->")


def generated_readme(text: str, root: Path = REPO_ROOT) -> str:
    """`text` with each kernel's table regenerated: from its result files, or a line saying that
    none exist yet for a kernel whose markers are in the README but that has no results."""
    with_results = {
        d.parent.parent.name: files
        for d in sorted(root.glob("*/benchmarks/results"))
        if (files := sorted(d.glob("*.json")))
    }
    for suite in SUITES:
        if files := sorted((root / results_dir(suite)).glob("*.json")):
            with_results[suite] = files
    for kernel in sorted(set(with_results) | set(_BEGIN.findall(text))):
        pattern = re.compile(
            rf"(<!-- BEGIN bench:{re.escape(kernel)} -->\n).*?(<!-- END bench:{re.escape(kernel)} -->)",
            re.S,
        )
        if not pattern.search(text):
            raise SystemExit(
                f"README.md has no `<!-- BEGIN bench:{kernel} -->` … `<!-- END bench:{kernel} -->` pair"
            )
        files = with_results.get(kernel)
        if files:
            body = "\n\n".join(render(kernel, json.loads(f.read_text())) for f in files)
        elif (root / SUITES.get(kernel, (kernel,))[0]).is_dir():
            body = no_results(kernel)
        else:
            raise SystemExit(
                f"README.md has markers for bench:{kernel} but there is no {kernel}/ kernel folder"
            )
        text = pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    current = README.read_text()
    wanted = e2e_table.generated_readme(generated_readme(current))
    if args.check:
        if wanted != current:
            print(
                "README.md benchmark tables differ from the result files; run scripts/bench_table.py"
            )
            return 1
        return 0
    README.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
