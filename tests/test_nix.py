"""scripts/nix_locks.py and the flakes it derives (offline: no network, Nix 2.8 where installed).

* The generated lock against the pinned upstream facts, written out here independently of scripts/nix/.
* `check` passes on the repo, and fails, naming the file and the fix, on each defect planted in a
  git copy: with the regeneration comparison alone (what a machine without Nix runs), then with
  the Nix checks (parse, inputs, `nix flake metadata --no-update-lock-file`).
* Mock evaluation (§6.E): `nix flake show`, `nix flake check --no-build` and `nix run
  .#build-and-copy` on a git copy of the tree, with kernel-builder/nixpkgs/flake-utils overridden
  by the stand-ins in tests/nix_mock/.

Nix tests skip without nix (Debian: apt-get install --no-install-recommends nix-bin).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import nix_locks as nl  # noqa: E402

SCRIPT = REPO / "scripts" / "nix_locks.py"
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "-c", "commit.gpgsign=false"]
requires_nix = pytest.mark.skipif(
    not (shutil.which("nix") and shutil.which("nix-instantiate")),
    reason="nix/nix-instantiate not installed (apt-get install --no-install-recommends nix-bin)",
)

# The pin, independently of scripts/nix/: node, owner/repo, rev, lastModified, narHash
PINNED = {
    row.split()[0]: row.split()[1:]
    for row in """
