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


def _check_line(doc: dict, variant: str) -> str:
    check = doc.get("check")
    if not check:
        return "Check: skipped."
    parts = [
        f"{c['name']}: {variant}−fp32 max {c['kit_vs_fp32']['max']:.2g} ≤ "
        f"{c['tolerance']['max']:.2g}, mean {c['kit_vs_fp32']['mean']:.2g} ≤ "
        f"{c['tolerance']['mean']:.2g}"
        for c in check["cases"]
    ]
    verdict = "passed" if check["passed"] else "FAILED"
    own = "the model's own" if variant == "kit" else "the dequantized-weight model's own"
    return f"Check {verdict} (tolerance {check['k']:g} × {own} bf16−fp32 error): " + (
        "; ".join(parts)
    )


def render(doc: dict) -> str:
    env = doc["environment"]
    title = TITLES.get((doc["model"], doc["size"]), f"{doc['model']} ({doc['size']})")
    # The variant set against eager and compile: the kit, or (--quant int4) the int4 twin.
    quant = doc.get("quant")
    variant = "int4" if quant else "kit"
    configs = ("eager", f"eager+{variant}", "compile", f"compile+{variant}")
    if quant:
        title += (
            f", int4 weights (groups of {quant['group_size']}, {quant['replaced']} modules "
            "replaced)"
        )
    commit = env["commit"][:12] + (" (dirty)" if env.get("dirty") else "")
    lines = [
        f"**{title}** — {env['device']}, {doc['dtype']}, torch {env['torch']}, transformers "
        f"{env['transformers']}, diffusers {env['diffusers']}, kernels {env['kernels']}, "
        f"commit `{commit}`, {env['date'][:10]}"
        + ("" if doc.get("complete") else " (partial run)")
        + ".",
        "",
        "| phase | shape | "
        + " | ".join(f"{c} (ms)" for c in configs)
        + f" | {variant} vs eager | compile+{variant} vs compile |",
        "|---|---|" + "---:|" * (len(configs) + 2),
    ]
    times = {(m["phase"], m["shape"], m["config"]): m["median_ms"] for m in doc["measurements"]}
    for s in doc["speedups"]:
        cells = [_ms(times.get((s["phase"], s["shape"], c))) for c in configs]
        lines.append(
            f"| {s['phase']} | {s['shape']} | "
            + " | ".join(cells)
            + f" | {_ratio(s[f'{variant}_vs_eager'])}"
            + f" | {_ratio(s[f'compile_{variant}_vs_compile'])} |"
        )
    lines += ["", _check_line(doc, variant)]
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
