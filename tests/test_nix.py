"""Offline checks of the repo's Nix flakes and flake.lock files (docs: nix.md §6).

* Pure-Python lock checks (§6.B, C.2, C.3) through scripts/nix_locks.py, with a
  negative test per defect on corrupted copies. These always run.
* A: every .nix file parses (`nix-instantiate --parse`).
* D: `nix flake metadata --no-update-lock-file` accepts the top-level flake and
  every kernel folder's flake, and prints the expected input tree.
* E: mock evaluation: `nix flake show`, `nix flake check --no-build` and
  `nix run .#build-and-copy` on a temporary git copy of the tree, with the
  kernel-builder/nixpkgs/flake-utils inputs overridden by tests/nix_mock/.

Nix tests skip when `nix`/`nix-instantiate` are not installed
(`apt-get install -y --no-install-recommends nix-bin`). Every Nix call gets its
own NIX_CONFIG (flakes on, no substituters, no build users, no sandbox) and
proxies pointing at a closed local port, so nothing can reach the network.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
MOCK_DIR = REPO / "tests" / "nix_mock"
SCRIPT = REPO / "scripts" / "nix_locks.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("_nix_locks_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


nl = _load_script()

# --------------------------------------------------------------------------
# Facts from nix.md §5.1 / §5.2, written out independently of the generator.
# --------------------------------------------------------------------------

PINNED = {
    "kernel-builder": ("huggingface", "kernels", "8ac69fc542a4306eade0759ef7c45b4f2ae57df0", 1787250351,
                       "sha256-h7n5IcWCjzbAKh+cyvKCZYix4psCEFcAoyWyTABcexs="),
    "flake-compat": ("edolstra", "flake-compat", "5edf11c44bc78a0d334f6334cdaf7d60d732daab", 1767039857,
                     "sha256-vNpUSpF5Nuw8xvDLj2KCwwksIbjua2LZCqhV1LNRDns="),
    "flake-utils": ("numtide", "flake-utils", "11707dc2f618dd54ca8739b309ec4fc024de578b", 1731533236,
                    "sha256-l0KFg5HjrsfsO/JpG+r7fRrqm12kzFHyUHqHCVpMMbI="),
    "systems": ("nix-systems", "default", "da67096a3b9bf56a91d16901293e51ba5b49a27e", 1681028828,
                "sha256-Vy1rq5AaRuLzOxct8nz4T6wlgyUR7zLU309k9mBC768="),
    "nixpkgs": ("NixOS", "nixpkgs", "ec1a11210589d294f0ac99d3290a27e6c73dfa1d", 1783284758,
                "sha256-tiQ8/qi8I45OOaBBYlVbXoAVkeQzvvTQOv5I45rMw5o="),
    "rust-overlay": ("oxalica", "rust-overlay", "20ee15370c9256669d66968b89ee20a4b0a4e673", 1783320166,
                     "sha256-l7C/OsjcnWDOk2K3ssj+SBduwL67LashjBqis9+t468="),
}

EXPECTED_TREE = """\
└───kernel-builder: github:huggingface/kernels/8ac69fc542a4306eade0759ef7c45b4f2ae57df0
    ├───flake-compat: github:edolstra/flake-compat/5edf11c44bc78a0d334f6334cdaf7d60d732daab
    ├───flake-utils: github:numtide/flake-utils/11707dc2f618dd54ca8739b309ec4fc024de578b
    │   └───systems: github:nix-systems/default/da67096a3b9bf56a91d16901293e51ba5b49a27e
    ├───nixpkgs: github:NixOS/nixpkgs/ec1a11210589d294f0ac99d3290a27e6c73dfa1d
    └───rust-overlay: github:oxalica/rust-overlay/20ee15370c9256669d66968b89ee20a4b0a4e673
        └───nixpkgs follows input 'kernel-builder/nixpkgs'"""


def kernel_names() -> List[str]:
    return sorted(p.name for p in REPO.iterdir() if p.is_dir() and (p / "build.toml").is_file())


def flake_dirs() -> List[Path]:
    return [REPO] + [REPO / name for name in kernel_names() if (REPO / name / "flake.nix").is_file()]


def flake_id(path: Path) -> str:
    return nl.rel(path, REPO)


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# --------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------


def test_kernel_discovery_matches_build_toml_rule():
    found = [p.name for p in nl.kernel_dirs(REPO)]
    assert found == kernel_names()
    assert "activation" in found
    assert "scripts" not in found and "tests" not in found


@pytest.mark.parametrize("name", kernel_names())
def test_kernel_folder_has_standalone_flake(name):
    kdir = REPO / name
    assert (kdir / "flake.nix").is_file(), (
        f"{name}/flake.nix missing: run `python scripts/nix_locks.py new-kernel {name}` and git add the result"
    )
    assert (kdir / "flake.lock").is_file(), f"{name}/flake.lock missing: run `python scripts/nix_locks.py generate`"
    src = read(kdir / "flake.nix")
    assert nl.parse_flake_inputs(src) == {"kernel-builder": {"url": "github:huggingface/kernels"}}
    assert "genKernelFlakeOutputs" in src
    assert re.search(r"inherit\s+self\s*;", src), "genKernelFlakeOutputs must get `inherit self;`"
    assert re.search(r"path\s*=\s*\./\.\s*;", src), "genKernelFlakeOutputs must get `path = ./.;`"


def test_top_level_flake_has_single_kernel_builder_input():
    assert nl.parse_flake_inputs(read(REPO / "flake.nix")) == {
        "kernel-builder": {"url": "github:huggingface/kernels"}
    }


# --------------------------------------------------------------------------
# Lock checks on the real files (§6.B, C.2, C.3)
# --------------------------------------------------------------------------


def test_all_repo_locks_pass_offline_checks():
    errors = nl.check_repo(REPO, git=False)
    assert errors == [], "\n".join(errors)


@pytest.mark.parametrize("fdir", flake_dirs(), ids=flake_id)
def test_lock_pins_documented_values(fdir):
    """Compare with nix.md §5.1, independently of the generator and the vendored data."""
    lock = json.loads(read(fdir / "flake.lock"))
    assert lock["version"] == 7 and lock["root"] == "root"
    nodes = lock["nodes"]
    assert nodes["root"] == {"inputs": {"kernel-builder": "kernel-builder"}}
    assert set(nodes) == {"root"} | set(PINNED)
    for key, (owner, repo, rev, last_modified, nar_hash) in PINNED.items():
        assert nodes[key]["locked"] == {
            "lastModified": last_modified, "narHash": nar_hash, "owner": owner,
            "repo": repo, "rev": rev, "type": "github",
        }, key
        original = {"owner": owner, "repo": repo, "type": "github"}
        if key == "nixpkgs":
            original["rev"] = rev
        assert nodes[key]["original"] == original, key
    assert nodes["kernel-builder"]["inputs"] == {
        "flake-compat": "flake-compat", "flake-utils": "flake-utils",
        "nixpkgs": "nixpkgs", "rust-overlay": "rust-overlay",
    }
    assert nodes["flake-utils"]["inputs"] == {"systems": "systems"}
    assert nodes["rust-overlay"]["inputs"] == {"nixpkgs": ["kernel-builder", "nixpkgs"]}


@pytest.mark.parametrize("fdir", flake_dirs(), ids=flake_id)
def test_lock_is_nix_formatted(fdir):
    text = read(fdir / "flake.lock")
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def test_locks_regenerate_byte_identical():
    for fdir in flake_dirs():
        assert nl.render_lock(nl.read_flake_inputs(fdir)) == read(fdir / "flake.lock"), fdir


def test_vendored_upstream_lock_matches_shared_copy():
    shared = REPO.parent / "shared" / "docs" / "upstream-kernels-flake.lock"
    if not shared.is_file():
        pytest.skip(f"{shared} not available (only in the authoring workspace)")
    assert nl.UPSTREAM_LOCK_PATH.read_bytes() == shared.read_bytes()


def test_vendored_pin_matches_docs():
    owner, repo, rev, last_modified, nar_hash = PINNED["kernel-builder"]
    assert nl.load_pin() == {
        "lastModified": last_modified, "narHash": nar_hash, "owner": owner,
        "repo": repo, "rev": rev, "type": "github",
    }


def test_cli_check_passes():
    res = subprocess.run([sys.executable, str(SCRIPT), "check", "--no-git"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK:" in res.stdout


# --------------------------------------------------------------------------
# Negative tests: each check must fail on a corrupted copy
# --------------------------------------------------------------------------

GOOD_LOCK = read(REPO / "flake.lock")
GOOD_INPUTS = {"kernel-builder": {"url": "github:huggingface/kernels"}}


def all_errors(lock_text: str, inputs: Dict[str, Any] = GOOD_INPUTS) -> List[str]:
    return (
        nl.check_lock_structure(lock_text, inputs, "flake.lock")
        + nl.check_against_upstream(lock_text, "flake.lock")
        + nl.check_regeneration(lock_text, inputs, "flake.lock")
    )


def dump(lock: Dict[str, Any]) -> str:
    return json.dumps(lock, indent=2, sort_keys=True) + "\n"


def mutated(fn: Callable[[Dict[str, Any]], Any]) -> str:
    lock = copy.deepcopy(json.loads(GOOD_LOCK))
    fn(lock)
    return dump(lock)


def _set(path: List[Any], value: Any) -> Callable[[Dict[str, Any]], None]:
    def fn(lock):
        cur = lock
        for part in path[:-1]:
            cur = cur[part]
        cur[path[-1]] = value
    return fn


def _delete(path: List[Any]) -> Callable[[Dict[str, Any]], None]:
    def fn(lock):
        cur = lock
        for part in path[:-1]:
            cur = cur[part]
        del cur[path[-1]]
    return fn


def _remove_rust_overlay(lock):
    del lock["nodes"]["rust-overlay"]
    del lock["nodes"]["kernel-builder"]["inputs"]["rust-overlay"]


def _add_orphan(lock):
    lock["nodes"]["systems_2"] = copy.deepcopy(lock["nodes"]["systems"])


OTHER_REV = "0123456789abcdef0123456789abcdef01234567"
OTHER_HASH = "sha256-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
N = ["nodes"]
KB = ["nodes", "kernel-builder"]

LOCK_DEFECTS = [
    ("version-8", _set(["version"], 8), '"version" is 8'),
    ("version-string", _set(["version"], "7"), '"version" is \'7\''),
    ("root-renamed", _set(["root"], "main"), '"root" is \'main\''),
    ("root-node-missing", _delete(N + ["root"]), "no root node"),
    ("follows-not-rerooted", _set(N + ["rust-overlay", "inputs", "nixpkgs"], ["nixpkgs"]),
     "does not resolve from the root"),
    ("follows-empty", _set(N + ["rust-overlay", "inputs", "nixpkgs"], []), "non-empty list"),
    ("follows-bad-target", _set(N + ["rust-overlay", "inputs", "nixpkgs"], ["kernel-builder", "nope"]),
     "does not resolve from the root"),
    ("kernel-builder-wrong-rev", _set(KB + ["locked", "rev"], OTHER_REV), "locked.rev is"),
    ("transitive-wrong-rev", _set(N + ["rust-overlay", "locked", "rev"], OTHER_REV), "differs from upstream"),
    ("rev-short", _set(N + ["systems", "locked", "rev"], "da67096"), "not 40 lowercase hex"),
    ("rev-uppercase", _set(N + ["systems", "locked", "rev"], "DA67096A3B9BF56A91D16901293E51BA5B49A27E"),
     "not 40 lowercase hex"),
    ("orphan-node", _add_orphan, "orphan"),
    ("dangling-reference", _set(N + ["flake-utils", "inputs", "systems"], "systems_9"),
     "refers to missing node 'systems_9'"),
    ("input-not-name-or-list", _set(N + ["flake-utils", "inputs", "systems"], 3), "expected a node name"),
    ("narhash-bad-format", _set(KB + ["locked", "narHash"], "sha256-abc"), "does not match sha256-"),
    ("narhash-not-sri", _set(N + ["systems", "locked", "narHash"], "0" * 52), "does not match sha256-"),
    ("narhash-wrong-value", _set(KB + ["locked", "narHash"], OTHER_HASH), "locked.narHash is"),
    ("narhash-missing", _delete(N + ["nixpkgs", "locked", "narHash"]), "narHash None"),
    ("lastmodified-missing", _delete(KB + ["locked", "lastModified"]), "lastModified None is not an integer"),
    ("lastmodified-string", _set(KB + ["locked", "lastModified"], "1787250351"), "is not an integer"),
    ("lastmodified-wrong", _set(KB + ["locked", "lastModified"], 1787250352), "locked.lastModified is"),
    ("locked-missing", _delete(N + ["systems", "locked"]), "has no 'locked' entry"),
    ("owner-mismatch", _set(N + ["systems", "locked", "owner"], "someone"), "locked.owner 'someone' differs"),
    ("repo-mismatch", _set(KB + ["original", "repo"], "kernel-builder"), "differs from original.repo"),
    ("type-tarball", _set(N + ["systems", "locked", "type"], "tarball"), "only 'github'"),
    ("original-rev-differs", _set(N + ["nixpkgs", "original", "rev"], OTHER_REV), "differs from original.rev"),
    ("original-ref-not-in-flake", _set(KB + ["original", "ref"], "main"), "does not match flake.nix"),
    ("root-input-missing", _set(N + ["root", "inputs"], {}), "missing from the root node's inputs"),
    ("root-input-extra", _set(N + ["root", "inputs", "nixpkgs"], "nixpkgs"), "does not declare"),
    ("transitive-node-removed", _remove_rust_overlay, "missing transitive nodes"),
    ("flake-false", _set(N + ["systems", "flake"], False), "'flake' differs from upstream"),
    ("node-not-object", _set(N + ["systems"], []), "is not an object"),
    ("root-has-locked", _set(N + ["root", "locked"], {}), "root node must not have"),
    ("unknown-node-key", _set(N + ["systems", "extra"], 1), "unexpected key"),
]


def test_good_lock_has_no_errors():
    """Positive control for the negative tests below."""
    assert all_errors(GOOD_LOCK) == []


@pytest.mark.parametrize("mutate,expected", [d[1:] for d in LOCK_DEFECTS], ids=[d[0] for d in LOCK_DEFECTS])
def test_lock_defect_is_detected(mutate, expected):
    errors = all_errors(mutated(mutate))
    assert errors, "corrupted lock passed every check"
    assert any(expected in e for e in errors), "\n".join(errors)


def _reversed_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reversed_keys(value[k]) for k in sorted(value, reverse=True)}
    return value


@pytest.mark.parametrize(
    "text,expected",
    [
        (GOOD_LOCK[: len(GOOD_LOCK) // 2], "not valid JSON"),
        ("[]\n", "top level is not a JSON object"),
        (json.dumps(json.loads(GOOD_LOCK), indent=4, sort_keys=True) + "\n", "not byte-identical"),
        (json.dumps(_reversed_keys(json.loads(GOOD_LOCK)), indent=2) + "\n", "not byte-identical"),
        (GOOD_LOCK.rstrip("\n"), "not byte-identical"),
        (json.dumps(json.loads(GOOD_LOCK), indent=2, sort_keys=True, separators=(",", ":")) + "\n",
         "not byte-identical"),
    ],
    ids=["truncated", "not-object", "indent-4", "unsorted-keys", "no-trailing-newline", "compact-separators"],
)
def test_lock_text_defect_is_detected(text, expected):
    assert text != GOOD_LOCK
    errors = all_errors(text)
    assert any(expected in e for e in errors), "\n".join(errors) or "no errors"


@pytest.mark.parametrize(
    "inputs,expected",
    [
        ({"kernel-builder": {"url": "github:huggingface/kernels/v0.12.0"}}, "does not match flake.nix"),
        ({"kernel-builder": {"url": f"github:huggingface/kernels/{OTHER_REV}"}}, "does not match flake.nix"),
        ({"kernel-builder": {"url": "github:huggingface/kernels?ref=main"}}, "does not match flake.nix"),
        ({"kernel-builder": {"url": "github:huggingface/kernel-builder"}}, "does not match flake.nix"),
        ({"kernel-builder": {"url": "github:huggingface/kernels"}, "nixpkgs": {"url": "github:NixOS/nixpkgs"}},
         "missing from the root node's inputs"),
        ({"builder": {"url": "github:huggingface/kernels"}}, "missing from the root node's inputs"),
        ({"kernel-builder": {"url": "path:../kernels"}}, "only github: URLs are supported"),
    ],
    ids=["url-ref", "url-rev", "url-query-ref", "old-repo", "extra-flake-input", "renamed-input", "path-url"],
)
def test_stale_lock_against_flake_inputs_is_detected(inputs, expected):
    errors = nl.check_lock_structure(GOOD_LOCK, inputs, "flake.lock")
    assert any(expected in e for e in errors), "\n".join(errors) or "no errors"


def test_locks_with_different_kernel_builder_revs_are_detected():
    other = mutated(_set(KB + ["locked", "rev"], OTHER_REV))
    assert nl.check_same_kernel_builder_rev({"flake.lock": GOOD_LOCK, "activation/flake.lock": GOOD_LOCK}) == []
    errors = nl.check_same_kernel_builder_rev({"flake.lock": GOOD_LOCK, "activation/flake.lock": other})
    assert errors and "activation/flake.lock" in errors[0] and OTHER_REV in errors[0]


def _copy_repo_flakes(dest: Path) -> None:
    shutil.copy2(REPO / "flake.nix", dest / "flake.nix")
    shutil.copy2(REPO / "flake.lock", dest / "flake.lock")
    (dest / "activation").mkdir()
    for name in ("build.toml", "flake.nix", "flake.lock"):
        shutil.copy2(REPO / "activation" / name, dest / "activation" / name)


def test_cli_check_reports_file_and_defect(tmp_path):
    _copy_repo_flakes(tmp_path)
    lock = tmp_path / "activation" / "flake.lock"
    lock.write_text(mutated(_set(N + ["rust-overlay", "inputs", "nixpkgs"], ["nixpkgs"])), encoding="utf-8")
    (tmp_path / "rmsnorm").mkdir()
    (tmp_path / "rmsnorm" / "build.toml").write_text("[general]\nname = \"rmsnorm\"\n", encoding="utf-8")
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(tmp_path), "check", "--no-git"], capture_output=True, text=True
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert "activation/flake.lock: node 'rust-overlay' input 'nixpkgs' follows ['nixpkgs']" in res.stderr
    assert "rmsnorm/: kernel folder has no flake.nix" in res.stderr
    assert "flake.lock: node" not in res.stderr.replace("activation/flake.lock", "")  # top-level lock is fine


def test_cli_new_kernel_and_generate(tmp_path):
    _copy_repo_flakes(tmp_path)
    (tmp_path / "scripts").mkdir()  # not a kernel: no build.toml
    (tmp_path / "rope").mkdir()
    (tmp_path / "rope" / "build.toml").write_text("[general]\nname = \"rope\"\n", encoding="utf-8")
    cli = [sys.executable, str(SCRIPT), "--root", str(tmp_path)]
    res = subprocess.run(cli + ["new-kernel"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "rope" / "flake.lock").read_bytes() == (REPO / "activation" / "flake.lock").read_bytes()
    assert nl.parse_flake_inputs(read(tmp_path / "rope" / "flake.nix")) == GOOD_INPUTS
    assert not (tmp_path / "scripts" / "flake.nix").exists()
    res = subprocess.run(cli + ["new-kernel", "rope"], capture_output=True, text=True)
    assert res.returncode == 1 and "exists" in res.stderr
    (tmp_path / "rope" / "flake.lock").write_text("{}", encoding="utf-8")
    assert subprocess.run(cli + ["check", "--no-git"], capture_output=True).returncode == 1
    res = subprocess.run(cli + ["generate"], capture_output=True, text=True)
    assert res.returncode == 0 and "wrote     rope/flake.lock" in res.stdout, res.stdout + res.stderr
    res = subprocess.run(cli + ["check", "--no-git"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


# --------------------------------------------------------------------------
# Lock writer details
# --------------------------------------------------------------------------


def test_node_names_follow_nix_dfs_order_with_suffixes():
    root = nl._Node()
    locked = lambda n: {"lastModified": 1, "narHash": OTHER_HASH, "owner": "o", "repo": n, "rev": OTHER_REV,
                        "type": "github"}
    a_nixpkgs, b_nixpkgs = nl._Node(locked("a"), {"type": "github"}), nl._Node(locked("b"), {"type": "github"})
    dep = nl._Node(locked("dep"), {"type": "github"})
    dep.inputs["nixpkgs"] = b_nixpkgs
    dep.inputs["shared"] = a_nixpkgs  # same node reached twice keeps its first name
    root.inputs["nixpkgs"] = a_nixpkgs
    root.inputs["dep"] = dep
    lock = json.loads(nl.serialize_lock(root))
    # DFS in sorted order: dep (→ nixpkgs = b, shared = a), then nixpkgs (= a, already named).
    assert lock["nodes"]["root"]["inputs"] == {"dep": "dep", "nixpkgs": "shared"}
    assert lock["nodes"]["dep"]["inputs"] == {"nixpkgs": "nixpkgs", "shared": "shared"}
    assert lock["nodes"]["nixpkgs"]["locked"]["repo"] == "b"
    root2 = nl._Node()
    root2.inputs["a"] = dep
    root2.inputs["nixpkgs"] = nl._Node(locked("c"), {"type": "github"})
    lock2 = json.loads(nl.serialize_lock(root2))
    assert lock2["nodes"]["root"]["inputs"] == {"a": "a", "nixpkgs": "nixpkgs_2"}


def test_follows_are_rerooted_under_the_input_name():
    upstream = nl.load_upstream()
    text = nl.render_lock(GOOD_INPUTS, upstream=upstream)
    assert json.loads(text)["nodes"]["rust-overlay"]["inputs"]["nixpkgs"] == ["kernel-builder", "nixpkgs"]


def test_url_with_pinned_rev_or_branch():
    rev = PINNED["kernel-builder"][2]
    lock = json.loads(nl.render_lock({"kernel-builder": {"url": f"github:huggingface/kernels/{rev}"}}))
    assert lock["nodes"]["kernel-builder"]["original"] == {
        "owner": "huggingface", "repo": "kernels", "rev": rev, "type": "github"}
    lock = json.loads(nl.render_lock({"kernel-builder": {"url": "github:huggingface/kernels/main"}}))
    assert lock["nodes"]["kernel-builder"]["original"]["ref"] == "main"
    with pytest.raises(nl.LockError, match="vendored pin"):
        nl.render_lock({"kernel-builder": {"url": f"github:huggingface/kernels/{OTHER_REV}"}})
    with pytest.raises(nl.LockError, match="only the 'kernel-builder' input"):
        nl.render_lock({"kernel-builder": {"url": "github:huggingface/kernels"},
                        "nixpkgs": {"url": "github:NixOS/nixpkgs"}})


# --------------------------------------------------------------------------
# flake.nix input reader
# --------------------------------------------------------------------------

PARSER_CASES = {
    "dotted": (
        '{ inputs.kernel-builder.url = "github:huggingface/kernels"; outputs = { self, ... }: { }; }',
        {"kernel-builder": {"url": "github:huggingface/kernels"}},
    ),
    "nested-with-comments": (
        """{
          # comment
          description = "x ${"y"}";
          inputs = {
            /* block */ kernel-builder = { url = "github:huggingface/kernels?ref=main"; };
            other.url = github:NixOS/nixpkgs;
            other.flake = false;
            dep.inputs.nixpkgs.follows = "other";
          };
          outputs = inputs@{ self, ... }: let x = 1; y = with builtins; toString x; in
            assert x == 1; { inherit (inputs) other; a = ''
              ''${x} ; } '';
            };
        }""",
        {
            "kernel-builder": {"url": "github:huggingface/kernels?ref=main"},
            "other": {"url": "github:NixOS/nixpkgs", "flake": False},
            "dep": {"inputs": {"nixpkgs": {"follows": "other"}}},
        },
    ),
    "no-inputs": ('{ outputs = { self }: { lib = { }; }; }', {}),
}


@pytest.mark.parametrize("case", sorted(PARSER_CASES))
def test_input_reader(case):
    src, expected = PARSER_CASES[case]
    assert nl.parse_flake_inputs(src) == expected


@pytest.mark.parametrize(
    "src",
    [
        '{ inputs.kernel-builder.url = "github:huggingface/${"kernels"}"; }',
        '{ inputs = import ./inputs.nix; }',
        '{ inputs.a.url = "x"; inputs.a.url = "y"; }',
        '{ inputs.a.url = "x" ',
    ],
    ids=["interpolated-url", "computed-inputs", "duplicate-attr", "unterminated"],
)
def test_input_reader_rejects_what_it_cannot_read(src):
    with pytest.raises(nl.LockError):
        nl.parse_flake_inputs(src)


# --------------------------------------------------------------------------
# Nix-based tests (A, D, E)
# --------------------------------------------------------------------------

NIX = shutil.which("nix")
NIX_INSTANTIATE = shutil.which("nix-instantiate")
GIT = shutil.which("git")

requires_nix = pytest.mark.skipif(
    not (NIX and NIX_INSTANTIATE),
    reason="Nix not installed (needs `nix` and `nix-instantiate`; on Debian: "
    "apt-get install -y --no-install-recommends nix-bin)",
)
requires_git = pytest.mark.skipif(not GIT, reason="git not installed")

CLOSED_PROXY = "http://127.0.0.1:9"  # discard port: any download attempt fails at once, offline
NIX_CONFIG = "\n".join(
    [
        "experimental-features = nix-command flakes",
        "build-users-group =",  # nix-bin without nix-setup-systemd has no nixbld group
        "sandbox = false",  # the mock derivations use the host's /bin/sh
        "substituters =",  # never ask cache.nixos.org
        "download-attempts = 1",
        "connect-timeout = 5",
        "warn-dirty = false",
        "flake-registry = " + str(MOCK_DIR / "empty-registry.json"),
    ]
)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@pytest.fixture(scope="session")
def nix_env(tmp_path_factory):
    env = dict(os.environ)
    env["NIX_CONFIG"] = NIX_CONFIG
    for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[var] = CLOSED_PROXY
    for var in ("no_proxy", "NO_PROXY"):
        env.pop(var, None)
    env["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("nix-cache"))
    env["NO_COLOR"] = "1"
    return env


def run_nix(args: List[str], env: Dict[str, str], cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    res = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    res.stdout, res.stderr = ANSI.sub("", res.stdout), ANSI.sub("", res.stderr)
    return res


def explain(res: subprocess.CompletedProcess) -> str:
    return f"$ {' '.join(map(str, res.args))}\nrc={res.returncode}\n--- stdout\n{res.stdout}\n--- stderr\n{res.stderr}"


@pytest.fixture(scope="session")
def nix_store_writable(nix_env, tmp_path_factory):
    """Nix tests need a usable store (root, or a Nix daemon)."""
    if not (NIX and NIX_INSTANTIATE):
        pytest.skip("Nix not installed")
    res = run_nix([NIX, "eval", "--raw", "--expr", 'builtins.toFile "nix-probe" "ok"'], nix_env,
                  tmp_path_factory.getbasetemp())
    if res.returncode != 0 and ("Permission denied" in res.stderr or "cannot connect to socket" in res.stderr):
        pytest.skip(f"Nix store not usable by this user: {res.stderr.strip().splitlines()[-1]}")
    assert res.returncode == 0, explain(res)


def working_tree_files(root: Path) -> List[str]:
    """Files Nix would see once added: tracked plus untracked-but-not-ignored."""
    if GIT and (root / ".git").exists():
        out = subprocess.run(
            [GIT, "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True, check=True,
        ).stdout.decode()
        return sorted({f for f in out.split("\0") if f and (root / f).is_file()})
    skip = {".git", "build", "__pycache__", ".pytest_cache"}
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*")
        if p.is_file() and not skip.intersection(p.relative_to(root).parts)
    )


def nix_files() -> List[str]:
    return [f for f in working_tree_files(REPO) if f.endswith(".nix")]


def git_commit_all(repo: Path, message: str) -> None:
    git = [GIT, "-C", str(repo), "-c", "user.name=nix-test", "-c", "user.email=nix-test@localhost",
           "-c", "commit.gpgsign=false"]
    subprocess.run(git + ["add", "-A", "."], check=True, capture_output=True)
    subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", message], check=True, capture_output=True)


def make_git_copy(dest: Path, files: List[str]) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dest / f)
    subprocess.run([GIT, "init", "-q", str(dest)], check=True, capture_output=True)
    git_commit_all(dest, "snapshot for Nix tests")
    return dest


# -- A: every .nix parses ---------------------------------------------------


@requires_nix
@pytest.mark.parametrize("path", nix_files())
def test_nix_file_parses(path, nix_env):
    res = run_nix([NIX_INSTANTIATE, "--parse", str(REPO / path)], nix_env, REPO)
    assert res.returncode == 0, explain(res)


@requires_nix
def test_nix_parse_check_can_fail(tmp_path, nix_env):
    bad = tmp_path / "bad.nix"
    bad.write_text('{ inputs.kernel-builder.url = "github:huggingface/kernels" }\n', encoding="utf-8")
    res = run_nix([NIX_INSTANTIATE, "--parse", str(bad)], nix_env, tmp_path)
    assert res.returncode != 0 and "syntax error" in res.stderr, explain(res)


@requires_nix
@pytest.mark.parametrize(
    "flake", [f for f in nix_files() if f.endswith("flake.nix")] + [f"<parser:{c}>" for c in sorted(PARSER_CASES)]
)
def test_input_reader_agrees_with_nix(flake, nix_env, tmp_path):
    if flake.startswith("<parser:"):
        path = tmp_path / "flake.nix"
        path.write_text(PARSER_CASES[flake[len("<parser:"):-1]][0], encoding="utf-8")
    else:
        path = REPO / flake
    res = run_nix([NIX_INSTANTIATE, "--eval", "--strict", "--json", "-E", f"(import {path}).inputs or {{ }}"],
                  nix_env, tmp_path)
    assert res.returncode == 0, explain(res)
    assert nl.parse_flake_inputs(read(path)) == json.loads(res.stdout)


# -- D: nix flake metadata --no-update-lock-file -------------------------------


def metadata_tree(stdout: str) -> str:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Inputs:")) + 1
    return "\n".join(line.rstrip() for line in lines[start:] if line.strip())


@requires_nix
@requires_git
@pytest.mark.parametrize("fdir", flake_dirs(), ids=flake_id)
def test_nix_flake_metadata_accepts_lock(fdir, nix_env, nix_store_writable):
    """Runs on the checkout itself: the lock must be tracked by git for Nix to see it."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    before = (fdir / "flake.lock").read_bytes()
    res = run_nix([NIX, "flake", "metadata", "--no-update-lock-file", str(fdir)], nix_env, REPO)
    assert res.returncode == 0, (
        explain(res) + "\n(\"unable to download\" means a stale or untracked flake.lock: "
        "run `python scripts/nix_locks.py generate` and `git add` the locks)"
    )
    assert metadata_tree(res.stdout) == EXPECTED_TREE, res.stdout
    assert (fdir / "flake.lock").read_bytes() == before


