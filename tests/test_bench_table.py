"""README benchmark tables are generated from the result files, never typed."""

import dataclasses
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import bench_table  # noqa: E402


def test_readme_tables_match_result_files():
    readme = (REPO / "README.md").read_text()
    assert bench_table.generated_readme(readme) == readme, "run: python scripts/bench_table.py"


def test_every_result_file_records_its_provenance():
    for path in REPO.glob("*/benchmarks/results/*.json"):
        payload = json.loads(path.read_text())
        env = payload["environment"]
        for key in ("device", "torch", "cuda", "commit", "kernel_id", "date"):
            assert env.get(key), f"{path}: environment.{key} missing"
        assert payload["copy_gbs"] > 0 and payload["results"], path
        # attention's baselines are PyTorch's SDPA backends (there is no eager / compiled formula
        # worth timing at these sizes); the other kernels compare with eager and torch.compile
        kernel = path.parent.parent.parent.name
        required = (
            {"ours", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient"}
            if kernel == "attention"
            else {"ours", "eager", "compile"}
        )
        for r in payload["results"]:
            assert set(r["us"]) >= required, f"{path}: baselines missing"


def _environment(kernel: str, date: str) -> dict:
    """The provenance block of a made-up result file of `kernel`."""
    return {
        "device": "GPU X",
        "torch": "2.11",
        "cuda": "13.0",
        "commit": "abc",
        "date": date,
        "kernel_id": f"_{kernel}_cuda_abc1234",
    }


def test_table_follows_the_numbers(tmp_path):
    payload = {
        "environment": _environment("activation", "2026-11-21"),
        "copy_gbs": 4000.0,
        "method": "m",
        "results": [
            {
                "op": "silu_and_mul",
                "dtype": "bfloat16",
                "tokens": 8192,
                "width": 14336,
                "us": {"ours": 200.0, "eager": 600.0, "compile": 210.0},
                "gbs": {"ours": 3600.0},
                "copy_fraction": 0.9,
                "speedup_vs_compile": 1.05,
                "speedup_vs_eager": 3.0,
            }
        ],
    }
    table = bench_table.render("activation", payload)
    assert (
        "| `silu_and_mul` | bfloat16 | 8192 × 14336 | 200.00 | 3600 | 90.0% | 1.05× | 3.00× | – |"
        in table
    )


def _rmsnorm_row(op, dtype, tokens, hidden, us, **extra):
    """A result row as rmsnorm/benchmarks/sweep.py writes it."""
    nbytes = 2 * tokens * hidden * 2 + hidden * 2
    row = {
        "op": op,
        "dtype": dtype,
        "tokens": tokens,
        "hidden": hidden,
        "bytes": nbytes,
        "l2_resident": nbytes <= 50 * 2**20,
        "us": us,
        "gbs": {k: nbytes / (v * 1e-6) / 1e9 for k, v in us.items()},
        "copy_fraction": nbytes / (us["ours"] * 1e-6) / 1e9 / 4000.0,
    }
    for name in ("eager", "F.rms_norm", "compile"):
        row[f"speedup_vs_{name}"] = us[name] / us["ours"]
    row.update(extra)
    return row


def test_rmsnorm_table_follows_the_numbers():
    payload = {
        "environment": _environment("rmsnorm", "2026-11-21"),
        "copy_gbs": 4000.0,
        "method": "m",
        "baselines": "b",
        "results": [
            _rmsnorm_row(
                "rms_norm",
                "bfloat16",
                1,
                4096,
                {"ours": 2.0, "eager": 8.0, "F.rms_norm": 3.0, "compile": 2.5},
                wall_us={"ours": 5.0, "F.rms_norm": 7.5, "compile": 20.25},
            ),
            _rmsnorm_row(
                "rms_norm",
                "bfloat16",
                65536,
                8192,
                {"ours": 500.0, "eager": 6000.0, "F.rms_norm": 600.0, "compile": 750.0},
            ),
            _rmsnorm_row(
                "rms_norm",
                "float16",
                4096,
                4096,
                {"ours": 1.0, "eager": 1.0, "F.rms_norm": 1.0, "compile": 1.0},
            ),
            _rmsnorm_row(
                "rms_norm",
                "bfloat16",
                4096,
                2048,
                {"ours": 1.0, "eager": 1.0, "F.rms_norm": 1.0, "compile": 1.0},
            ),
        ],
    }
    table = bench_table.render("rmsnorm", payload)
    assert (
        "| op | dtype | tokens × hidden | ours (µs) | ours (GB/s) | % of copy | vs F.rms_norm | vs torch.compile "
        "| vs eager | per call: ours / F.rms_norm / compile (µs) |"
    ) in table
    assert (
        "| `rms_norm` | bfloat16 | 1 × 4096 | 2.00 | 12 | 0.3%† | 1.50× | 1.25× | 4.00× | 5.0 / 7.5 / 20.2 |"
        in table
    )
    assert (
        "| `rms_norm` | bfloat16 | 65536 × 8192 | 500.00 | 4295 | 107.4% | 1.20× | 1.50× | 12.00× | – |"
        in table
    )
    assert "| float16 |" not in table and "× 2048" not in table  # outside the README's rows
    assert "Baselines: b." in table and "† The bytes moved fit in the L2 cache" in table


def test_attention_varlen_row_shows_its_sequences():
    """A varlen row of the attention sweep (packed sequences) renders with its sequence count,
    tokens and longest length, and its rate in TFLOP/s."""
    row = {
        "op": "varlen",
        "dtype": "bfloat16",
        "batch": 3,
        "seqlen": 4096,
        "head_dim": 128,
        "heads_q": 32,
        "heads_kv": 32,
        "causal": True,
        "layout": "contiguous",
        "lengths": [4096, 2048, 128],
        "us": {"ours": 100.0},
        "tflops": {"ours": 512.4},
        "speedup_vs_sdpa_flash": 1.5,
        "speedup_vs_sdpa_cudnn": None,
    }
    assert bench_table.ROW_FILTERS["attention"](row)
    cells = [fn(row) for _, _, fn in bench_table.COLUMNS["attention"]]
    assert cells[2] == "3 sequences, 6272 tokens (longest 4096) × H32 × D128, causal"
    assert cells[4] == "512 TFLOP/s" and cells[6] == "1.50×" and cells[7] == "–"
    # A baseline timed without a CUDA graph (its capture failed) is marked.
    row.update(speedup_vs_sdpa_cudnn=0.8, timed_without_graph=["sdpa_cudnn"])
    cells = [fn(row) for _, _, fn in bench_table.COLUMNS["attention"]]
    assert cells[6] == "1.50×" and cells[7] == "0.80×†"


def _readme(*kernels):
    return "# r\n" + "".join(
        f"\n<!-- BEGIN bench:{k} -->\nstale\n<!-- END bench:{k} -->\n" for k in kernels
    )


def test_markers_without_results_say_so(tmp_path):
    (tmp_path / "rmsnorm" / "benchmarks" / "results").mkdir(parents=True)  # no JSON yet
    text = bench_table.generated_readme(_readme("rmsnorm"), root=tmp_path)
    assert "stale" not in text
    assert (
        f"<!-- BEGIN bench:rmsnorm -->\n{bench_table.no_results('rmsnorm')}\n<!-- END bench:rmsnorm -->"
        in text
    )
    assert (
        bench_table.generated_readme(text, root=tmp_path) == text
    )  # --check passes on its own output

    # the first result file replaces the line with the table
    payload = {
        "environment": {
            "device": "GPU X",
            "torch": "2.11",
            "cuda": "13.0",
            "commit": "abc",
            "date": "2026-11-21",
        },
        "copy_gbs": 4000.0,
        "method": "m",
        "results": [
            _rmsnorm_row(
                "fused_add_rms_norm",
                "bfloat16",
                64,
                4096,
                {"ours": 2.0, "eager": 8.0, "F.rms_norm": 4.0, "compile": 3.0},
            )
        ],
    }
    (tmp_path / "rmsnorm" / "benchmarks" / "results" / "gpu-x.json").write_text(json.dumps(payload))
    table = bench_table.generated_readme(text, root=tmp_path)
    assert (
        "No results yet" not in table and "| `fused_add_rms_norm` | bfloat16 | 64 × 4096 |" in table
    )


def test_markers_and_results_must_match(tmp_path):
    import pytest

    with pytest.raises(SystemExit, match="no typo/ kernel folder"):
        bench_table.generated_readme(_readme("typo"), root=tmp_path)
    results = tmp_path / "rmsnorm" / "benchmarks" / "results"
    results.mkdir(parents=True)
    (results / "gpu.json").write_text("{}")
    with pytest.raises(SystemExit, match="bench:rmsnorm"):
        bench_table.generated_readme(_readme(), root=tmp_path)


def test_rmsnorm_sweep_measures_the_readme_rows_first(monkeypatch, request):
    """The sweep stops at its time budget: the rows the README shows must come first, and the
    full list must be the whole grid."""
    import importlib.util

    monkeypatch.setattr(sys, "path", list(sys.path))  # the sweep adds scripts/ and benchmarks/
    assert "benchmark" not in sys.modules
    request.addfinalizer(
        lambda: sys.modules.pop("benchmark", None)
    )  # the sweep imports benchmark.py
    spec = importlib.util.spec_from_file_location(
        "rmsnorm_sweep", REPO / "rmsnorm" / "benchmarks" / "sweep.py"
    )
    sweep = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, sweep)  # dataclasses look their module up there
    spec.loader.exec_module(sweep)
    full = sweep.cases(quick=False)
    assert len(set(full)) == len(full)
    forward = {(c.dtype, c.tokens, c.hidden) for c in full if c.op in (sweep.FWD, sweep.FUSED)}
    assert forward == {
        (d, t, h) for d in ("bfloat16", "float16") for t in sweep.TOKENS for h in sweep.HIDDEN
    }
    shown = [bench_table.ROW_FILTERS["rmsnorm"](dataclasses.asdict(c)) for c in full]
    assert (
        all(shown[: sum(shown)]) and sum(shown) == 3 * 2 * 4
    )  # fwd, fused, bwd × 2 hidden × 4 token counts
    assert set(sweep.cases(quick=True)) <= set(full)


