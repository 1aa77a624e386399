#!/usr/bin/env python3
"""Generate and check the repo's derived Nix files from one template and one pin (docs: nix.md §4-§6).

Derived files, never edited by hand:

* ``flake.lock`` (the root aggregator ``flake.nix`` itself is hand-written and finds kernel folders on its own);
* ``<kernel>/flake.nix``: ``scripts/nix/kernel-flake.nix.in`` with ``@name@`` set to the folder name;
* ``<kernel>/flake.lock``: the same bytes as the root lock.

Every lock is ``huggingface/kernels`` at the pin (``scripts/nix/kernel-builder-pin.json``) plus every other node
of that rev's own lock (``scripts/nix/upstream-kernels-flake.lock``), with ``follows`` re-rooted under
``kernel-builder``: the nix.md §5 recipe.

    python scripts/nix_locks.py generate           rewrite every derived file
    python scripts/nix_locks.py new-kernel NAME    write NAME/flake.nix and NAME/flake.lock
    python scripts/nix_locks.py check              regenerate in memory and compare byte for byte; with Nix
                                                   installed, also `nix-instantiate --parse` every .nix, read each
                                                   flake's inputs with nix-instantiate and run
                                                   `nix flake metadata --no-update-lock-file` on each flake
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from build import discover_kernels

DATA = Path(__file__).resolve().parent / "nix"
REPO = DATA.parent.parent
INPUT = "kernel-builder"
FIX = "python scripts/nix_locks.py"
LOCKED_KEYS = ("lastModified", "narHash", "owner", "repo", "rev", "type")
# Offline Nix: flakes on, no binary caches, no flake registry, and any download refused at once.
NIX_ENV = {
    "NIX_CONFIG": "experimental-features = nix-command flakes\nbuild-users-group =\nsandbox = false\n"
    "substituters =\nflake-registry =\nwarn-dirty = false\ndownload-attempts = 1\n",
    "NO_COLOR": "1",
    **{var: "http://127.0.0.1:9" for var in ("http_proxy", "https_proxy", "all_proxy",
                                             "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")},
}


def load(name: str) -> dict:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def flake_inputs() -> dict:
    """What every flake's `(import ./flake.nix).inputs` must be for the generated lock to fit it."""
    pin = load("kernel-builder-pin.json")
    return {INPUT: {"url": f"github:{pin['owner']}/{pin['repo']}"}}


def render_lock() -> str:
    pin, up = load("kernel-builder-pin.json"), load("upstream-kernels-flake.lock")

    def reroot(inputs: dict) -> dict:
        return {name: [INPUT, *target] if isinstance(target, list) else target for name, target in inputs.items()}

    nodes = {key: {**node, **({"inputs": reroot(node["inputs"])} if "inputs" in node else {})}
             for key, node in up["nodes"].items() if key != up["root"]}
    if INPUT in nodes or "root" in nodes:  # Nix would then rename nodes (nix.md §5 step 4)
        raise SystemExit(f"upstream lock has a node named {INPUT!r} or 'root'; the recipe does not cover that")
    nodes[INPUT] = {"inputs": reroot(up["nodes"][up["root"]]["inputs"]),
                    "locked": {key: pin[key] for key in LOCKED_KEYS},
                    "original": {"owner": pin["owner"], "repo": pin["repo"], "type": "github"}}
    nodes["root"] = {"inputs": {INPUT: INPUT}}
    return json.dumps({"nodes": nodes, "root": "root", "version": 7}, indent=2, sort_keys=True) + "\n"


def derived(root: Path, kernels: list[Path] | None = None) -> dict[Path, str]:
    lock, template = render_lock(), (DATA / "kernel-flake.nix.in").read_text(encoding="utf-8")
    files = {root / "flake.lock": lock}
    for kdir in discover_kernels(root) if kernels is None else kernels:
        files[kdir / "flake.nix"] = template.replace("@name@", kdir.name)
        files[kdir / "flake.lock"] = lock
    return files


def lock_problems(text: str) -> list[str]:
    """Complete, re-rooted, pinned: read against the pin and upstream's lock, independently of render_lock."""
    pin, up = load("kernel-builder-pin.json"), load("upstream-kernels-flake.lock")
    try:
        lock = json.loads(text)
        nodes = lock["nodes"]
        kb = nodes[nodes[lock["root"]]["inputs"][INPUT]]
    except (ValueError, KeyError, TypeError):
        return [f"not a lock with a root input {INPUT!r}"]
    problems = [f"{INPUT}: locked.{key} is {kb.get('locked', {}).get(key)!r}, the pin has {pin[key]!r}"
                for key in LOCKED_KEYS if kb.get("locked", {}).get(key) != pin[key]]

    def walk(up_inputs: dict, inputs: dict, where: str) -> None:
        for name, target in sorted(up_inputs.items()):
            ours, here = inputs.get(name), f"{where}/{name}"
            if isinstance(target, list):
                if ours != [INPUT, *target]:
                    problems.append(f"{here} follows {ours!r}, not re-rooted as {[INPUT, *target]!r}")
            elif not isinstance(ours, str) or ours not in nodes:
                problems.append(f"{here}: node missing (incomplete: upstream locks {target!r})")
            elif any(nodes[ours].get(f) != up["nodes"][target].get(f) for f in ("locked", "original", "flake")):
                problems.append(f"{here}: locked/original differ from upstream's lock")
            else:
                walk(up["nodes"][target].get("inputs", {}), nodes[ours].get("inputs", {}), here)

    walk(up["nodes"][up["root"]]["inputs"], kb.get("inputs", {}), INPUT)
    return problems


