"""The end-to-end tables of README.md, generated from results/e2e/*.json (scripts/e2e.py).

`scripts/bench_table.py` (and its --check) regenerates them along with the kernels' benchmark
tables. They sit between `<!-- BEGIN e2e -->` and `<!-- END e2e -->`, one per result file
(sorted by name). Numbers are never typed into the README: tests/test_e2e.py fails on any drift.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path("results") / "e2e"
CONFIGS = ("eager", "eager+kit", "compile", "compile+kit")
TITLES = {
    ("llama", "full"): "Llama-3-8B",
    ("qwen3", "full"): "Qwen3-8B",
    ("ltx", "full"): "LTX-Video transformer (2B), 49 frames 768x512",
}
PATTERN = re.compile(r"(<!-- BEGIN e2e -->\n).*?(<!-- END e2e -->)", re.S)


def _ms(value) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _ratio(value) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _check_line(doc: dict) -> str:
    check = doc.get("check")
    if not check:
        return "Check: skipped."
    parts = [
        f"{c['name']}: kit−fp32 max {c['kit_vs_fp32']['max']:.2g} ≤ {c['tolerance']['max']:.2g}, "
        f"mean {c['kit_vs_fp32']['mean']:.2g} ≤ {c['tolerance']['mean']:.2g}"
        for c in check["cases"]
    ]
    verdict = "passed" if check["passed"] else "FAILED"
    return f"Check {verdict} (tolerance {check['k']:g} × the model's own bf16−fp32 error): " + (
        "; ".join(parts)
    )


def render(doc: dict) -> str:
    env = doc["environment"]
    title = TITLES.get((doc["model"], doc["size"]), f"{doc['model']} ({doc['size']})")
    commit = env["commit"][:12] + (" (dirty)" if env.get("dirty") else "")
    lines = [
        f"**{title}** — {env['device']}, {doc['dtype']}, torch {env['torch']}, transformers "
        f"{env['transformers']}, diffusers {env['diffusers']}, kernels {env['kernels']}, "
        f"commit `{commit}`, {env['date'][:10]}"
        + ("" if doc.get("complete") else " (partial run)")
        + ".",
        "",
        "| phase | shape | "
        + " | ".join(f"{c} (ms)" for c in CONFIGS)
        + " | kit vs eager | compile+kit vs compile |",
        "|---|---|" + "---:|" * (len(CONFIGS) + 2),
    ]
    times = {(m["phase"], m["shape"], m["config"]): m["median_ms"] for m in doc["measurements"]}
    for s in doc["speedups"]:
        cells = [_ms(times.get((s["phase"], s["shape"], c))) for c in CONFIGS]
        lines.append(
            f"| {s['phase']} | {s['shape']} | "
            + " | ".join(cells)
            + f" | {_ratio(s['kit_vs_eager'])} | {_ratio(s['compile_kit_vs_compile'])} |"
        )
    lines += ["", _check_line(doc)]
    compiled = doc.get("kit_compile")
    if compiled is not None and set(compiled) != set(doc["kit"]):
        lines.append(
            f"compile+kit maps in {', '.join(compiled) or 'nothing'} of the kit; Inductor "
            "compiles the rest (`COMPILE_KERNELS` in scripts/e2e.py says why)."
        )
    profile = doc.get("profile")
    if profile:
        shares = sorted(profile["families"].items(), key=lambda kv: -kv[1]["share"])
        lines.append(
            f"GPU time of {profile['config']} {profile['phase']} {profile['shape']} "
            f"({profile['total_us'] / 1000:.1f} ms): "
            + ", ".join(f"{name} {100 * f['share']:.0f}%" for name, f in shares if f["us"] > 0)
            + "."
        )
    if doc.get("errors"):
        lines.append("Errors: " + "; ".join(doc["errors"]) + ".")
    return "\n".join(lines)


def no_results() -> str:
    return (
        "No results yet: these tables are generated from `results/e2e/*.json` and appear after "
        "the first GPU run of `scripts/e2e.py` (see above)."
    )


def generated_readme(text: str, root: Path = REPO_ROOT) -> str:
    if not PATTERN.search(text):
        raise SystemExit("README.md has no `<!-- BEGIN e2e -->` … `<!-- END e2e -->` pair")
    files = sorted((root / RESULTS).glob("*.json"))
    body = "\n\n".join(render(json.loads(f.read_text())) for f in files) or no_results()
    return PATTERN.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