def _rope_row(op, tokens, head_dim, us, **extra):
    """A result row as rope/benchmarks/sweep.py writes it."""
    nbytes = 2 * tokens * 40 * head_dim * 2 + tokens * (head_dim * 4 + 8)
    row = {
        "op": op,
        "dtype": "bfloat16",
        "tokens": tokens,
        "head_dim": head_dim,
        "q_heads": 32,
        "kv_heads": 8,
        "bytes": nbytes,
        "l2_resident": nbytes <= 50 * 2**20,
        "us": us,
        "gbs": {k: nbytes / (v * 1e-6) / 1e9 for k, v in us.items()},
        "copy_fraction": nbytes / (us["ours"] * 1e-6) / 1e9 / 4000.0,
    }
    for name in us:
        if name != "ours":
            row[f"speedup_vs_{name}"] = us[name] / us["ours"]
    row.update(extra)
    return row


def test_rope_table_follows_the_numbers():
    vllm_us = {
        "ours": 2.0,
        "eager": 16.0,
        "compile": 4.0,
        "inplace_eager": 20.0,
        "inplace_compile": 5.0,
    }
    payload = {
        "environment": _environment("rope", "2026-11-21"),
        "copy_gbs": 4000.0,
        "method": "m",
        "baselines": "b",
        "results": [
            _rope_row(
                "rotary_embedding",
                1,
                128,
                vllm_us,
                wall_us={"ours": 5.0, "compile": 20.25, "inplace_compile": 21.0},
            ),
            _rope_row("rotary_embedding", 65536, 128, {k: 500.0 * v for k, v in vllm_us.items()}),
            _rope_row(
                "apply_rotary_transformers",
                4096,
                128,
                {"ours": 100.0, "eager": 400.0, "compile": 150.0},
            ),
            _rope_row("rotary_embedding", 16, 128, vllm_us),  # outside the README's rows
            _rope_row("rotary_embedding", 4096, 64, vllm_us),
        ],
    }
    table = bench_table.render("rope", payload)
    assert (
        "| op | dtype | tokens × (q + kv heads) × head_dim | ours (µs) | ours (GB/s) | % of copy | vs torch.compile "
        "| vs eager | vs in-place compile | vs in-place eager | per call: ours / compile (µs) |"
    ) in table
    assert (
        "| `rotary_embedding` | bfloat16 | 1 × (32 + 8) × 128 | 2.00 | 10 | 0.3%† | 2.00× | 8.00× | 2.50× | 10.00× | 5.0 / 20.2 |"
        in table
    )
    assert "| `rotary_embedding` | bfloat16 | 65536 × (32 + 8) × 128 | 1000.00 |" in table
    assert "| `apply_rotary_transformers` | bfloat16 | 4096 × (32 + 8) × 128 | 100.00 |" in table
    assert (
        "| 1.50× | 4.00× | – | – | – |" in table
    )  # no in-place baselines for the transformers form
    assert "16 × (32" not in table and "× 64 |" not in table