@pytest.fixture()
def flake_copy(tmp_path):
    """A committed git copy of the top-level and activation flakes (for negative D tests)."""
    if not GIT:
        pytest.skip("git not installed")
    files = ["flake.nix", "flake.lock", "activation/build.toml", "activation/flake.nix", "activation/flake.lock"]
    return make_git_copy(tmp_path / "repo", files)


def _stale_url(repo: Path) -> None:
    flake = repo / "flake.nix"
    flake.write_text(read(flake).replace('"github:huggingface/kernels"', '"github:huggingface/kernels/v0.12.0"'))


def _untracked_lock(repo: Path) -> None:
    subprocess.run([GIT, "-C", str(repo), "rm", "-q", "--cached", "flake.lock"], check=True)


def _lock_edit(fn: Callable[[Dict[str, Any]], Any]) -> Callable[[Path], None]:
    def edit(repo: Path) -> None:
        (repo / "flake.lock").write_text(mutated(fn), encoding="utf-8")
    return edit


@requires_nix
@pytest.mark.parametrize(
    "breakage,expected",
    [
        (_stale_url, "unable to download"),
        (_untracked_lock, "unable to download"),
        (_lock_edit(_set(["version"], 8)), "unsupported version 8"),
        (_lock_edit(_set(N + ["rust-overlay", "inputs", "nixpkgs"], ["nixpkgs"])),
         "follows a non-existent input 'nixpkgs'"),
    ],
    ids=["stale-url", "untracked-lock", "version-8", "follows-not-rerooted"],
)
def test_nix_flake_metadata_rejects_broken_lock(flake_copy, breakage, expected, nix_env, nix_store_writable):
    base = run_nix([NIX, "flake", "metadata", "--no-update-lock-file", str(flake_copy)], nix_env, flake_copy)
    assert base.returncode == 0, explain(base)
    breakage(flake_copy)
    res = run_nix([NIX, "flake", "metadata", "--no-update-lock-file", str(flake_copy)], nix_env, flake_copy)
    assert res.returncode != 0 and expected in res.stderr, explain(res)


