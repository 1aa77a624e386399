#!/usr/bin/env python3
"""Create a new kernel folder in the house style, ready to build, load and test.

    python scripts/new_kernel.py NAME

Writes NAME/ from scripts/templates/new_kernel/ (every `newkernel` in a path or a file becomes
NAME): a trivial elementwise op, `scale(x, alpha, out=None)`, with its CPU and CUDA
implementations, schema, fake kernel, autograd formula, `kernelize` layer, tests, benchmarks and
card, to replace with the real op. Then it adds NAME to the users of the common/ helpers the
template needs (scripts/sync_common.py's USERS) and copies them in, writes NAME/flake.nix and
NAME/flake.lock (scripts/nix_locks.py new-kernel), and formats what it wrote with ruff and
clang-format when they are installed. It refuses an existing path and a name that cannot be a
kernel folder, a Python package and a test-module prefix at once.
"""

from __future__ import annotations

import argparse
import ast
import keyword
import re
import shutil
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
TEMPLATE = SCRIPTS / "templates" / "new_kernel"
PLACEHOLDER = "newkernel"
# The common/ helpers the template uses (scripts/sync_common.py copies them in).
COMMON_FILES = ("dispatch.cuh", "torch_checks.h", "public_errors.py", "kernel_fixture.py")
NAME_RULE = re.compile(r"[a-z][a-z0-9]{1,31}")
RESERVED = {"build", "common", "docs", "scripts", "tests", "templates"}


class ScaffoldError(Exception):
    """A refusal, printed as one line naming what to change."""


def check_name(name: str, root: Path) -> None:
    if not NAME_RULE.fullmatch(name):
        # kernel-builder allows dashes but no underscores; the folder name also prefixes the
        # Python test modules (tests/test_layout.py), which cannot have dashes.
        raise ScaffoldError(
            f"invalid kernel name {name!r}: use 2 to 32 lowercase letters and digits, starting "
            "with a letter (it names the folder, the Hub repository, the Python package and the "
            "test modules)"
        )
    if keyword.iskeyword(name) or name in RESERVED or name.startswith("test"):
        raise ScaffoldError(
            f"invalid kernel name {name!r}: a Python keyword, a name starting with 'test' (pytest "
            f"would collect its helper modules) or one of {sorted(RESERVED)}"
        )
    if (root / name).exists():
        raise ScaffoldError(f"{name}/ already exists: choose another name or remove it first")


def render(name: str, root: Path) -> list[Path]:
    """Copy the template into root/name with the placeholder replaced; the files written."""
    written = []
    for src in sorted(TEMPLATE.rglob("*")):
        rel = src.relative_to(TEMPLATE)
        if not src.is_file() or "__pycache__" in rel.parts:
            continue
        dst = root / name / str(rel).replace(PLACEHOLDER, name)
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(src.read_text().replace(PLACEHOLDER, name))
        written.append(dst)
    return written


def add_sync_users(sync_py: Path, kernel: str, names: tuple[str, ...]) -> None:
    """Add `kernel` to the kernels of each of `names` in sync_common.py's USERS, in place.

    Each entry is `"<file>": Users("<dest>", (<kernels>))`; only the tuple's source span is
    rewritten (sorted), so the rest of the file keeps its bytes."""
    source = sync_py.read_text()
    users = None
    for node in ast.parse(source).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == "USERS":
            users = node.value
    if not isinstance(users, ast.Dict):
        raise ScaffoldError(f"{sync_py}: no `USERS: dict = {{...}}` to add {kernel} to")
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    edits = {}
    for key, value in zip(users.keys, users.values):
        if isinstance(key, ast.Constant) and key.value in names:
            span = value.args[1]
            kernels = tuple(sorted(set(ast.literal_eval(span)) | {kernel}))
            begin = starts[span.lineno - 1] + span.col_offset
            end = starts[span.end_lineno - 1] + span.end_col_offset
            edits[key.value] = (begin, end, "(" + ", ".join(f'"{k}"' for k in kernels) + ")")
    missing = set(names) - set(edits)
    if missing:
        raise ScaffoldError(f"{sync_py}: USERS has no entry for {sorted(missing)}")
    for begin, end, text in sorted(edits.values(), reverse=True):
        source = source[:begin] + text + source[end:]
    sync_py.write_text(source)


