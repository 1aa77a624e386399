"""The README's plots are generated from the committed result files and kept fresh."""

import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import plots  # noqa: E402


def test_committed_plots_match_the_result_files():
    found = plots.problems()
    assert not found, "\n".join(found + ["run: python scripts/plots.py"])


def test_readme_shows_every_plot():
    readme = (REPO / "README.md").read_text()
    planned = plots.plan()
    assert {p.kind for p in planned} >= {"scaling", "roofline"}
    for plot in planned:
        assert f"](docs/plots/{plot.name})" in readme, plot.name


def test_every_committed_op_has_a_flop_count():
    """An op without one would silently drop out of its kernel's roofline."""
    for plot in plots.plan():
        if plot.kind != "roofline":
            continue
        for path in plot.inputs:
            for r in json.loads((REPO / path).read_text())["results"]:
                assert plots.flops(plot.subject, r), f"{path}: {r['op']} has no FLOP count"


def test_generic_panels_keep_one_op_each():
    """A kernel without its own panels gets one per op; each panel holds only its op's rows (the
    op was left out of the filter once, so every panel drew every op)."""
    rows = [
        {"op": op, "dtype": "bfloat16", "hidden": 4096, "tokens": t}
        for op in ("fp8_per_token", "int8_asym")
        for t in (1, 4096)
    ]
    panels = plots.generic_panels(rows)
    assert [p.title.split(",")[0] for p in panels] == ["fp8_per_token", "int8_asym"]
    for panel in panels:
        kept = [r for r in rows if panel.keep(r)]
        assert {r["op"] for r in kept} == {panel.title.split(",")[0]}
        assert len(kept) == 2


def _payload(device, copy_gbs, scale):
    """A small rmsnorm result file: rms_norm at bf16 / hidden 4096, three token counts."""
    rows = []
    for tokens in (1, 64, 4096):
        nbytes = 2 * tokens * 4096 * 2 + 4096 * 2
        us = {"ours": scale * (2 + tokens / 200), "eager": 10 + tokens / 20, "compile": 3.0}
        rows.append(
            {
                "op": "rms_norm",
                "dtype": "bfloat16",
                "tokens": tokens,
                "hidden": 4096,
                "bytes": nbytes,
                "l2_resident": tokens < 4096,
                "us": us,
                "gbs": {k: nbytes / (v * 1e-6) / 1e9 for k, v in us.items()},
            }
        )
    return {"environment": {"device": device}, "copy_gbs": copy_gbs, "results": rows}


def _measure(phase, shape, config, ms):
    return {"phase": phase, "shape": shape, "config": config, "median_ms": ms}


# The keys of scripts/e2e.py's "e2e/1" documents that the plot reads.
E2E_FIXTURE = {
    "schema": "e2e/1",
    "complete": False,
    "model": "qwen3",
    "size": "full",
    "environment": {"device": "NVIDIA H100 80GB HBM3"},
    "measurements": [
        _measure("prefill", "1x2048", "eager", 40.0),
        _measure("prefill", "1x2048", "eager+kit", 34.0),
        _measure("prefill", "1x2048", "compile", 30.0),
        _measure("prefill", "1x2048", "compile+kit", 27.5),
        _measure("decode", "8x2048", "eager", 12.0),
        _measure("decode", "8x2048", "eager+kit", 10.0),
        _measure("decode", "8x2048", "compile", 8.0),
        _measure("decode", "1x2048", "compile", 5.0),  # no eager time: left out
    ],
    "profile": {
        "config": "eager+kit",
        "phase": "prefill",
        "shape": "1x2048",
        "families": {"attention": {"share": 0.3}, "gemm": {"share": 0.6}, "other": {"share": 0.1}},
    },
}


@pytest.fixture
def tree(tmp_path):
    """A repository with one kernel's results, an e2e file and a README with the plots block."""
    results = tmp_path / "rmsnorm" / "benchmarks" / "results"
    results.mkdir(parents=True)
    (results / "gpu-a.json").write_text(json.dumps(_payload("NVIDIA GPU A", 3000.0, 1.0)))
    (results / "gpu-b.json").write_text(json.dumps(_payload("NVIDIA GPU B", 4000.0, 0.8)))
    (tmp_path / "README.md").write_text("# r\n\n<!-- BEGIN plots -->\n<!-- END plots -->\n")
    return tmp_path