# -- E: mock evaluation ----------------------------------------------------------

MOCK_KERNEL = "zz-mock-kernel"  # noarch: builds on every system
CUDA_ONLY_KERNEL = "zz-cuda-only"  # no variant on aarch64-darwin
MOCK_KERNEL_TOMLS = {
    MOCK_KERNEL: f"""\
[general]
name = "{MOCK_KERNEL}"
version = 1
edition = 5
license = "Apache-2.0"
backends = ["cpu", "cuda"]

[general.hub]
repo-id = "nix-tests/{MOCK_KERNEL}"

[torch-noarch]
""",
    CUDA_ONLY_KERNEL: f"""\
[general]
name = "{CUDA_ONLY_KERNEL}"
version = 1
edition = 5
license = "Apache-2.0"
backends = ["cuda"]

[general.hub]
repo-id = "nix-tests/{CUDA_ONLY_KERNEL}"

[torch]
src = []

[kernel.relu]
backend = "cuda"
depends = ["torch"]
src = ["relu.cu"]
""",
}


@pytest.fixture(scope="module")
def mock_repo(tmp_path_factory):
    """Committed git copy of the working tree plus two extra kernel folders.

    The extra kernels prove that the aggregator picks up new folders without
    edits, and that a kernel with no variant on some system (CUDA-only on
    darwin) does not break evaluation there.
    """
    if not (NIX and NIX_INSTANTIATE):
        pytest.skip("Nix not installed")
    if not GIT:
        pytest.skip("git not installed")
    repo = tmp_path_factory.mktemp("mock") / "repo"
    make_git_copy(repo, working_tree_files(REPO))
    for name, toml_text in MOCK_KERNEL_TOMLS.items():
        (repo / name).mkdir()
        (repo / name / "build.toml").write_text(toml_text, encoding="utf-8")
        assert nl.cmd_new_kernel(repo, [name], force=False) == 0
    for kdir in nl.kernel_dirs(repo):  # kernels whose flake.nix is not written yet
        if not (kdir / "flake.nix").is_file():
            nl.cmd_new_kernel(repo, [kdir.name], force=False)
    git_commit_all(repo, "add mock kernel")
    return repo


