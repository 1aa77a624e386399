"""End to end: build activation (CPU), upload it with scripts/upload.py to the local Hub, load it
with `kernels.get_kernel` in fresh processes.

The build runs in a temporary git repository holding a snapshot of this working tree (tracked and
untracked, non-ignored files), committed, so the build id is clean and version bumps never touch
the real activation/build.toml. The repository is built twice (version 1, then 2).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from localhub import LocalHub
from localhub.builds import edit_metadata, rehash
from localhub.client import client_env

REPO = Path(__file__).resolve().parents[1]
UPLOAD = REPO / "scripts" / "upload.py"
sys.path.insert(0, str(REPO / "scripts"))
import build as build_script  # noqa: E402

TRUSTED, UNTRUSTED = "e2e-trusted", "e2e-untrusted"
# fmt: off
OPS = [
    "silu_and_mul", "mul_and_silu", "gelu_and_mul", "gelu_tanh_and_mul", "fatrelu_and_mul", "swigluoai_and_mul",
    "gelu", "gelu_tanh", "silu", "gelu_fast", "gelu_new", "gelu_quick",
]
# fmt: on


@dataclass
class Workspace:
    src: Path  # the temporary git repository
    tmp: Path
    hub: LocalHub
    upload_env: dict
    loader_env: dict
    variant: str = ""
    kernel_v1: Path = Path()  # a kernel folder (build.toml and build/) frozen at version 1
    results: dict = field(default_factory=dict)

    @property
    def kernel_dir(self) -> Path:
        return self.src / "activation"

    @property
    def build_v1(self) -> Path:
        return self.kernel_v1 / "build"


def run(cmd, env, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def upload(ws: Workspace, *args, allow_abi: bool = True) -> subprocess.CompletedProcess:
    # A local build links symbols newer than manylinux_2_28 allows (test_refusals_on_the_real_build).
    flags = ["--allow-abi-violations"] if allow_abi else []
    return run([sys.executable, UPLOAD, *args, *flags], ws.upload_env)


def load(ws: Workspace, code: str, env: dict | None = None) -> dict:
    """Run `code` in a fresh interpreter; it must print one JSON object on its last stdout line."""
    r = run([sys.executable, "-c", code], env or ws.loader_env, timeout=180)
    assert r.returncode == 0, f"loader process failed:\n{r.stdout}\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def _git(src: Path, *args: str) -> None:
    run(
        [
            "git",
            "-c",
            "user.name=e2e",
            "-c",
            "user.email=e2e@localhost",
            "-c",
            "commit.gpgsign=false",
            *args,
        ],
        None,
        cwd=src,
    ).check_returncode()


def _build(ws: Workspace) -> Path:
    r = run(
        [
            sys.executable,
            ws.src / "scripts" / "build.py",
            "activation",
            "--backend",
            "cpu",
            "--no-smoke",
        ],
        None,
        cwd=ws.src,
        timeout=600,
    )
    assert r.returncode == 0, f"build failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    variants = [p for p in (ws.kernel_dir / "build").iterdir() if (p / "metadata.json").is_file()]
    assert [p.name for p in variants] == ["torch213-cxx11-cpu-x86_64-linux"], variants
    meta = json.loads((variants[0] / "metadata.json").read_text())
    assert not meta["id"].endswith("_dirty") and meta["provenance"]["kernel"]["dirty"] is False, (
        meta
    )
    return variants[0]


@pytest.fixture(scope="module")
def ws(local_hub, tmp_path_factory) -> Workspace:
    tmp = tmp_path_factory.mktemp("e2e")
    src = tmp / "src"
    listed = run(
        ["git", "-C", REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard"], None
    )
    listed.check_returncode()
    for rel in filter(None, listed.stdout.split("\0")):
        path = REPO / rel
        if path.is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / rel)
    _git(src, "init", "-q")
    _git(src, "add", "-A")
    _git(src, "commit", "-q", "-m", "snapshot for the hub e2e test")
    local_hub.set_org(TRUSTED, trusted=True)
    local_hub.set_org(UNTRUSTED, trusted=False)
    ws = Workspace(
        src=src,
        tmp=tmp,
        hub=local_hub,
        upload_env=client_env(local_hub.endpoint, tmp / "client"),
        # kernels 0.17.2 cannot reach any Hub with HF_HUB_DISABLE_TELEMETRY=1 (see the xfail test below).
        loader_env=client_env(local_hub.endpoint, tmp / "client", telemetry=True),
    )
    variant_dir = _build(ws)
    ws.variant = variant_dir.name
    ws.kernel_v1 = tmp / "activation_v1"
    shutil.copytree(ws.kernel_dir / "build", ws.kernel_v1 / "build")
    shutil.copy2(ws.kernel_dir / "build.toml", ws.kernel_v1 / "build.toml")
    return ws


@pytest.fixture(scope="module")
def v1(ws) -> Workspace:
    r = upload(ws, ws.kernel_v1, "--org", TRUSTED, "--output-json", ws.tmp / "v1.json")
    assert r.returncode == 0, r.stderr
    ws.results["v1"] = json.loads((ws.tmp / "v1.json").read_text())
    ws.results["v1_stdout"] = r.stdout
    return ws


@pytest.fixture(scope="module")
def v2(v1) -> Workspace:
    """Bump the snapshot to version 2 (committed, so the build stays clean), rebuild, dry-run, upload."""
    ws = v1
    toml = ws.kernel_dir / "build.toml"
    text = toml.read_text()
    assert "\nversion = 1\n" in text
    toml.write_text(text.replace("\nversion = 1\n", "\nversion = 2\n"))
    _git(ws.src, "commit", "-q", "-am", "activation: version 2")
    _build(ws)
    repo_id = f"{TRUSTED}/activation"
    heads, commits = ws.hub.branches(repo_id), ws.hub.commit_count(repo_id)
    dry = upload(
        ws, ws.kernel_dir, "--org", TRUSTED, "--dry-run", "--output-json", ws.tmp / "v2-dry.json"
    )
    ws.results["v2_dry"] = (
        dry,
        json.loads((ws.tmp / "v2-dry.json").read_text()),
        heads,
        commits,
        ws.hub.branches(repo_id),
        ws.hub.commit_count(repo_id),
    )
    r = upload(ws, ws.kernel_dir, "--org", TRUSTED, "--output-json", ws.tmp / "v2.json")
    assert r.returncode == 0, r.stderr
    ws.results["v2"] = json.loads((ws.tmp / "v2.json").read_text())
    ws.results["v1_head_before_v2"] = heads["v1"]
    return ws


CALL_EVERY_OP = r"""
import json, sys, torch, kernels
k = kernels.get_kernel(REPO_ID, version=1)
torch.manual_seed(0)
errors = {}
for name in OPS:
    x = torch.randn(5, 64) * 4
    gated = "_and_" in name
    out = torch.empty(5, 32) if gated else torch.empty_like(x)
    ret = getattr(k, name)(out, x)
    ref = getattr(k._reference, name)(x)
    assert ret is out and out.shape == ref.shape, name
    errors[name] = float((out - ref).abs().max())