def test_rope_sweep_measures_the_readme_rows_first(monkeypatch, request):
    """As for rmsnorm: the rows the README shows come first in the (budgeted) sweep, the full list
    is the whole grid, and the sweep's command line parses without a GPU."""
    import importlib.util

    monkeypatch.setattr(sys, "path", list(sys.path))  # the sweep adds scripts/ and benchmarks/
    request.addfinalizer(
        lambda: sys.modules.pop("benchmark", None)
    )  # the sweep imports benchmark.py
    monkeypatch.delitem(sys.modules, "benchmark", raising=False)
    spec = importlib.util.spec_from_file_location(
        "rope_sweep", REPO / "rope" / "benchmarks" / "sweep.py"
    )
    sweep = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, sweep)  # dataclasses look their module up there
    spec.loader.exec_module(sweep)
    full = sweep.cases(quick=False)
    assert len(set(full)) == len(full)
    vllm = {(c.tokens, c.head_dim) for c in full if c.op == sweep.VLLM}
    assert vllm == {(t, d) for t in sweep.TOKENS for d in sweep.HEAD_DIMS}
    assert {c.tokens for c in full if c.op == sweep.HF} == set(sweep.TRANSFORMERS_TOKENS)
    shown = [bench_table.ROW_FILTERS["rope"](dataclasses.asdict(c)) for c in full]
    assert all(shown[: sum(shown)]) and sum(shown) == 4 + len(sweep.TRANSFORMERS_TOKENS)
    assert set(sweep.cases(quick=True)) <= set(full)
    args = sweep.parse_args(["--quick", "--budget-s", "30"])
    assert args.quick and args.budget_s == 30.0