def tool(name: str) -> str | None:
    """An executable next to this Python (the virtual environment's) or on PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.is_file() else shutil.which(name)


def run(cmd: list[str], root: Path) -> None:
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        raise ScaffoldError(f"`{' '.join(cmd)}` failed:\n{done.stdout}{done.stderr}")


def format_files(root: Path, python: list[Path], cxx: list[Path]) -> list[str]:
    """Format the written files as `scripts/dev.sh format` would; the tools that were missing."""
    missing = []
    ruff = tool("ruff")
    if ruff is None:
        missing.append("ruff")
    else:
        run([ruff, "check", "--fix", "--select", "I", "--quiet", *map(str, python)], root)
        run([ruff, "format", "--quiet", *map(str, python)], root)
    clang_format = tool("clang-format")
    if clang_format is None:
        missing.append("clang-format")
    elif cxx:
        run([clang_format, "--style=file", "-i", *map(str, cxx)], root)
    return missing


NEXT_STEPS = """\
created {name}/ with the example op `scale` (alpha * x) and its tests, benchmarks and card.

Next steps (README.md, "Adding a kernel"):
  1. Check that it builds, loads and passes its tests as generated:
       python scripts/build.py {name}
       python -m pytest -q {name}/tests
  2. Replace `scale` with your op, layer by layer: kernel_src/{name}_params.h (the torch-free
     contract), kernel_src/{name}_cpu.cpp and {name}_cuda.cu, torch-ext/torch_binding.cpp (the
     schema), torch-ext/{name}_ops.cpp (checks, device guard, stream), torch-ext/{name}/
     (_custom_ops.py fakes and autograd, __init__.py API, layers.py, _reference.py), tests/,
     benchmarks/, CARD.md. List every new source and header in build.toml.
  3. Compile the CUDA code on this machine and test it on a GPU:
       python scripts/compile_check.py {name}
       python scripts/build.py {name} && python -m pytest -q {name}/tests   # on the GPU machine
  4. Commit (Nix sees only tracked files; an uncommitted folder builds as _dirty):
       git add {name} scripts/sync_common.py && git commit
  5. Benchmark on a GPU (python {name}/benchmarks/sweep.py), add `<!-- BEGIN bench:{name} -->`
     markers to README.md and run python scripts/bench_table.py; publish with
       python scripts/upload.py {name} --org <org> --dry-run"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="kernel folder, Python package and Hub repository name")
    parser.add_argument("--root", type=Path, default=REPO, help="repository root")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    sync_py = root / "scripts" / "sync_common.py"
    try:
        check_name(args.name, root)
    except ScaffoldError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sync_before = sync_py.read_bytes()
    try:
        written = render(args.name, root)
        add_sync_users(sync_py, args.name, COMMON_FILES)
        run([sys.executable, str(sync_py)], root)
        run([sys.executable, str(root / "scripts" / "nix_locks.py"), "new-kernel", args.name], root)
        python = [p for p in written if p.suffix == ".py"] + [sync_py]
        cxx = [p for p in written if p.suffix in (".h", ".cpp", ".cu", ".cuh")]
        missing = format_files(root, python, cxx)
    except ScaffoldError as exc:
        # Leave the tree as it was: a half-made folder would pass for a kernel.
        shutil.rmtree(root / args.name, ignore_errors=True)
        sync_py.write_bytes(sync_before)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if missing:
        print(
            f"note: {' and '.join(missing)} not found: run scripts/dev.sh format before committing"
        )
    print(NEXT_STEPS.format(name=args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