def git_files(root: Path, *pathspecs: str) -> set[str] | None:
    """Tracked files under `root` (relative paths); None when git or a work tree is absent."""
    if not shutil.which("git"):
        return None
    res = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--", *pathspecs], capture_output=True, text=True)
    return set(res.stdout.split("\0")) - {""} if res.returncode == 0 else None


def nix_problems(root: Path) -> list[str]:
    if not (shutil.which("nix") and shutil.which("nix-instantiate")):
        print("skipped the Nix checks: nix/nix-instantiate not installed "
              "(Debian: apt-get install --no-install-recommends nix-bin)")
        return []
    env = {**os.environ, **NIX_ENV}

    def nix(*args: str, cwd: Path = root) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)

    errors = []
    nix_files = sorted(git_files(root, "*.nix") or [str(p.relative_to(root)) for p in root.glob("*/flake.nix")])
    res = nix("nix-instantiate", "--parse", *nix_files)
    if res.returncode:
        errors.append(f"`nix-instantiate --parse` fails: {res.stderr.strip()}")
    for fdir in [root, *discover_kernels(root)]:
        name = fdir.relative_to(root) / "flake.nix"
        res = nix("nix-instantiate", "--eval", "--strict", "--json", "-E", "(import ./flake.nix).inputs", cwd=fdir)
        if res.returncode or json.loads(res.stdout) != flake_inputs():
            errors.append(f"{name}: inputs are {res.stdout.strip() or res.stderr.strip()}, the locks are generated "
                          f"for {json.dumps(flake_inputs())}")
        res = nix("nix", "flake", "metadata", "--no-update-lock-file", str(fdir))
        if res.returncode:
            errors.append(f"{name}: `nix flake metadata --no-update-lock-file` fails: {res.stderr.strip()} "
                          f"(a stale or untracked lock: run `{FIX} generate` and `git add` it)")
    return errors


def check(root: Path, nix: bool = True) -> list[str]:
    errors = [f"generated lock: {p} (scripts/nix/ data or {FIX})" for p in lock_problems(render_lock())]
    files = derived(root)
    for path, text in files.items():
        rel = path.relative_to(root)
        if not path.is_file():
            fix = f"new-kernel {path.parent.name}" if path.parent != root else "generate"
            errors.append(f"{rel}: missing; run `{FIX} {fix}`")
            continue
        disk = path.read_text(encoding="utf-8")
        if disk != text:
            diff = list(difflib.unified_diff(text.splitlines(), disk.splitlines(), "generated", str(rel), lineterm=""))
            why = lock_problems(disk) if path.name == "flake.lock" else []
            errors.append(f"{rel}: differs from the generated file; run `{FIX} generate`"
                          + "".join(f"\n    {line}" for line in why + diff[2:14]))
    tracked = git_files(root)
    if tracked is not None:
        for rel in sorted(str(p.relative_to(root)) for p in files if p.is_file()):
            if rel not in tracked:
                errors.append(f"{rel}: not tracked by git, so Nix does not see it; run `git add {rel}`")
    return errors + (nix_problems(root) if nix else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=REPO, help="repository root (default: this checkout)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("generate", help="rewrite every derived file")
    sub.add_parser("new-kernel", help="write NAME/flake.nix and NAME/flake.lock").add_argument("name")
    sub.add_parser("check", help="regenerate in memory, compare; Nix checks when nix is installed")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.command == "check":
        errors = check(root)
        for msg in errors:
            print(f"error: {msg}", file=sys.stderr)
        print(f"{'FAILED' if errors else 'OK'}: {len(errors)} problem(s) in {len(derived(root))} derived file(s)")
        return 1 if errors else 0
    files = derived(root)
    if args.command == "new-kernel":
        kdir = root / args.name
        if not (kdir / "build.toml").is_file():
            print(f"error: {args.name}/build.toml not found; a kernel folder needs one first", file=sys.stderr)
            return 1
        files = derived(root, [kdir])
        del files[root / "flake.lock"]
    for path, text in files.items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(root)}")
    print("`git add` new or changed files: Nix ignores untracked ones")
    return 0


if __name__ == "__main__":
    sys.exit(main())
