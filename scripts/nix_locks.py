#!/usr/bin/env python3
"""Generate and check the repo's derived Nix files from one template and one pin.

Derived, never edited by hand (the root flake.nix is hand-written and finds kernel folders itself):

* ``flake.lock`` and every ``<kernel>/flake.lock``: the same bytes, ``huggingface/kernels`` at the
  pin (``scripts/nix/kernel-builder-pin.json``) plus every other node of that rev's own lock
  (``scripts/nix/upstream-kernels-flake.lock``), ``follows`` re-rooted under ``kernel-builder``;
* ``<kernel>/flake.nix``: ``scripts/nix/kernel-flake.nix.in`` with ``@name@`` = the folder name.

    python scripts/nix_locks.py generate          rewrite every derived file
    python scripts/nix_locks.py new-kernel NAME   write NAME/flake.nix and NAME/flake.lock
    python scripts/nix_locks.py check             regenerate in memory, compare byte for byte; with
        Nix installed, also `nix-instantiate --parse` every .nix, read each flake's inputs with
        nix-instantiate and run `nix flake metadata --no-update-lock-file` on each flake
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
LOCK_FIELDS = ("locked", "original", "flake")  # what a copied node shares with upstream's
PROXY = "http://127.0.0.1:9"  # any download is refused at once
NIX_ENV = {  # offline: flakes on, no binary cache, no flake registry
    "NIX_CONFIG": "experimental-features = nix-command flakes\nbuild-users-group =\n"
    "sandbox = false\nsubstituters =\nflake-registry =\nwarn-dirty = false\ndownload-attempts = 1\n",
    "NO_COLOR": "1",
    **dict.fromkeys(["http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"], PROXY),
}


def load(name: str) -> dict:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def pin_and_upstream() -> tuple[dict, dict]:
    return load("kernel-builder-pin.json"), load("upstream-kernels-flake.lock")


def flake_inputs() -> dict:
    """What each flake's `(import ./flake.nix).inputs` must be for the generated lock to fit."""
    pin = load("kernel-builder-pin.json")
    return {INPUT: {"url": f"github:{pin['owner']}/{pin['repo']}"}}


def render_lock() -> str:
    pin, up = pin_and_upstream()

    def reroot(node: dict) -> dict:
        inputs = node.get("inputs", {})
        rerooted = {k: [INPUT, *v] if isinstance(v, list) else v for k, v in inputs.items()}
        return {**node, "inputs": rerooted} if inputs else node

    nodes = {key: reroot(node) for key, node in up["nodes"].items() if key != up["root"]}
    if INPUT in nodes or "root" in nodes:  # Nix would rename colliding nodes on re-rooting
        raise SystemExit(f"upstream's lock has a node {INPUT!r} or 'root': not covered")
    nodes[INPUT] = reroot(up["nodes"][up["root"]]) | {
        "locked": {key: pin[key] for key in LOCKED_KEYS},
        "original": {"owner": pin["owner"], "repo": pin["repo"], "type": "github"},
    }
    nodes["root"] = {"inputs": {INPUT: INPUT}}
    lock = {"nodes": nodes, "root": "root", "version": 7}
    return json.dumps(lock, indent=2, sort_keys=True) + "\n"


def derived(root: Path, kernels: list[Path] | None = None) -> dict[Path, str]:
    lock, template = render_lock(), (DATA / "kernel-flake.nix.in").read_text(encoding="utf-8")
    files = {root / "flake.lock": lock}
    for kdir in discover_kernels(root) if kernels is None else kernels:
        files[kdir / "flake.nix"] = template.replace("@name@", kdir.name)
        files[kdir / "flake.lock"] = lock
    return files


def lock_problems(text: str) -> list[str]:
    """Complete, re-rooted, pinned: read against the pin and upstream's lock, not render_lock."""
    pin, up = pin_and_upstream()
    problems: list[str] = []

    def walk(up_key: str, key: str, where: str) -> None:
        inputs = nodes[key].get("inputs", {})
        for name, target in sorted(up["nodes"][up_key].get("inputs", {}).items()):
            ours, here = inputs.get(name), f"{where}/{name}"
            if isinstance(target, list):
                if ours != [INPUT, *target]:
                    problems.append(f"{here} follows {ours!r}, not re-rooted: {[INPUT, *target]!r}")
            elif not isinstance(ours, str) or ours not in nodes:
                problems.append(f"{here}: node missing (incomplete: upstream locks {target!r})")
            elif any(nodes[ours].get(f) != up["nodes"][target].get(f) for f in LOCK_FIELDS):
                problems.append(f"{here}: locked/original differ from upstream's lock")
            else:
                walk(target, ours, here)

    try:
        lock = json.loads(text)
        nodes = lock["nodes"]
        kb = nodes[lock["root"]]["inputs"][INPUT]
        locked = nodes[kb]["locked"]
        for key in LOCKED_KEYS:
            if locked.get(key) != pin[key]:
                problems.append(
                    f"{INPUT}: locked.{key} is {locked.get(key)!r}, the pin has {pin[key]!r}"
                )
        walk(up["root"], kb, INPUT)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        problems.append(f"malformed lock ({type(exc).__name__}: {exc})")
    return problems