def _attention_row(op, batch, seqlen, head_dim, us, causal=True, layout="contiguous", **extra):
    """A result row as attention/benchmarks/sweep.py writes it."""
    heads_kv = 32 if op == "prefill" else 8
    flops = (
        4
        * batch
        * 32
        * seqlen
        * (seqlen if op == "prefill" else 1)
        * head_dim
        // (2 if op == "prefill" and causal else 1)
    )
    nbytes = 2 * batch * seqlen * heads_kv * head_dim * 2
    row = {
        "op": op,
        "dtype": "bfloat16",
        "batch": batch,
        "seqlen": seqlen,
        "head_dim": head_dim,
        "heads_q": 32,
        "heads_kv": heads_kv,
        "causal": causal,
        "layout": layout,
        "flops": flops,
        "bytes": nbytes,
        "us": us,
        "tflops": {k: flops / (v * 1e-6) / 1e12 if v else None for k, v in us.items()},
        "gbs": {k: nbytes / (v * 1e-6) / 1e9 if v else None for k, v in us.items()},
        "copy_fraction": nbytes / (us["ours"] * 1e-6) / 1e9 / 4000.0 if op == "decode" else None,
    }
    for name in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient"):
        row[f"speedup_vs_{name}"] = us[name] / us["ours"] if us.get(name) else None
    if "ours_stage1" in us:  # prefill rows on capability 9.0 only
        row["speedup_vs_ours_stage1"] = us["ours_stage1"] / us["ours"]
    row.update(extra)
    return row