def mock_overrides(repo: Path) -> List[str]:
    mock = repo / "tests" / "nix_mock"
    return [
        "--override-input", "kernel-builder", f"path:{mock / 'kernel-builder'}",
        "--override-input", "kernel-builder/nixpkgs", f"path:{mock / 'nixpkgs'}",
        "--override-input", "kernel-builder/flake-utils", f"path:{mock / 'flake-utils'}",
    ]


def mock_kernels(repo: Path) -> List[str]:
    return [p.name for p in nl.kernel_dirs(repo)]


def lock_bytes(repo: Path) -> Dict[str, bytes]:
    return {str(p.relative_to(repo)): p.read_bytes() for p in sorted(repo.glob("**/flake.lock"))}


def assert_build_dir(repo: Path, kernel: str) -> None:
    build = repo / kernel / "build"
    variants = sorted(p for p in build.iterdir() if p.is_dir()) if build.is_dir() else []
    assert variants, f"{kernel}/build/ got no variant directory"
    general = tomllib.loads(read(repo / kernel / "build.toml"))["general"]
    name, repo_id = general["name"], general["hub"]["repo-id"]
    for variant in variants:
        meta = json.loads(read(variant / "metadata.json"))
        assert meta["variant"] == variant.name
        assert meta["name"] == name
        assert meta["repo-id"] == repo_id
        assert meta["kernel-dir"] == kernel  # `path` handed to genKernelFlakeOutputs is this folder of `self`
        assert os.access(variant / "metadata.json", os.W_OK), "build/ must be writable"