def git_files(root: Path, *pathspecs: str) -> set[str] | None:
    """Tracked files below `root` (relative paths); None without git or a work tree."""
    if not shutil.which("git"):
        return None
    cmd = ["git", "-C", str(root), "ls-files", "-z", "--", *pathspecs]
    res = subprocess.run(cmd, capture_output=True, text=True)
    return set(res.stdout.split("\0")) - {""} if res.returncode == 0 else None


def nix_problems(root: Path) -> list[str]:
    if not (shutil.which("nix") and shutil.which("nix-instantiate")):
        print("skipped the Nix checks: nix/nix-instantiate not installed (Debian: apt-get install")
        print("  --no-install-recommends nix-bin); the regeneration comparison ran")
        return []

    def nix(*args: str, cwd: Path = root) -> subprocess.CompletedProcess:
        env = {**os.environ, **NIX_ENV}
        return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)

    probe = nix("nix", "eval", "--raw", "--expr", 'builtins.toFile "probe" "ok"')
    if probe.returncode:  # e.g. not root and no daemon
        print(f"skipped the Nix checks: the Nix store is not usable: {probe.stderr.strip()}")
        return []
    errors = []
    nix_files = git_files(root, "*.nix") or [str(p.relative_to(root)) for p in root.rglob("*.nix")]
    res = nix("nix-instantiate", "--parse", *sorted(nix_files))
    if res.returncode:
        errors.append(f"`nix-instantiate --parse` fails: {res.stderr.strip()}")
    for fdir in [root, *discover_kernels(root)]:
        name = fdir.relative_to(root) / "flake.nix"
        if not (root / name).is_file():
            continue  # reported as missing
        expr = "(import ./flake.nix).inputs"
        res = nix("nix-instantiate", "--eval", "--strict", "--json", "-E", expr, cwd=fdir)
        if res.returncode or json.loads(res.stdout) != flake_inputs():
            got = res.stdout.strip() or res.stderr.strip()
            want = json.dumps(flake_inputs())
            errors.append(f"{name}: inputs are {got}; the locks are made for {want}")
        res = nix("nix", "flake", "metadata", "--no-update-lock-file", str(fdir))
        if res.returncode:
            errors.append(
                f"{name}: `nix flake metadata --no-update-lock-file` fails: {res.stderr.strip()}\n"
                f"    (a stale or untracked lock: run `{FIX} generate` and `git add` it)"
            )
    return errors


def check(root: Path, nix: bool = True) -> list[str]:
    errors = [f"generated lock: {p}" for p in lock_problems(render_lock())]
    files = derived(root)
    for path, text in files.items():
        rel = path.relative_to(root)
        if not path.is_file():
            fix = f"new-kernel {path.parent.name}" if path.parent != root else "generate"
            errors.append(f"{rel}: missing; run `{FIX} {fix}`")
        elif (disk := path.read_text(encoding="utf-8")) != text:
            why = lock_problems(disk) if path.name == "flake.lock" else []
            diff = difflib.unified_diff(text.splitlines(), disk.splitlines(), lineterm="", n=1)
            details = "".join(f"\n    {line}" for line in why + list(diff)[2:12])
            errors.append(f"{rel}: differs from the generated file; run `{FIX} generate`{details}")
    tracked = git_files(root)
    for rel in sorted(str(p.relative_to(root)) for p in files if p.is_file()):
        if tracked is not None and rel not in tracked:
            errors.append(f"{rel}: not tracked by git, so Nix does not see it; run `git add {rel}`")
    return errors + (nix_problems(root) if nix else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=REPO, help="repository root")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("generate", help="rewrite every derived file")
    new = sub.add_parser("new-kernel", help="write NAME/flake.nix and NAME/flake.lock")
    new.add_argument("name")
    sub.add_parser("check", help="regenerate in memory and compare; Nix checks where installed")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    files = derived(root)
    if args.command == "check":
        errors = check(root)
        for msg in errors:
            print(f"error: {msg}", file=sys.stderr)
        print(f"{'FAILED' if errors else 'OK'}: {len(errors)} problem(s) in {len(files)} files")
        return 1 if errors else 0
    if args.command == "new-kernel":
        if not (root / args.name / "build.toml").is_file():
            print(f"error: {args.name}/build.toml not found: not a kernel folder", file=sys.stderr)
            return 1
        files = derived(root, [root / args.name])
        del files[root / "flake.lock"]
    for path, text in files.items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(root)}")
    print("`git add` new or changed files: Nix ignores untracked ones")
    return 0


if __name__ == "__main__":
    sys.exit(main())