def test_attention_table_follows_the_numbers():
    us = {"ours": 1000.0, "sdpa_flash": 1500.0, "sdpa_cudnn": 800.0, "sdpa_efficient": 2000.0}
    payload = {
        "environment": _environment("attention", "2026-11-21"),
        "copy_gbs": 4000.0,
        "method": "m",
        "baselines": "b",
        "results": [
            _attention_row(
                "prefill",
                1,
                16384,
                128,
                dict(us, ours_stage1=1700.0),
                peak_mib={
                    "ours": 130.0,
                    "sdpa_flash": 140.0,
                    "sdpa_cudnn": None,
                    "sdpa_efficient": 150.0,
                },
            ),
            _attention_row("prefill", 8, 2048, 128, dict(us, sdpa_cudnn=None), causal=False),
            _attention_row(
                "decode",
                64,
                32768,
                128,
                {
                    "ours": 2000.0,
                    "sdpa_flash": 3000.0,
                    "sdpa_cudnn": 2500.0,
                    "sdpa_efficient": 4000.0,
                },
                layout="paged16",
            ),
            _attention_row("prefill", 8, 2048, 256, us),  # outside the README's rows
            _attention_row("decode", 8, 1024, 128, us),
            _attention_row("decode", 64, 32768, 128, us, layout="paged256"),
        ],
    }
    table = bench_table.render("attention", payload)
    assert (
        "| workload | dtype | shape | ours (µs) | ours | % of copy | vs SDPA flash | vs SDPA cuDNN "
        "| vs SDPA efficient | vs stage 1 | peak MiB at 16K: ours / flash |"
    ) in table
    assert (
        "| prefill | bfloat16 | B1 × S16384 × H32 × D128, causal | 1000.00 | 2199 TFLOP/s | – | 1.50× | 0.80× "
        "| 2.00× | 1.70× | 130 / 140 |"
    ) in table
    assert (
        "| prefill | bfloat16 | B8 × S2048 × H32 × D128 | 1000.00 | 550 TFLOP/s | – | 1.50× | – | 2.00× | – "
        "| – |" in table
    )
    assert (
        "| decode | bfloat16 | B64 × KV32768, H32/8 × D128, paged 16 | 2000.00 | 4295 GB/s | 107.4% | 1.50× "
        "| 1.25× | 2.00× | – | – |"
    ) in table
    assert "D256" not in table and "B8 × KV1024" not in table and "paged 256" not in table
    assert "ours is faster" in table and "Baselines: b." in table


def test_attention_backward_table_follows_the_numbers():
    """The backward suite (attention/benchmarks/sweep_bwd.py's rows): ms and TFLOP/s of ours,
    baseline time over ours, – where a contender rejected the shape, no copy ceiling line."""

    def row(seqlen, head_dim, bwd, fwd_bwd, peak=None):
        tflops = {
            kind: {n: (1e6 / t if t else None) for n, t in us.items()}
            for kind, us in (("bwd", bwd), ("fwd_bwd", fwd_bwd))
        }
        speedup = {
            kind: {
                n: (us[n] / us["ours"] if us[n] and us["ours"] else None) for n in us if n != "ours"
            }
            for kind, us in (("bwd", bwd), ("fwd_bwd", fwd_bwd))
        }
        return {
            "batch": 16384 // seqlen,
            "seqlen": seqlen,
            "head_dim": head_dim,
            "causal": True,
            "heads_q": 32,
            "heads_kv": 8,
            "dtype": "bfloat16",
            "us": {"bwd": bwd, "fwd_bwd": fwd_bwd},
            "tflops": tflops,
            "speedup": speedup,
            "peak_mib": peak or {},
        }

    base = {"ours": 2000.0, "sdpa_flash": 1000.0, "sdpa_cudnn": 500.0, "sdpa_efficient": 4000.0}
    rejected = {"ours": None, "sdpa_flash": 1000.0, "sdpa_cudnn": None, "sdpa_efficient": 4000.0}
    peak = {"ours": 326.0, "sdpa_flash": 1092.0, "sdpa_cudnn": 836.0}
    payload = {
        "environment": _environment("attention", "2026-11-28"),
        "method": "m",
        "results": [row(16384, 128, base, base, peak), row(2048, 256, rejected, rejected)],
    }
    table = bench_table.render("attention-bwd", payload)
    assert "Copy ceiling" not in table and "Method: m." in table
    assert (
        "| B1 × S16384 × H32/8 × D128, causal | 2.00 | 500 | 0.50× | 0.25× | 2.00× | 2.00 | 0.25× "
        "| 326 / 1092 / 836 |"
    ) in table
    assert "| B8 × S2048 × H32/8 × D256, causal | – | – | – | – | – | – | – | – |" in table


