"""Loading a benchmark script of quant/benchmarks/ in a test (the sweeps are scripts, not a
package)."""

import importlib.util
import sys
from pathlib import Path


def load_benchmark(monkeypatch, filename: str):
    """benchmarks/<filename> imported under a name of its own, with scripts/ importable (the
    sweeps import benchlib); both undone after the test."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / filename
    monkeypatch.setattr(sys, "path", [str(path.parents[2] / "scripts")] + sys.path)
    spec = importlib.util.spec_from_file_location(f"quant_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