@requires_nix
def test_mock_flake_show(mock_repo, nix_env, nix_store_writable):
    before = lock_bytes(mock_repo)
    res = run_nix([NIX, "flake", "show", *mock_overrides(mock_repo)], nix_env, mock_repo)
    assert res.returncode == 0, explain(res)
    out = res.stdout
    kernels = mock_kernels(mock_repo)
    assert MOCK_KERNEL in kernels and "activation" in kernels
    for kernel in kernels:
        for attr in (kernel, f"{kernel}-build-and-copy", f"{kernel}-build-and-upload", f"{kernel}-ci",
                     f"{kernel}-ci-test"):
            assert re.search(rf"─{re.escape(attr)}: package ", out), f"packages.*.{attr} missing\n{out}"
        assert re.search(rf"─{re.escape(kernel)}: development environment", out), out
    assert re.search(r"─build-and-copy: package 'build-and-copy'", out), out
    darwin = out.split("aarch64-darwin", 1)[1].split("aarch64-linux", 1)[0]  # devShells.aarch64-darwin
    assert f"{MOCK_KERNEL}: development environment" in darwin, out
    assert CUDA_ONLY_KERNEL not in darwin, f"{CUDA_ONLY_KERNEL} has no darwin variant, so no darwin shell\n{out}"
    assert re.search(r"─default: package ", out), out
    for not_kernel in ("scripts", "tests", "nix_mock", "kernel-builder"):
        assert not re.search(rf"─{not_kernel}[:\s]", out), f"{not_kernel} treated as a kernel\n{out}"
    assert lock_bytes(mock_repo) == before, "--override-input must not rewrite flake.lock"