print(json.dumps({
    "errors": errors,
    "name": k.__name__,
    "file": k.__file__,
    "in_sys_modules": sys.modules.get(k.__name__) is k,
    "torch_ops": all(hasattr(getattr(torch.ops, k.__name__), n) for n in OPS),
}))
"""


def test_v1_every_op_matches_reference(v1):
    ws = v1
    repo_id = f"{TRUSTED}/activation"
    assert ws.results["v1"]["status"] == "uploaded"
    files = ws.hub.files(repo_id, "v1")
    so = [p for p in files if p.endswith(".abi3.so")]
    assert so and set(so) == ws.hub.lfs_paths(repo_id, "v1")  # the .so went through LFS
    variant_files = {
        p.relative_to(ws.build_v1).as_posix(): p.read_bytes()
        for p in (ws.build_v1 / ws.variant).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert {p: c for p, c in files.items() if p.startswith("build/")} == {
        f"build/{p}": c for p, c in variant_files.items()
    }
    benches = {
        f"benchmarks/{p.name}": p.read_bytes()
        for p in (ws.build_v1 / "benchmarks").glob("benchmark*.py")
    }
    assert {p: c for p, c in files.items() if p.startswith("benchmarks/")} == benches
    card = ws.build_v1 / "CARD.md"
    if card.is_file():  # the rendered card becomes README.md on main, naming the repo it is in
        readme = ws.hub.files(repo_id, "main")["README.md"]
        assert readme == card.read_bytes().replace(b"open-kernels/activation", repo_id.encode())
        assert (
            f'get_kernel("{repo_id}"'.encode() in readme
            and b"open-kernels/activation" not in readme
        )
    ws.hub.clear_requests()
    out = load(ws, f"REPO_ID = {repo_id!r}\nOPS = {OPS!r}\n" + CALL_EVERY_OP)
    meta = json.loads((ws.build_v1 / ws.variant / "metadata.json").read_text())
    assert set(out["errors"]) == set(OPS)
    bad = {op: err for op, err in out["errors"].items() if not err <= 1e-5}
    assert not bad, bad
    assert out["name"] == meta["id"] and out["in_sys_modules"] and out["torch_ops"]
    commit = ws.hub.branches(repo_id)["v1"]
    assert out["file"] == str(
        ws.tmp
        / "client"
        / "kernels_cache"
        / "kernels--e2e-trusted--activation"
        / "snapshots"
        / commit
        / "build"
        / ws.variant
        / "__init__.py"
    )
    calls = ws.hub.requests_log()
    for call in [
        ("GET", f"/api/organizations/{TRUSTED}/overview"),
        ("GET", f"/api/kernels/{repo_id}/refs"),
        ("GET", f"/api/kernels/{repo_id}/tree/{commit}/build"),
        ("HEAD", f"/kernels/{repo_id}/resolve/{commit}/build/{ws.variant}/metadata.json"),
    ]:
        assert call in calls, (call, calls)


def test_second_upload_changes_nothing(v1):
    ws = v1
    repo_id = f"{TRUSTED}/activation"
    heads, commits = ws.hub.branches(repo_id), ws.hub.commit_count(repo_id)
    r = upload(ws, ws.kernel_v1, "--org", TRUSTED, "--output-json", ws.tmp / "again.json")
    assert r.returncode == 0, r.stderr
    assert "v1: no changes" in r.stdout and r.stdout.strip().endswith("activation: no changes")
    assert json.loads((ws.tmp / "again.json").read_text())["status"] == "no_changes"
    assert ws.hub.branches(repo_id) == heads and ws.hub.commit_count(repo_id) == commits


def test_untrusted_publisher_needs_trust_remote_code(v1):
    ws = v1
    r = upload(ws, ws.kernel_v1, "--org", UNTRUSTED)
    assert r.returncode == 0, r.stderr
    out = load(
        ws,
        f"""