def test_attention_sweep_measures_the_readme_rows_first(monkeypatch, request):
    """As for rope: the rows the README shows come first in the (budgeted) sweep, the full list is
    the whole grid, and the sweep's command line parses without a GPU."""
    import importlib.util

    monkeypatch.setattr(sys, "path", list(sys.path))  # the sweep adds scripts/ and benchmarks/
    request.addfinalizer(
        lambda: sys.modules.pop("benchmark", None)
    )  # the sweep imports benchmark.py
    monkeypatch.delitem(sys.modules, "benchmark", raising=False)
    spec = importlib.util.spec_from_file_location(
        "attention_sweep", REPO / "attention" / "benchmarks" / "sweep.py"
    )
    sweep = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, sweep)  # dataclasses look their module up there
    spec.loader.exec_module(sweep)
    full = sweep.cases(quick=False)
    assert len(set(full)) == len(full)
    prefill = {(c.seqlen, c.head_dim, c.causal) for c in full if c.op == "prefill"}
    assert prefill == {
        (s, d, c)
        for s in sweep.PREFILL_SEQLENS
        for d in sweep.PREFILL_HEAD_DIMS
        for c in (True, False)
    } | {(s, d, True) for s in sweep.BETWEEN_SEQLENS for d in sweep.BETWEEN_HEAD_DIMS}
    assert all(c.batch * c.seqlen == 16384 and c.heads_q == 32 for c in full if c.op == "prefill")
    decode = {(c.batch, c.seqlen, c.layout) for c in full if c.op == "decode"}
    assert decode == {
        (b, kv, lay) for b in sweep.DECODE_BATCH for kv in sweep.DECODE_KV for lay in sweep.LAYOUTS
    }
    varlen = [c for c in full if c.op == "varlen"]
    assert {c.causal for c in varlen} == {True, False}
    assert all(sum(c.lengths) == 16384 and c.seqlen == max(c.lengths) for c in varlen)
    assert all(c.batch == len(c.lengths) and c.head_dim == 128 for c in varlen)
    shown = [bench_table.ROW_FILTERS["attention"](sweep.asdict(c)) for c in full]
    assert all(shown[: sum(shown)]) and sum(shown) == 8 + 10 + 2
    assert set(sweep.cases(quick=True)) <= set(full)
    args = sweep.parse_args(["--quick", "--budget-s", "30"])
    assert args.quick and args.budget_s == 30.0
    args = sweep.parse_args(["--match", " D96 ", "--match", "S512 "])
    picked = sweep.selected(full, args.match)
    assert {c.head_dim for c in picked if c.seqlen != 512} == {96}
    assert {(c.causal, c.seqlen) for c in picked if c.head_dim == 96} == {
        (c, s) for c in (True, False) for s in sweep.PREFILL_SEQLENS
    }
    assert any(c.head_dim == 128 and c.seqlen == 512 for c in picked)
    assert sweep.selected(full, []) == full


def _gemm_sweep(monkeypatch):
    """quant/benchmarks/gemm_sweep.py, imported under a name of its own (its rows and bars are
    built by its own functions here, so the table cannot drift from the sweep's schema)."""
    import importlib.util

    monkeypatch.setattr(sys, "path", list(sys.path))  # the sweep adds scripts/
    spec = importlib.util.spec_from_file_location(
        "quant_gemm_sweep", REPO / "quant" / "benchmarks" / "gemm_sweep.py"
    )
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_quant_gemm_table_follows_the_numbers(tmp_path, monkeypatch):
    sweep = _gemm_sweep(monkeypatch)
    readme = _readme("quant-gemm")
    (tmp_path / "quant").mkdir()
    text = bench_table.generated_readme(readme, root=tmp_path)
    assert "`quant/benchmarks/results/gemm/*.json`" in text and "gemm_sweep.py" in text

    def row(layer, model, m, n, k, **us):
        times = dict.fromkeys(sweep.CONTENDERS)
        times.update(us)
        return sweep.result_row(sweep.Case("scaled_mm", model, layer, m, n, k), times)

    rows = [
        row("down", "llama3-8b", 1, 4096, 14336, ours=20.0, bf16=40.0, scaled_mm_row=25.0),
        row("down", "qwen3-8b", 1, 4096, 12288, ours=20.0, bf16=40.0),  # not a README row
        row(
            "square",
            "square",
            8192,
            8192,
            8192,
            ours=1000.0,
            bf16=1700.0,
            ours_silu=1000.0,
            unfused_silu=1100.0,
            ours_fp8_block=1250.0,
            scaled_mm_tensor=1100.0,
        ),
    ]
    payload = {
        "environment": _environment("quant", "2026-11-27"),
        "copy_gbs": 4000.0,
        "method": "m",
        "suite": "gemm",
        "results": rows,
        "bars": sweep.bar_verdicts(rows),
    }
    results = tmp_path / "quant" / "benchmarks" / "results" / "gemm"
    results.mkdir(parents=True)
    (results / "gpu-x.json").write_text(json.dumps(payload))
    table = bench_table.generated_readme(text, root=tmp_path)
    # 14336 * 4096 bytes in 20 µs: 2936 GB/s, 73% of the 4000 GB/s ceiling
    assert (
        "| llama3-8b down (14336→4096) | 1 | 20.00 | 6 | 2936 (73%) | 2.00× / – | 1.25× / – | – "
        "| – / – | – | – / – | – |"
    ) in table
    assert "qwen3-8b down" not in table
    assert "| square square (8192→8192) | 8192 | 1000.00 | 1100 | – | 1.70× / – |" in table
    assert "| fused >= 1.0x unfused, every M | 1.10× | M=8192, square square" in table
    assert "| blockwise >= 0.9x _scaled_mm per-tensor, M >= 2048 | 0.88× |" in table
    assert "| 8192 | FAIL |" in table and "| fp8 >= 1.6x bf16 F.linear, M >= 4096 | 1.70×" in table
    assert "| int8 >= 1.7x bf16 F.linear, M <= 16 | – | – | – | not measured |" in table
    assert "Full results: `quant/benchmarks/results/gemm/`" in table
    # the quantize table's reader does not see the GEMM file
    assert not list((tmp_path / "quant" / "benchmarks" / "results").glob("*.json"))