@requires_nix
def test_mock_flake_check_no_build(mock_repo, nix_env, nix_store_writable):
    before = lock_bytes(mock_repo)
    res = run_nix([NIX, "flake", "check", "--no-build", *mock_overrides(mock_repo)], nix_env, mock_repo)
    assert res.returncode == 0, explain(res)
    assert lock_bytes(mock_repo) == before


@requires_nix
def test_mock_top_level_build_and_copy(mock_repo, nix_env, nix_store_writable):
    before = lock_bytes(mock_repo)
    for kernel in mock_kernels(mock_repo):
        shutil.rmtree(mock_repo / kernel / "build", ignore_errors=True)
    # Upstream semantics: a variant being copied is replaced, other entries are kept.
    stale = mock_repo / MOCK_KERNEL / "build" / "torch-cpu" / "stale.txt"
    unrelated = mock_repo / MOCK_KERNEL / "build" / "unrelated.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("old build")
    unrelated.write_text("keep me")
    res = run_nix([NIX, "run", *mock_overrides(mock_repo), ".#build-and-copy"], nix_env, mock_repo)
    assert res.returncode == 0, explain(res)
    for kernel in mock_kernels(mock_repo):
        assert_build_dir(mock_repo, kernel)
    assert not stale.exists() and unrelated.is_file()
    assert sorted(p.name for p in (mock_repo / MOCK_KERNEL / "build").iterdir() if p.is_dir()) == [
        "torch-cpu", "torch-cuda"]
    assert not (mock_repo / "build").exists(), "top-level build-and-copy must not write ./build at the root"
    assert lock_bytes(mock_repo) == before, "flake.lock was rewritten"
    diff = subprocess.run([GIT, "-C", str(mock_repo), "status", "--porcelain", "--untracked-files=no"],
                          capture_output=True, text=True)
    assert diff.stdout == "", f"tracked files changed:\n{diff.stdout}"


