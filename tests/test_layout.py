"""Every kernel folder has the same tree and obeys the rules Nix and the Hub enforce.

- Nix's source filter sees only build.toml, files listed in a `src` array and the Python files of
  torch-ext/ and tests/: an unlisted header builds locally and fails under Nix.
- The op-registration AST check Nix runs on the output (kernel-builder's torch-ops check).
- Files kernel-builder generates are never committed.
- Test files are named `test_<kernel>[_<area>]_<role>.py` with one role vocabulary in every kernel,
  so that `pytest tests */tests` imports each under a unique module name without packages.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import build as build_script  # noqa: E402

KERNEL_DIRS = build_script.discover_kernels(REPO)
SOURCE_SUFFIXES = {".c", ".cc", ".cpp", ".cu", ".h", ".hpp", ".cuh", ".inc", ".mm", ".metal"}
REGISTRATION_DECORATORS = {
    "custom_op",
    "triton_op",
    "register_kernel",
    "register_fake",
    "register_vmap",
    "register_torch_dispatch",
}


def test_kernel_folders_are_discovered():
    assert [p.name for p in KERNEL_DIRS] == sorted(p.name for p in KERNEL_DIRS)
    assert "activation" in [p.name for p in KERNEL_DIRS]
    assert not {"scripts", "tests"} & {p.name for p in KERNEL_DIRS}


@pytest.mark.parametrize("kernel_dir", KERNEL_DIRS, ids=lambda p: p.name)
def test_same_tree_in_every_kernel(kernel_dir: Path):
    project = build_script.load_project(kernel_dir)
    assert project.name == kernel_dir.name, "the folder is named after general.name"
    for rel in (
        "build.toml",
        "flake.nix",
        "flake.lock",
        "CARD.md",
        "benchmarks/benchmark.py",
        f"torch-ext/{project.python_name}/__init__.py",
        "torch-ext/torch_binding.cpp",
        "torch-ext/torch_binding.h",
    ):
        assert (kernel_dir / rel).is_file(), f"{kernel_dir.name}: missing {rel}"
    assert list((kernel_dir / "tests").glob("test_*.py")), f"{kernel_dir.name}: no tests"
    assert not (kernel_dir / "torch-ext" / project.python_name / project.python_name).exists(), (
        "nested torch-ext/<m>/<m> is rejected by the layout check"
    )
    for comp in project.components:
        assert comp.name.startswith(project.python_name + "_"), (
            f"[kernel.{comp.name}] should be named after the folder it builds ({project.python_name}_<backend>)"
        )
    assert project.repo_id and project.repo_id.endswith("/" + project.name)


@pytest.mark.parametrize("kernel_dir", KERNEL_DIRS, ids=lambda p: p.name)
def test_every_source_and_header_is_listed(kernel_dir: Path):
    project = build_script.load_project(kernel_dir)
    listed = set(project.torch_src) | {f for c in project.components for f in c.src}
    on_disk = {
        str(p.relative_to(kernel_dir))
        for folder in ("kernel_src", "torch-ext")
        for p in (kernel_dir / folder).rglob("*")
        if p.is_file() and p.suffix in SOURCE_SUFFIXES
    }
    assert on_disk - listed == set(), (
        f"{kernel_dir.name}: not listed in build.toml (Nix would not see them)"
    )


TEST_ROLES = ("ops", "errors", "library", "layers", "models", "benchmarks")


def _test_file_name_problem(kernel: str, name: str) -> str | None:
    """Why a file in <kernel>/tests/ is misnamed, or None. Test modules are
    test_<kernel>[_<area>]_<role>.py; helper modules are <kernel>_<what>.py (or conftest.py,
    sanitize.py, a script run under compute-sanitizer); no __init__.py."""
    if name == "__init__.py":
        return "tests/ is not a package: module names are unique by their kernel prefix"
    if name.startswith("test_"):
        pattern = rf"test_{re.escape(kernel)}(_[a-z0-9]+)*_({'|'.join(TEST_ROLES)})\.py"
        if not re.fullmatch(pattern, name):
            return f"expected test_{kernel}[_<area>]_<role>.py, role one of {TEST_ROLES}"
        return None
    if name in ("conftest.py", "sanitize.py") or name.startswith(f"{kernel}_"):
        return None
    return f"a helper module is named {kernel}_<what>.py"


@pytest.mark.parametrize("kernel_dir", KERNEL_DIRS, ids=lambda p: p.name)
def test_test_files_are_named_by_kernel_and_role(kernel_dir: Path):
    problems = {
        p.name: why
        for p in sorted((kernel_dir / "tests").glob("*.py"))
        if (why := _test_file_name_problem(kernel_dir.name, p.name)) is not None
    }
    assert problems == {}


@pytest.mark.parametrize(
    "name, ok",
    [
        ("test_rope_ops.py", True),
        ("test_rope_cache_ops.py", True),
        ("test_layers.py", False),
        ("test_rope.py", False),
        ("test_rope_misc.py", False),
        ("__init__.py", False),
        ("rope_cases.py", True),
        ("helpers.py", False),
    ],
)
def test_test_file_name_rule(name: str, ok: bool):
    assert (_test_file_name_problem("rope", name) is None) == ok


def _tracked(kernel_dir: Path) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--", str(kernel_dir)], cwd=REPO, capture_output=True, text=True
    )
    return out.stdout.split()


@pytest.mark.parametrize("kernel_dir", KERNEL_DIRS, ids=lambda p: p.name)
def test_generated_files_are_not_committed(kernel_dir: Path):
    tracked = _tracked(kernel_dir)
    assert not [
        f
        for f in tracked
        if f.endswith("/_ops.py")
        or f.endswith("registration.h")
        or "/build/" in f
        or f.endswith(".so")
        or "__pycache__" in f
    ]


def _registration_violations(path: Path) -> list[str]:
    """The check Nix's torch-ops-check hook runs: the first positional argument of a registration
    decorator must be a direct add_op_namespace_prefix(...) call."""
    violations = []
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for deco in node.decorator_list:
            if not isinstance(deco, ast.Call) or not deco.args:
                continue
            func = deco.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name not in REGISTRATION_DECORATORS:
                continue
            first = deco.args[0]
            ok = (
                isinstance(first, ast.Call)
                and getattr(first.func, "id", None) == "add_op_namespace_prefix"
            )
            if not ok:
                violations.append(f"{path}:{deco.lineno} {name} {node.name}")
    return violations


@pytest.mark.parametrize("kernel_dir", KERNEL_DIRS, ids=lambda p: p.name)
def test_op_registrations_use_the_namespace_prefix(kernel_dir: Path):
    package = kernel_dir / "torch-ext" / build_script.load_project(kernel_dir).python_name
    violations = [v for p in package.rglob("*.py") for v in _registration_violations(p)]
    assert violations == []
    # Calls outside decorators are not seen by the AST check: keep them honest too.
    for p in package.rglob("*.py"):
        text = p.read_text()
        assert "torch.ops._" not in text, f"{p}: hard-coded op namespace"
        assert "def add_op_namespace_prefix" not in text, f"{p}: re-wrapped add_op_namespace_prefix"


def test_registration_check_catches_a_bad_registration(tmp_path: Path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        'import torch\n@torch.library.register_fake("myns::op")\ndef _(x):\n    return x\n'
    )
    assert len(_registration_violations(bad)) == 1


def _pins(text: str, pattern: str) -> dict[str, str]:
    return dict(re.findall(pattern, text, flags=re.MULTILINE))


def test_formatter_versions_agree_between_ci_and_pre_commit():
    """CI formats with the versions of requirements-dev.txt, pre-commit with its own revs: a
    commit that pre-commit accepts must pass CI's lint."""
    required = _pins((REPO / "requirements-dev.txt").read_text(), r"^(ruff|clang-format)==(\S+)")
    hooks = (REPO / ".pre-commit-config.yaml").read_text()
    revs = {
        tool: re.search(rf"{re.escape(repo)}\n\s+rev: v(\S+)", hooks).group(1)
        for tool, repo in (
            ("ruff", "astral-sh/ruff-pre-commit"),
            ("clang-format", "pre-commit/mirrors-clang-format"),
        )
    }
    assert set(required) == {"ruff", "clang-format"}
    assert revs == required
