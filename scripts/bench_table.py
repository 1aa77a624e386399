#!/usr/bin/env python3
"""Regenerate the benchmark tables of README.md from <kernel>/benchmarks/results/*.json.

    python scripts/bench_table.py          rewrite README.md in place
    python scripts/bench_table.py --check  exit 1 if README.md differs from the result files

Each kernel's table sits between `<!-- BEGIN bench:<kernel> -->` and `<!-- END bench:<kernel> -->`.
Numbers are never typed into the README: tests/test_bench_table.py fails on any drift.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"


def _activation_rows(result: dict) -> bool:
    """The rows the README shows for activation: the issue's headline shapes."""
    if result["width"] != 14336:
        return False
    if result["op"] in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"):
        return result["tokens"] in (1, 128, 8192, 32768)
    return result["tokens"] == 8192


ROW_FILTERS = {"activation": _activation_rows}


def _per_call(result: dict) -> str:
    wall = result.get("wall_us")
    return f"{wall['ours']:.1f} / {wall['compile']:.1f}" if wall else "–"


def render(kernel: str, payload: dict) -> str:
    env = payload["environment"]
    keep = ROW_FILTERS.get(kernel, lambda r: True)
    lines = [
        f"{env['device']}, torch {env['torch']}, CUDA {env['cuda']}, triton {env.get('triton')}, "
        f"commit `{env['commit'][:12]}`, build `{env.get('kernel_id', '?')}`, {env['date'][:10]}. "
        f"Copy ceiling measured in the same run: {payload['copy_gbs']:.0f} GB/s.",
        "",
        "| op | dtype | tokens × width | ours (µs) | ours (GB/s) | % of copy | vs torch.compile | vs eager "
        "| per call: ours / compile (µs) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in payload["results"]:
        if not keep(r):
            continue
        lines.append(
            f"| `{r['op']}` | {r['dtype']} | {r['tokens']} × {r['width']} | {r['us']['ours']:.2f} "
            f"| {r['gbs']['ours']:.0f} | {100 * r['copy_fraction']:.1f}% "
            f"| {r['speedup_vs_compile']:.2f}× | {r['speedup_vs_eager']:.2f}× | {_per_call(r)} |"
        )
    lines.append("")
    lines.append(
        f"GPU times and ratios are medians of CUDA-graph replay (launch overhead excluded for every "
        f"contender); the last column is the per-call time an eager caller sees. Full results: "
        f"`{kernel}/benchmarks/results/`. Method: {payload['method']}."
    )
    return "\n".join(lines)


def generated_readme(text: str) -> str:
    for results_dir in sorted(REPO_ROOT.glob("*/benchmarks/results")):
        kernel = results_dir.parent.parent.name
        files = sorted(results_dir.glob("*.json"))
        if not files:
            continue
        body = "\n\n".join(render(kernel, json.loads(f.read_text())) for f in files)
        pattern = re.compile(
            rf"(<!-- BEGIN bench:{re.escape(kernel)} -->\n).*?(<!-- END bench:{re.escape(kernel)} -->)",
            re.S,
        )
        if not pattern.search(text):
            raise SystemExit(f"README.md has no markers for bench:{kernel}")
        text = pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    current = README.read_text()
    wanted = generated_readme(current)
    if args.check:
        if wanted != current:
            print("README.md benchmark tables differ from the result files; run scripts/bench_table.py")
            return 1
        return 0
    README.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