@requires_nix
def test_mock_per_kernel_outputs(mock_repo, nix_env, nix_store_writable):
    """`nix run .#<name>-build-and-copy` at the root and `nix run .#build-and-copy` inside each folder."""
    before = lock_bytes(mock_repo)
    for kernel in mock_kernels(mock_repo):
        shutil.rmtree(mock_repo / kernel / "build", ignore_errors=True)
        res = run_nix([NIX, "run", *mock_overrides(mock_repo), f".#{kernel}-build-and-copy"], nix_env, mock_repo)
        assert res.returncode == 0, explain(res)
        assert_build_dir(mock_repo, kernel)

        shutil.rmtree(mock_repo / kernel / "build")
        res = run_nix([NIX, "run", *mock_overrides(mock_repo), ".#build-and-copy"], nix_env, mock_repo / kernel)
        assert res.returncode == 0, explain(res)
        assert_build_dir(mock_repo, kernel)
    assert not (mock_repo / "build").exists()
    assert lock_bytes(mock_repo) == before


@requires_nix
def test_mock_default_link_farm_and_passthrough(mock_repo, nix_env, nix_store_writable):
    res = run_nix([NIX, "build", "--no-link", "--json", *mock_overrides(mock_repo), ".#default"], nix_env, mock_repo)
    assert res.returncode == 0, explain(res)
    farm = Path(json.loads(res.stdout)[0]["outputs"]["out"])
    kernels = mock_kernels(mock_repo)
    assert sorted(p.name for p in farm.iterdir()) == kernels
    for kernel in kernels:
        assert any((farm / kernel).iterdir()), f"bundle of {kernel} is empty"

    # Everything else a kernel flake exposes is reachable via legacyPackages.
    res = run_nix([NIX, "eval", "--json", *mock_overrides(mock_repo), ".#activation.variants"], nix_env, mock_repo)
    assert res.returncode == 0, explain(res)
    variant = json.loads(res.stdout)[0]
    res = run_nix([NIX, "build", "--no-link", "--json", *mock_overrides(mock_repo),
                   f".#activation.redistributable.{variant}"], nix_env, mock_repo)
    assert res.returncode == 0, explain(res)
    assert (Path(json.loads(res.stdout)[0]["outputs"]["out"]) / variant / "metadata.json").is_file()


@requires_nix
def test_mock_build_and_copy_outside_repo_root_fails_clearly(mock_repo, nix_env, nix_store_writable):
    res = run_nix([NIX, "run", *mock_overrides(mock_repo), "..#build-and-copy"], nix_env, mock_repo / "tests")
    assert res.returncode != 0
    assert "build.toml not found" in res.stderr and "repository root" in res.stderr, explain(res)