def test_quant_int4_table_follows_the_numbers(tmp_path, monkeypatch):
    """The int4 table reads quant/benchmarks/results/int4/ only, and its bar rows are those of
    int4_sweep.bar_verdicts."""
    import importlib.util

    monkeypatch.setattr(sys, "path", list(sys.path))  # the sweep adds scripts/
    spec = importlib.util.spec_from_file_location(
        "quant_int4_sweep", REPO / "quant" / "benchmarks" / "int4_sweep.py"
    )
    sweep = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, sweep)
    spec.loader.exec_module(sweep)
    readme = _readme("quant-int4")
    (tmp_path / "quant").mkdir()
    text = bench_table.generated_readme(readme, root=tmp_path)
    assert "`quant/benchmarks/results/int4/*.json`" in text and "int4_sweep.py" in text

    def row(layer, m, k, n, ours, bf16):
        case = sweep.Case("w4a16", "llama3-8b", layer, m, k, n)
        us = {"ours": ours, "ours_awq": ours + 1.0, "bf16": bf16, "fp8_w8a8": ours}
        gbs = sweep.weight_bytes(case, False) / ours / 1e3
        return {
            **dataclasses.asdict(case),
            "us": us,
            "gbs": {"ours": gbs, "ours_awq": 0.0},
            "speedup_vs_bf16": bf16 / ours,
            "speedup_vs_fp8_w8a8": 1.0,
            "copy_fraction": gbs / 4000.0,
        }

    rows = [row("down", 1, 14336, 4096, 10.0, 32.0), row("down", 32, 14336, 4096, 40.0, 32.0)]
    payload = {
        "environment": _environment("quant", "2026-11-28"),
        "copy_gbs": 4000.0,
        "method": "m",
        "results": rows,
        "bars": sweep.bar_verdicts(rows),
    }
    results = tmp_path / "quant" / "benchmarks" / "results" / "int4"
    results.mkdir(parents=True)
    (results / "gpu-x.json").write_text(json.dumps(payload))
    table = bench_table.generated_readme(text, root=tmp_path)
    # 14336 * 4096 / 2 + 2 * 112 * 4096 bytes in 10 µs: 3028 GB/s, 75.7% of 4000
    assert (
        "| llama3-8b down (14336→4096) | 1 | 10.00 / 11.00 | 3028 | 75.7% | 32.00 | 3.20× "
        "| 1.00× / – |"
    ) in table
    assert "| 32 |" not in table  # M = 32 is not a README row
    assert "| M <= 16: >= 3.0x bf16 F.linear | 3.20 | 1 | PASS |" in table
    assert "| M = 64: >= 1.5x bf16 | – | 0 | NOT RUN |" in table
    assert not list((tmp_path / "quant" / "benchmarks" / "results").glob("*.json"))
