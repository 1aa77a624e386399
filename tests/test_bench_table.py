"""README benchmark tables are generated from the result files, never typed."""

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
        for r in payload["results"]:
            assert set(r["us"]) >= {"ours", "eager", "compile"}, f"{path}: baselines missing"


def test_table_follows_the_numbers(tmp_path):
    payload = {
        "environment": {"device": "GPU X", "torch": "2.11", "cuda": "13.0", "commit": "abc", "date": "2026-11-21",
                        "kernel_id": "_activation_cuda_abc1234"},
        "copy_gbs": 4000.0, "method": "m",
        "results": [{"op": "silu_and_mul", "dtype": "bfloat16", "tokens": 8192, "width": 14336,
                     "us": {"ours": 200.0, "eager": 600.0, "compile": 210.0}, "gbs": {"ours": 3600.0},
                     "copy_fraction": 0.9, "speedup_vs_compile": 1.05, "speedup_vs_eager": 3.0}],
    }
    table = bench_table.render("activation", payload)
    assert "| `silu_and_mul` | bfloat16 | 8192 × 14336 | 200.00 | 3600 | 90.0% | 1.05× | 3.00× | – |" in table