import json, kernels
repo = "{UNTRUSTED}/activation"
try:
    kernels.get_kernel(repo, version=1)
    refused = None
except ValueError as e:
    refused = str(e)
a = kernels.get_kernel(repo, version=1, trust_remote_code=True)
b = kernels.get_kernel(repo, version=1, trust_remote_code=[repo])
print(json.dumps({{"refused": refused, "ok": ["silu_and_mul" in a.__all__, a is b]}}))
""",
    )
    assert out["refused"] and "is not from a trusted publisher" in out["refused"], out
    assert out["ok"] == [True, True]


def test_refusals_on_the_real_build(v1, tmp_path):
    ws = v1
    repo_id = f"{TRUSTED}/activation"
    heads, commits = ws.hub.branches(repo_id), ws.hub.commit_count(repo_id)

    def spoiled(name: str, spoil) -> Path:
        build = tmp_path / name
        shutil.copytree(ws.build_v1, build)
        spoil(build / ws.variant)
        return build

    cases = [
        (
            spoiled(
                "digest", lambda v: (v / "_reference.py").write_text("# changed after the build\n")
            ),
            "digest mismatch: _reference.py has a different hash",
        ),
        (
            spoiled(
                "dirty",
                lambda v: edit_metadata(
                    v,
                    provenance={
                        "kernel-builder": {"version": "0.17.0"},
                        "kernel": {"commit": "ab" * 20, "dirty": True},
                    },
                ),
            ),
            "dirty build",
        ),
    ]
    for build, expected in cases:
        r = upload(ws, ws.kernel_v1, "--org", TRUSTED, "--build-dir", build)
        assert r.returncode == 1
        assert (
            r.stderr.strip().startswith(f"error: activation: variant {ws.variant}: ")
            and expected in r.stderr
        ), r.stderr
    # Version mismatch: build.toml says 2, the build says 1.
    kdir = tmp_path / "k2"
    kdir.mkdir()
    text = (ws.kernel_dir / "build.toml").read_text()
    (kdir / "build.toml").write_text(text.replace("\nversion = 1\n", "\nversion = 2\n"))
    r = upload(ws, kdir, "--org", TRUSTED, "--build-dir", ws.build_v1)
    assert (
        r.returncode == 1 and "metadata version 1 differs from build.toml version 2" in r.stderr
    ), r.stderr
    # The build's own ABI findings (this machine's glibc is newer than manylinux_2_28) refuse it.
    so = next((ws.build_v1 / ws.variant).glob("*.abi3.so"))
    if build_script.check_abi(so):
        r = upload(ws, ws.kernel_v1, "--org", TRUSTED, allow_abi=False)
        assert (
            r.returncode == 1 and "ABI check failed: " in r.stderr and "manylinux_2_28" in r.stderr
        ), r.stderr
    assert ws.hub.branches(repo_id) == heads and ws.hub.commit_count(repo_id) == commits


def test_existing_branch_keeps_a_variant_that_is_not_reuploaded(v1, tmp_path):
    ws = v1
    org, old = "e2e-keep", "torch212-cxx11-cpu-x86_64-linux"
    both = tmp_path / "both"
    shutil.copytree(ws.build_v1, both)
    shutil.copytree(both / ws.variant, both / old)
    rehash(both / old)
    (both / ws.variant / "obsolete.py").write_text("OBSOLETE = True\n")
    rehash(both / ws.variant)
    assert upload(ws, ws.kernel_v1, "--org", org, "--build-dir", both).returncode == 0
    repo_id = f"{org}/activation"
    before = ws.hub.files(repo_id, "v1")
    assert f"build/{old}/metadata.json" in before and f"build/{ws.variant}/obsolete.py" in before
    r = upload(ws, ws.kernel_v1, "--org", org, "--build-dir", ws.build_v1)
    assert r.returncode == 0, r.stderr
    after = ws.hub.files(repo_id, "v1")
    assert f"build/{ws.variant}/obsolete.py" not in after
    kept = {p: c for p, c in before.items() if p.startswith(f"build/{old}/")}
    assert len(kept) == sum(1 for f in (both / old).iterdir() if f.is_file())
    assert all(after.get(p) == c for p, c in kept.items())


def test_dry_run_changes_nothing(v2):
    dry, plan, heads, commits, heads_after, commits_after = v2.results["v2_dry"]
    assert dry.returncode == 0, dry.stderr
    assert (
        "branch v2 (new, from main):" in dry.stdout and "dry run: nothing was changed" in dry.stdout
    )
    assert plan["status"] == "dry_run" and plan["branches"]["v2"]["exists"] is False
    assert any(p.endswith(".abi3.so") for p in plan["branches"]["v2"]["add"])
    assert (heads_after, commits_after) == (heads, commits) and "v2" not in heads_after


def test_versions_1_and_2_side_by_side(v2):
    ws = v2
    repo_id = f"{TRUSTED}/activation"
    heads = ws.hub.branches(repo_id)
    assert set(heads) == {"main", "v1", "v2"} and heads["v1"] == ws.results["v1_head_before_v2"]
    out = load(
        ws,
        f"""
