"""The pytest fixtures every kernel's tests share: `kernel` (the built kernel, loaded as users load
it) and `device`.

One source of truth: common/kernel_fixture.py, copied by scripts/sync_common.py into each kernel's
tests/ as <kernel>_fixture.py (a kernel's tests run on their own, from its folder, so they cannot
import from outside it; the module names differ so that `pytest tests */tests` can import
every copy). tests/test_common_sync.py fails when a copy drifts: edit common/, then run the script.

Usage, in <kernel>/tests/conftest.py:

    kernel, device = kernel_fixtures("open-kernels/<kernel>", version=1, build_dir=<kernel>/build)

Tests never import the source package: `kernel` is `kernels.get_kernel(repo_id, version=...)`,
which `LOCAL_KERNELS` redirects to the folder's `build/`.
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

KERNELS_CI_MARKER = "kernels_ci: fast subset (< 60 s) run by kernels CI"


def add_local_kernel(repo_id: str, build_dir: Path) -> None:
    """Point `LOCAL_KERNELS` at `build_dir` for `repo_id`.

    Appended to (not replacing) an existing LOCAL_KERNELS, so that a session that also runs other
    kernels' suites keeps their redirections; an explicit entry for `repo_id` wins. Called when
    the `kernel` fixture first runs, not at import, so the result does not depend on the order in
    which pytest collects the kernels' test folders."""
    entries = [e for e in os.environ.get("LOCAL_KERNELS", "").split(":") if e]
    if not any(e.split("=", 1)[0] == repo_id for e in entries):
        os.environ["LOCAL_KERNELS"] = ":".join(entries + [f"{repo_id}={build_dir}"])


def kernel_fixtures(repo_id: str, *, version: int, build_dir: Path):
    """The session fixtures `kernel` and `device` of a conftest.py (assign both to those names)."""

    @pytest.fixture(scope="session", name="kernel")
    def kernel_fixture():
        import kernels

        add_local_kernel(repo_id, build_dir)
        return kernels.get_kernel(repo_id, version=version)

    @pytest.fixture(scope="session", name="device")
    def device_fixture() -> str:
        return "cuda" if torch.cuda.is_available() else "cpu"

    return kernel_fixture, device_fixture


def run_in_fresh_process(script: str, timeout_s: float = 300.0) -> None:
    """Run `script` with this interpreter in a new process (a fresh CUDA context; LOCAL_KERNELS, set
    by the `kernel` fixture, is inherited) and fail unless it exits 0 with "ok" as its last line."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout_s
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


class PassThrough(TorchDispatchMode):
    """A dispatch mode that changes nothing, under which the public functions take their custom
    ops (_eager_path.custom_op_needed) rather than the ops' bodies."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def assert_autograd_routes_agree(call, inputs, eager_name: str) -> None:
    """`call()` (a public function on `inputs`, which require grad), run eagerly, is recorded by
    the package's own autograd.Function `eager_name` (its _eager_path.OpRoutes); under a
    dispatch mode that changes nothing it goes through the custom op instead. Both routes run the
    same kernels: their outputs and gradients must agree bit for bit on the CPU, and on CUDA up to
    the order of atomic additions (default tolerances of the dtype)."""

    def run():
        outs = call()
        return [o for o in (outs if isinstance(outs, (tuple, list)) else (outs,)) if o is not None]

    def recorded(outs) -> set:
        """The names of the autograd nodes behind `outs`, back to the inputs."""
        seen, stack = set(), [o.grad_fn for o in outs]
        while stack:
            node = stack.pop()
            if node is not None and node not in seen:
                seen.add(node)
                stack.extend(next_node for next_node, _ in node.next_functions)
        return {type(node).__name__ for node in seen}

    eager = run()
    assert eager_name + "Backward" in recorded(eager), recorded(eager)
    gen = torch.Generator(device=eager[0].device).manual_seed(0)
    grads_out = [torch.randn(o.shape, generator=gen, device=o.device).to(o.dtype) for o in eager]
    eager_grads = torch.autograd.grad(eager, inputs, grads_out)
    with PassThrough():
        through_op = run()
    assert eager_name + "Backward" not in recorded(through_op)
    op_grads = torch.autograd.grad(through_op, inputs, grads_out)
    for got, want in zip((*eager, *eager_grads), (*through_op, *op_grads)):
        if got.device.type == "cpu":
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want)


def benchmark_fixtures(kernel_name: str, bench_dir: Path):
    """The fixtures `bench` and `sweep` of a benchmark test module (assign both to those names):
    `bench_dir`/benchmark.py and sweep.py imported under names of their own, with `bench_dir` and
    the repository's scripts/ on sys.path. The module `benchmark` (which a sweep imports) is
    unloaded before and after, so that each kernel's sweep finds its own."""

    def load(name: str, path: Path, monkeypatch):
        monkeypatch.setattr(
            sys, "path", [str(bench_dir), str(bench_dir.parent.parent / "scripts")] + sys.path
        )
        monkeypatch.delitem(sys.modules, "benchmark", raising=False)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        return module

    @pytest.fixture(name="bench")
    def bench_fixture(monkeypatch, request):
        request.addfinalizer(lambda: sys.modules.pop("benchmark", None))
        return load(f"{kernel_name}_benchmark", bench_dir / "benchmark.py", monkeypatch)

    @pytest.fixture(name="sweep")
    def sweep_fixture(monkeypatch, request):
        request.addfinalizer(lambda: sys.modules.pop("benchmark", None))
        return load(f"{kernel_name}_sweep", bench_dir / "sweep.py", monkeypatch)

    return bench_fixture, sweep_fixture


def benchmark_workloads(bench):
    """(class, workload) of every `kernels benchmark` workload in the module `bench`: the
    `benchmark_<workload>` methods of its Benchmark subclasses."""
    from kernels.benchmark import Benchmark

    for cls in (getattr(bench, n) for n in dir(bench)):
        if isinstance(cls, type) and issubclass(cls, Benchmark) and cls is not Benchmark:
            for name in dir(cls):
                if name.startswith("benchmark_"):
                    yield cls, name[len("benchmark_") :]