kernel-builder huggingface/kernels 8ac69fc542a4306eade0759ef7c45b4f2ae57df0 1787250351 sha256-h7n5IcWCjzbAKh+cyvKCZYix4psCEFcAoyWyTABcexs=
flake-compat edolstra/flake-compat 5edf11c44bc78a0d334f6334cdaf7d60d732daab 1767039857 sha256-vNpUSpF5Nuw8xvDLj2KCwwksIbjua2LZCqhV1LNRDns=
flake-utils numtide/flake-utils 11707dc2f618dd54ca8739b309ec4fc024de578b 1731533236 sha256-l0KFg5HjrsfsO/JpG+r7fRrqm12kzFHyUHqHCVpMMbI=
systems nix-systems/default da67096a3b9bf56a91d16901293e51ba5b49a27e 1681028828 sha256-Vy1rq5AaRuLzOxct8nz4T6wlgyUR7zLU309k9mBC768=
nixpkgs NixOS/nixpkgs ec1a11210589d294f0ac99d3290a27e6c73dfa1d 1783284758 sha256-tiQ8/qi8I45OOaBBYlVbXoAVkeQzvvTQOv5I45rMw5o=
rust-overlay oxalica/rust-overlay 20ee15370c9256669d66968b89ee20a4b0a4e673 1783320166 sha256-l7C/OsjcnWDOk2K3ssj+SBduwL67LashjBqis9+t468=
""".strip().splitlines()
}
EXPECTED_TREE = """\
└───kernel-builder: github:huggingface/kernels/8ac69fc542a4306eade0759ef7c45b4f2ae57df0
    ├───flake-compat: github:edolstra/flake-compat/5edf11c44bc78a0d334f6334cdaf7d60d732daab
    ├───flake-utils: github:numtide/flake-utils/11707dc2f618dd54ca8739b309ec4fc024de578b
    │   └───systems: github:nix-systems/default/da67096a3b9bf56a91d16901293e51ba5b49a27e
    ├───nixpkgs: github:NixOS/nixpkgs/ec1a11210589d294f0ac99d3290a27e6c73dfa1d
    └───rust-overlay: github:oxalica/rust-overlay/20ee15370c9256669d66968b89ee20a4b0a4e673
        └───nixpkgs follows input 'kernel-builder/nixpkgs'"""


def run(args: list, cwd: Path = REPO, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, **kw)


def nix(*args, cwd: Path) -> subprocess.CompletedProcess:
    res = run(["nix", *args], cwd, env={**os.environ, **nl.NIX_ENV}, timeout=300)
    res.stdout, res.stderr = (re.sub(r"\x1b\[[0-9;]*m", "", s) for s in (res.stdout, res.stderr))
    assert res.returncode == 0, f"$ nix {' '.join(map(str, args))}\n{res.stdout}\n{res.stderr}"
    return res


def git_copy(dest: Path, files: list[str]) -> Path:
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dest / f)
    run(["git", "init", "-q", dest], check=True)
    run([*GIT, "add", "-A"], dest, check=True)
    run([*GIT, "commit", "-qm", "copy"], dest, check=True)
    return dest


# -- the generator and the repo -----------------------------------------------------------


def test_generated_lock_is_complete_rerooted_and_pinned():
    lock = json.loads(nl.render_lock())
    nodes = lock["nodes"]
    assert (lock["version"], lock["root"], set(nodes)) == (7, "root", {"root", *PINNED})
    assert nodes["root"] == {"inputs": {"kernel-builder": "kernel-builder"}}
    for key, (owner_repo, rev, last_modified, nar_hash) in PINNED.items():
        owner, repo = owner_repo.split("/")
        github = {"owner": owner, "repo": repo, "type": "github"}
        assert nodes[key]["locked"] == {
            **github,
            "rev": rev,
            "lastModified": int(last_modified),
            "narHash": nar_hash,
        }, key
        assert nodes[key]["original"] == github | ({"rev": rev} if key == "nixpkgs" else {}), key
    upstream_inputs = ("flake-compat", "flake-utils", "nixpkgs", "rust-overlay")
    assert nodes["kernel-builder"]["inputs"] == {name: name for name in upstream_inputs}
    assert nodes["flake-utils"]["inputs"] == {"systems": "systems"}
    assert nodes["rust-overlay"]["inputs"] == {"nixpkgs": ["kernel-builder", "nixpkgs"]}
    assert nl.lock_problems(nl.render_lock()) == []


def test_repo_check_passes():
    res = run([sys.executable, SCRIPT, "check"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK: 0 problem(s)" in res.stdout
    assert set(nl.derived(REPO)) >= {REPO / "flake.lock", REPO / "activation" / "flake.nix"}


# -- defects planted in a git copy ---------------------------------------------------------

LOCK = "activation/flake.lock"
FILES = ["flake.nix", "flake.lock", "activation/build.toml", "activation/flake.nix", LOCK]
FIX = "run `python scripts/nix_locks.py"


@pytest.fixture()
def copy(tmp_path):
    return git_copy(tmp_path, FILES)


def edit(path: str, old: str, new: str):
    def apply(root: Path) -> None:
        text = (root / path).read_text()
        assert old in text, f"{old!r} not in {path}"
        (root / path).write_text(text.replace(old, new, 1))

    return apply


def edit_lock(fn):
    def apply(root: Path) -> None:
        lock = json.loads((root / LOCK).read_text())
        fn(lock["nodes"])
        (root / LOCK).write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")

    return apply


def drop_rust_overlay(nodes):
    del nodes["rust-overlay"], nodes["kernel-builder"]["inputs"]["rust-overlay"]


def new_folder(root: Path) -> None:
    (root / "rope").mkdir()
    shutil.copy2(REPO / "rope" / "build.toml", root / "rope" / "build.toml")


DEFECTS = {  # id: (defect, expected message); all found without Nix
    "lock-byte": (edit(LOCK, "h7n5Ic", "h7n5Id"), "kernel-builder: locked.narHash is"),
    "lock-rev": (edit(LOCK, '"8ac69fc5', '"9ac69fc5'), "kernel-builder: locked.rev is"),
    "follows-not-rerooted": (
        edit_lock(lambda n: n["rust-overlay"]["inputs"].update(nixpkgs=["nixpkgs"])),
        "kernel-builder/rust-overlay/nixpkgs follows ['nixpkgs'], not re-rooted",
    ),
    "missing-node": (edit_lock(drop_rust_overlay), "kernel-builder/rust-overlay: node missing"),
    "transitive-differs": (
        edit_lock(lambda n: n["systems"]["locked"].update(rev="0" * 40)),
        "kernel-builder/flake-utils/systems: locked/original differ",
    ),
    "extra-byte": (edit("flake.lock", "}\n", "}\n\n"), "flake.lock: differs"),
    "flake-by-hand": (
        edit("activation/flake.nix", "path = ./.;", "path = ./.; torchVersions = v: v;"),
        "activation/flake.nix: differs",
    ),
    "lock-deleted": (
        lambda r: (r / LOCK).unlink(),
        f"{LOCK}: missing; {FIX} new-kernel activation`",
    ),
    "kernel-without-flake": (new_folder, f"rope/flake.nix: missing; {FIX} new-kernel rope`"),
    "untracked-lock": (
        lambda r: run(["git", "rm", "-q", "--cached", LOCK], r, check=True),
        f"{LOCK}: not tracked by git",
    ),
}


@pytest.mark.parametrize("name", DEFECTS)
def test_check_fails_on_defect_without_nix(copy, name):
    assert nl.check(copy, nix=False) == []
    defect, expected = DEFECTS[name]
    defect(copy)
    errors = nl.check(copy, nix=False)
    assert any(expected in e for e in errors), "\n".join(errors) or "no errors"
    assert all(FIX in e or "git add" in e for e in errors), "\n".join(errors)


NIX_DEFECTS = {  # id: (defect, expected message from Nix itself)
    "stale-url": (edit("flake.nix", "/kernels", "/kernels/v0.12"), "unable to download"),
    "untracked-lock": (DEFECTS["untracked-lock"][0], "unable to download"),
    "follows-not-rerooted": (DEFECTS["follows-not-rerooted"][0], "follows a non-existent input"),
    "version-8": (edit(LOCK, '"version": 7', '"version": 8'), "unsupported version 8"),
    "syntax": (edit("flake.nix", "};\n\n  outputs", "}\n\n  outputs"), "syntax error"),
    "second-input": (
        edit("flake.nix", "inputs = {", 'inputs = { nixpkgs.url = "github:NixOS/nixpkgs";'),
        'flake.nix: inputs are {"kernel-builder"',
    ),
}


@requires_nix
@pytest.mark.parametrize("name", NIX_DEFECTS)
def test_nix_check_fails_on_defect(copy, name):
    defect, expected = NIX_DEFECTS[name]
    defect(copy)
    errors = nl.nix_problems(copy)
    assert any(expected in e for e in errors), "\n".join(errors) or "no errors"


@requires_nix
def test_nix_sees_the_documented_tree(copy):
    assert nl.nix_problems(copy) == []
    out = nix("flake", "metadata", "--no-update-lock-file", copy / "activation", cwd=copy).stdout
    tree = out.split("Inputs:\n", 1)[1].splitlines()
    assert "\n".join(line.rstrip() for line in tree) == EXPECTED_TREE


def test_cli_new_kernel_generate_check(copy):
    cli = [sys.executable, SCRIPT, "--root", copy]
    new_folder(copy)
    res = run([*cli, "check"])
    assert res.returncode == 1, res.stdout
    assert f"rope/flake.nix: missing; {FIX} new-kernel rope`" in res.stderr, res.stderr
    assert run([*cli, "new-kernel", "scripts"]).returncode == 1  # no build.toml: not a kernel
    assert run([*cli, "new-kernel", "rope"]).returncode == 0
    for name in ("rope/flake.lock", "rope/flake.nix"):
        assert (copy / name).read_bytes() == (REPO / name).read_bytes()
    edit(LOCK, "h7n5Ic", "h7n5Id")(copy)
    assert run([*cli, "generate"]).stdout.startswith("wrote activation/flake.lock\n")
    run([*GIT, "add", "-A"], copy, check=True)
    res = run([*cli, "check"])
    assert res.returncode == 0, res.stdout + res.stderr


# -- E: mock evaluation of the aggregator and the kernel flakes -----------------------------

MOCK_KERNEL, CUDA_ONLY = "zz-mock-kernel", "zz-cuda-only"  # builds anywhere / not on darwin
GENERAL = '[general]\nname = "{0}"\nversion = 1\nedition = 5\nlicense = "Apache-2.0"\n'
HUB = '\n[general.hub]\nrepo-id = "nix-tests/{0}"\n\n'
MOCK_TOMLS = {
    MOCK_KERNEL: GENERAL + 'backends = ["cpu", "cuda"]\n' + HUB + "[torch-noarch]\n",
    CUDA_ONLY: GENERAL + 'backends = ["cuda"]\n' + HUB + '[torch]\nsrc = []\n\n[kernel.relu]\n'
    'backend = "cuda"\ndepends = ["torch"]\nsrc = ["relu.cu"]\n',
}


@pytest.fixture(scope="module")
def mock_repo(tmp_path_factory):
    """A git copy of the tracked tree plus two kernel folders given flakes by `new-kernel`."""
    if not (shutil.which("nix") and shutil.which("nix-instantiate")):
        pytest.skip("nix not installed")
    files = run(["git", "ls-files", "-z"], check=True).stdout.split("\0")
    files = [f for f in files if f and (REPO / f).is_file()]
    repo = git_copy(tmp_path_factory.mktemp("mock"), files)
    for name, toml in MOCK_TOMLS.items():
        (repo / name).mkdir()
        (repo / name / "build.toml").write_text(toml.format(name))
        assert nl.main(["--root", str(repo), "new-kernel", name]) == 0
    run([*GIT, "add", "-A"], repo, check=True)
    run([*GIT, "commit", "-qm", "mock kernels"], repo, check=True)
    return repo


def mock_nix(repo: Path, *args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    mock, overrides = repo / "tests" / "nix_mock", []
    for name in ("kernel-builder", "kernel-builder/nixpkgs", "kernel-builder/flake-utils"):
        overrides += ["--override-input", name, f"path:{mock / name.split('/')[-1]}"]
    return nix(*args[:-1], *overrides, args[-1], cwd=cwd or repo)


def kernels(repo: Path) -> list[str]:
    return [p.name for p in nl.discover_kernels(repo)]


def assert_built(repo: Path, kernel: str) -> None:
    variants = [p for p in (repo / kernel / "build").iterdir() if p.is_dir()]
    assert variants, f"{kernel}/build/ got no variant directory"
    for variant in variants:
        meta = json.loads((variant / "metadata.json").read_text())
        # kernel-dir: the `path` given to genKernelFlakeOutputs, relative to `self`
        assert (meta["variant"], meta["kernel-dir"]) == (variant.name, kernel)
        assert os.access(variant / "metadata.json", os.W_OK), "build/ must be writable"


def test_mock_flake_show_and_check(mock_repo):
    locks = {p: p.read_bytes() for p in mock_repo.glob("**/flake.lock")}
    out = mock_nix(mock_repo, "flake", "show", ".").stdout
    assert {MOCK_KERNEL, "activation"} <= set(kernels(mock_repo))
    for kernel in kernels(mock_repo):
        for attr in ("", "-build-and-copy", "-build-and-upload", "-ci", "-ci-test"):
            assert f"─{kernel}{attr}: package " in out, f"packages.*.{kernel}{attr} missing\n{out}"
        assert f"─{kernel}: development environment" in out, out
    assert "─build-and-copy: package 'build-and-copy'" in out and "─default: package " in out, out
    darwin = out.split("aarch64-darwin", 1)[1].split("aarch64-linux", 1)[0]  # its devShells
    assert MOCK_KERNEL in darwin and CUDA_ONLY not in darwin, out
    assert not re.search(r"─(scripts|tests|nix_mock)[:\s]", out), out
    mock_nix(mock_repo, "flake", "check", "--no-build", ".")
    assert locks == {p: p.read_bytes() for p in mock_repo.glob("**/flake.lock")}, "lock rewritten"


def test_mock_build_and_copy(mock_repo):
    """The root's build-and-copy fills every <kernel>/build/, as does each kernel's own flake."""
    for kernel in kernels(mock_repo):
        shutil.rmtree(mock_repo / kernel / "build", ignore_errors=True)
    # Like upstream's: a variant it copies is replaced, other entries are kept.
    stale = mock_repo / MOCK_KERNEL / "build" / "torch-cpu" / "stale.txt"
    unrelated = mock_repo / MOCK_KERNEL / "build" / "unrelated.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("old")
    unrelated.write_text("keep")
    mock_nix(mock_repo, "run", ".#build-and-copy")
    for kernel in kernels(mock_repo):
        assert_built(mock_repo, kernel)
    assert not stale.exists() and unrelated.is_file() and not (mock_repo / "build").exists()
    for kernel in ("activation", MOCK_KERNEL):
        shutil.rmtree(mock_repo / kernel / "build")
        mock_nix(mock_repo, "run", ".#build-and-copy", cwd=mock_repo / kernel)
        assert_built(mock_repo, kernel)
    shutil.rmtree(mock_repo / "activation" / "build")
    mock_nix(mock_repo, "run", ".#activation-build-and-copy")
    assert_built(mock_repo, "activation")
    assert run(["git", "status", "--porcelain", "--untracked-files=no"], mock_repo).stdout == ""


def test_mock_default_link_farm_and_redistributable(mock_repo):
    def build(attr: str) -> Path:
        out = mock_nix(mock_repo, "build", "--no-link", "--json", attr).stdout
        return Path(json.loads(out)[0]["outputs"]["out"])

    assert sorted(p.name for p in build(".#default").iterdir()) == kernels(mock_repo)
    variant = json.loads(mock_nix(mock_repo, "eval", "--json", ".#activation.variants").stdout)[0]
    assert (build(f".#activation.redistributable.{variant}") / variant / "metadata.json").is_file()


def test_mock_build_and_copy_outside_repo_root_fails_clearly(mock_repo):
    with pytest.raises(AssertionError, match="build.toml not found.*repository root"):
        mock_nix(mock_repo, "run", "..#build-and-copy", cwd=mock_repo / "tests")