import json, sys, torch, kernels
k1 = kernels.get_kernel({repo_id!r}, version=1)
k2 = kernels.get_kernel({repo_id!r}, version=2)
x = torch.randn(4, 32)
res = {{}}
for k in (k1, k2):
    out = torch.empty(4, 16)
    k.silu_and_mul(out, x)
    res[k.__name__] = float((out - k._reference.silu_and_mul(x)).abs().max())
try:
    kernels.get_kernel({repo_id!r}, version=3)
    missing = None
except ValueError as e:
    missing = str(e)
print(json.dumps({{"names": [k1.__name__, k2.__name__], "files": [k1.__file__, k2.__file__], "res": res,
                  "both_loaded": sys.modules[k1.__name__] is k1 and sys.modules[k2.__name__] is k2,
                  "missing": missing}}))
""",
    )
    n1, n2 = out["names"]
    assert n1 != n2 and out["both_loaded"]
    assert (
        f"/snapshots/{heads['v1']}/" in out["files"][0]
        and f"/snapshots/{heads['v2']}/" in out["files"][1]
    )
    assert out["res"][n1] <= 1e-5 and out["res"][n2] <= 1e-5
    assert out["missing"] == "Version 3 not found, available versions: 1, 2"


@pytest.mark.xfail(
    strict=False,
    reason="kernels 0.17.2 passes user_agent='' when HF_HUB_DISABLE_TELEMETRY is set; huggingface_hub 2.4.0 then "
    "sends a User-Agent ending in '; ', which httpx rejects (LocalProtocolError: Illegal header value), so "
    "get_kernel cannot reach any Hub. Remove this xfail (and client_env's telemetry switch) once fixed.",
)
def test_loader_with_telemetry_disabled(v1):
    load(
        v1,
        f"""
import json, kernels
k = kernels.get_kernel("{TRUSTED}/activation", version=1, trust_remote_code=True)
print(json.dumps({{"ok": True}}))
""",
        env=v1.upload_env,
    )