def test_generated_plots_are_fresh_and_staleness_is_caught(tree):
    assert plots.problems(tree) == [f"{plots.PLOTS_DIR / plots.MANIFEST} is missing"]
    made = plots.generate(tree)
    assert [p.name for p in made] == ["rmsnorm-scaling.png", "rmsnorm-roofline.png"]
    for p in made:
        assert (tree / plots.PLOTS_DIR / p.name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plots.problems(tree) == []
    readme = (tree / "README.md").read_text()
    assert "](docs/plots/rmsnorm-roofline.png)" in readme and "No end-to-end plot yet" in readme

    # new numbers in a result file: both plots are older than their inputs
    path = tree / "rmsnorm" / "benchmarks" / "results" / "gpu-b.json"
    path.write_text(json.dumps(_payload("NVIDIA GPU B", 4100.0, 0.8)))
    assert plots.problems(tree) == [
        "docs/plots/rmsnorm-scaling.png is older than its inputs",
        "docs/plots/rmsnorm-roofline.png is older than its inputs",
    ]
    plots.generate(tree)
    assert plots.problems(tree) == []

    png = tree / plots.PLOTS_DIR / "rmsnorm-scaling.png"
    png.write_bytes(png.read_bytes() + b"\0")  # touched by hand
    assert plots.problems(tree) == [
        "docs/plots/rmsnorm-scaling.png differs from the one the script drew"
    ]
    png.unlink()
    assert plots.problems(tree) == ["docs/plots/rmsnorm-scaling.png is missing"]
    plots.generate(tree)

    (tree / "README.md").write_text(readme.replace("](docs/plots/rmsnorm-roofline.png)", "]()"))
    assert plots.problems(tree) == ["the plots block of README.md differs from the plots"]
    (tree / "README.md").write_text("# r\n")
    assert plots.problems(tree) == [
        "README.md has no `<!-- BEGIN plots -->` … `<!-- END plots -->` block"
    ]
    (tree / "README.md").write_text(readme)

    # the results go away: their plots must go too
    shutil.rmtree(tree / "rmsnorm" / "benchmarks" / "results")
    (tree / "other" / "benchmarks" / "results").mkdir(parents=True)
    (tree / "other" / "benchmarks" / "results" / "gpu-a.json").write_text(
        json.dumps(_payload("NVIDIA GPU A", 3000.0, 1.0))
    )
    found = plots.problems(tree)
    assert "docs/plots/rmsnorm-scaling.png has no inputs any more" in found
    assert "docs/plots/other-scaling.png is missing" in found
    plots.generate(tree)  # a kernel without a SCALING entry gets the generic panels
    assert plots.problems(tree) == []
    assert not (tree / plots.PLOTS_DIR / "rmsnorm-scaling.png").exists()


def test_e2e_plot_from_a_fixture(tree, capsys):
    e2e = tree / plots.E2E_DIR
    e2e.mkdir(parents=True)
    (e2e / "qwen3.json").write_text(json.dumps(E2E_FIXTURE))
    made = plots.generate(tree)
    assert [p.name for p in made if p.kind == "e2e"] == ["e2e-qwen3.png"]
    assert (tree / plots.PLOTS_DIR / "e2e-qwen3.png").stat().st_size > 1000
    assert "qwen3 decode 1x2048: no eager time, left out" in capsys.readouterr().out
    groups = plots.e2e_groups(E2E_FIXTURE)
    assert [label for label, _ in groups] == ["prefill\n1x2048", "decode\n8x2048"]
    assert groups[1][1] == {"eager": 12.0, "eager+kit": 10.0, "compile": 8.0}
    readme = (tree / "README.md").read_text()
    assert "](docs/plots/e2e-qwen3.png)" in readme and "No end-to-end" not in readme
    assert plots.problems(tree) == []
    (e2e / "qwen3.json").unlink()
    assert plots.problems(tree) == [
        "docs/plots/e2e-qwen3.png has no inputs any more",
        "the plots block of README.md differs from the plots",
    ]
    (tree / plots.PLOTS_DIR / "stray.png").write_bytes(b"")
    assert "docs/plots/stray.png is not generated by scripts/plots.py" in plots.problems(tree)


def test_drawing_is_deterministic(tree):
    """Same inputs, same bytes: no date or software version in the file, fixed size and dpi."""
    payloads = [_payload("NVIDIA GPU A", 3000.0, 1.0)]
    first, second = tree / "a.png", tree / "b.png"
    plots.draw_roofline("rmsnorm", payloads, first)
    plots.draw_roofline("rmsnorm", payloads, second)
    assert first.read_bytes() == second.read_bytes()
    assert b"matplotlib" not in first.read_bytes().lower()
    plots.draw_e2e(E2E_FIXTURE, first)
    plots.draw_e2e(E2E_FIXTURE, second)
    assert first.read_bytes() == second.read_bytes()
    no_profile = dict(E2E_FIXTURE, profile=None)
    plots.draw_e2e(no_profile, first)
    plots.draw_e2e(no_profile, second)
    assert first.read_bytes() == second.read_bytes()


def test_check_needs_no_matplotlib(monkeypatch):
    """--check only hashes files, so a CI job without matplotlib can run it."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    assert plots.main(["--check"]) == 0


def _gemm_payload(device):
    """A small GEMM sweep result (quant/benchmarks/gemm_sweep.py's keys the plot reads)."""
    rows = []
    for layer, n, k in (("qkv", 6144, 4096), ("down", 4096, 14336)):
        for m in (1, 16, 2048):
            us = {"bf16": 40.0 + m / 10, "ours": 22.0 + m / 20, "scaled_mm_row": 30.0 + m / 20}
            us["int_mm_compile"] = None if m <= 16 else 50.0
            rows.append({"model": "llama3-8b", "layer": layer, "m": m, "n": n, "k": k, "us": us})
    return {"environment": {"device": device}, "copy_gbs": 4000.0, "suite": "gemm", "results": rows}


def test_gemm_plot_from_the_gemm_results(tree):
    """quant's GEMM results (results/gemm/) get a plot of their own under the quant heading;
    the kernel's own plots do not read them."""
    gemm = tree / "quant" / "benchmarks" / "results" / "gemm"
    gemm.mkdir(parents=True)
    (gemm / "gpu-a.json").write_text(json.dumps(_gemm_payload("NVIDIA GPU A")))
    made = plots.generate(tree)
    assert [p.name for p in made if p.subject == "quant"] == ["quant-gemm.png"]
    png = tree / plots.PLOTS_DIR / "quant-gemm.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    readme = (tree / "README.md").read_text()
    assert "#### quant\n\n![quant GEMMs: speed-up over bf16" in readme
    assert plots.problems(tree) == []
    first, second = tree / "a.png", tree / "b.png"
    for path in (first, second):
        plots.draw_gemm("quant", [_gemm_payload("NVIDIA GPU A")], path)
    assert first.read_bytes() == second.read_bytes()
