"""scripts/upload.py against the local Hub, with small fake builds (no compilation)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from localhub import LocalHub
from localhub.builds import edit_metadata, make_fake_kernel, rehash
from localhub.client import client_env

REPO = Path(__file__).resolve().parents[1]
UPLOAD = REPO / "scripts" / "upload.py"
VARIANT = "torch-cpu"


def upload(env, *args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(UPLOAD), *map(str, args)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def repo_exists(hub: LocalHub, repo_id: str) -> bool:
    return ("kernel", repo_id) in hub.state.repos


def test_upload_layout_and_second_upload_is_a_noop(local_hub, hub_env, tmp_path):
    kdir = make_fake_kernel(tmp_path)
    env = hub_env()
    r = upload(env, kdir, "--org", "up-layout", "--output-json", tmp_path / "out.json")
    assert r.returncode == 0, r.stderr
    repo_id = "up-layout/fakek"
    main_files, v1_files = local_hub.files(repo_id, "main"), local_hub.files(repo_id, "v1")
    assert main_files["README.md"] == (kdir / "build" / "CARD.md").read_bytes()
    assert not any(p.startswith(("build/", "benchmarks/")) for p in main_files)
    assert {p for p in v1_files if p.startswith(("build/", "benchmarks/"))} == {
        f"build/{VARIANT}/__init__.py",
        f"build/{VARIANT}/_ops.py",
        f"build/{VARIANT}/metadata.json",
        "benchmarks/benchmark.py",
    }
    assert (
        v1_files[f"build/{VARIANT}/metadata.json"]
        == (kdir / "build" / VARIANT / "metadata.json").read_bytes()
    )
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["status"] == "uploaded" and out["repo_id"] == repo_id and out["branch"] == "v1"
    assert out["branches"]["v1"]["commit"] == local_hub.branches(repo_id)["v1"]

    heads, commits = local_hub.branches(repo_id), local_hub.commit_count(repo_id)
    r = upload(env, kdir, "--org", "up-layout", "--output-json", tmp_path / "again.json")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "fakek: no changes"
    assert local_hub.branches(repo_id) == heads and local_hub.commit_count(repo_id) == commits
    assert json.loads((tmp_path / "again.json").read_text())["status"] == "no_changes"


def test_dry_run_changes_nothing(local_hub, hub_env, tmp_path):
    kdir = make_fake_kernel(tmp_path)
    env = hub_env()
    repo_id = "up-dry/fakek"
    r = upload(env, kdir, "--org", "up-dry", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert f"add     build/{VARIANT}/__init__.py" in r.stdout and "add     README.md" in r.stdout
    assert "dry run: nothing was changed" in r.stdout
    assert not repo_exists(local_hub, repo_id)

    assert upload(env, kdir, "--org", "up-dry").returncode == 0
    heads, commits = local_hub.branches(repo_id), local_hub.commit_count(repo_id)
    (kdir / "build" / VARIANT / "__init__.py").write_text("CHANGED = True\n")
    (kdir / "build" / VARIANT / "new.py").write_text("NEW = 1\n")
    rehash(kdir / "build" / VARIANT)
    r = upload(env, kdir, "--org", "up-dry", "--dry-run", "--output-json", tmp_path / "plan.json")
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["status"] == "dry_run"
    assert plan["branches"]["v1"]["replace"] == [
        f"build/{VARIANT}/__init__.py",
        f"build/{VARIANT}/metadata.json",
    ]
    assert plan["branches"]["v1"]["add"] == [f"build/{VARIANT}/new.py"]
    assert local_hub.branches(repo_id) == heads and local_hub.commit_count(repo_id) == commits
    assert b"CHANGED" not in local_hub.files(repo_id, "v1")[f"build/{VARIANT}/__init__.py"]


def _dirty_provenance(vdir):
    edit_metadata(
        vdir,
        provenance={
            "kernel-builder": {"version": "0.17.0"},
            "kernel": {"commit": "ab" * 20, "dirty": True},
        },
    )


def _dirty_id(vdir):
    edit_metadata(vdir, id="_fakek_cpu_abc1234_dirty")


def _tampered(vdir):
    (vdir / "_ops.py").write_text("ops = 'tampered'\n")


def _extra_file(vdir):
    (vdir / "sneaky.py").write_text("X = 1\n")


def _no_digest(vdir):
    edit_metadata(vdir, digest=None)


def _version(vdir):
    edit_metadata(vdir, version=2)


def _abi_violation(vdir):
    """A shared object that links exp@GLIBC_2.29, newer than manylinux_2_28 allows (as local builds do)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    (vdir / "exp.c").write_text("#include <math.h>\ndouble f(double x) { return exp(x); }\n")
    subprocess.run(
        [
            "cc",
            "-O0",
            "-shared",
            "-fPIC",
            "-o",
            str(vdir / "_fakek_cpu_abc1234.abi3.so"),
            str(vdir / "exp.c"),
            "-lm",
        ],
        check=True,
    )
    (vdir / "exp.c").unlink()
    rehash(vdir)


@pytest.mark.parametrize(
    "spoil, expected, allow",
    [
        (_dirty_provenance, "dirty build", "--allow-dirty"),
        (_dirty_id, "dirty build (id '_fakek_cpu_abc1234_dirty'", "--allow-dirty"),
        (_tampered, "digest mismatch: _ops.py has a different hash", "--allow-digest-mismatch"),
        (_extra_file, "digest mismatch: sneaky.py is not in the digest", "--allow-digest-mismatch"),
        (_no_digest, "metadata.json has no digest", "--allow-digest-mismatch"),
        (
            _version,
            "metadata version 2 differs from build.toml version 1",
            "--allow-version-mismatch",
        ),
        (
            _abi_violation,
            "ABI check failed: _fakek_cpu_abc1234.abi3.so: manylinux_2_28: 1 symbol(s) newer than "
            "the policy allows: exp@GLIBC_2.29",
            "--allow-abi-violations",
        ),
    ],
    ids=[
        "dirty-provenance",
        "dirty-id",
        "digest-hash",
        "digest-extra-file",
        "no-digest",
        "version-mismatch",
        "abi-violation",
    ],
)
def test_refusals(local_hub, hub_env, tmp_path, spoil, expected, allow):
    kdir = make_fake_kernel(tmp_path, variants=(VARIANT, "torch213-cxx11-cpu-x86_64-linux"))
    spoil(kdir / "build" / VARIANT)
    org = f"up-refuse-{spoil.__name__.strip('_').replace('_', '-')}"
    env = hub_env()
    r = upload(env, kdir, "--org", org, "--output-json", tmp_path / "out.json")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr  # only the spoiled variant is refused, in one line
    assert lines[0].startswith(f"error: fakek: variant {VARIANT}: ") and expected in lines[0], (
        lines[0]
    )
    assert json.loads((tmp_path / "out.json").read_text())["status"] == "error"
    assert not repo_exists(local_hub, f"{org}/fakek")
    # Told otherwise, the upload goes through (--branch: the version check is off for a mixed build).
    r = upload(env, kdir, "--org", org, allow, "--branch", "v1")
    assert r.returncode == 0, r.stderr
    assert f"build/{VARIANT}/_ops.py" in local_hub.files(f"{org}/fakek", "v1")
    if allow == "--allow-abi-violations":  # let through, not silently
        assert (
            "warning: fakek: variant torch-cpu: ABI check failed" in r.stderr
            and "exp@GLIBC_2.29" in r.stderr
        )


def test_existing_branch_keeps_other_variants(local_hub, hub_env, tmp_path):
    old, new = "torch212-cxx11-cpu-x86_64-linux", "torch213-cxx11-cpu-x86_64-linux"
    kdir = make_fake_kernel(tmp_path, variants=(old, new))
    (kdir / "build" / new / "stale.py").write_text("STALE = 1\n")
    rehash(kdir / "build" / new)
    env = hub_env()
    repo_id = "up-keep/fakek"
    assert upload(env, kdir, "--org", "up-keep").returncode == 0
    before = local_hub.files(repo_id, "v1")
    assert f"build/{new}/stale.py" in before and f"build/{old}/__init__.py" in before

    # The next build only produces the new variant, without stale.py.
    shutil.rmtree(kdir / "build" / old)
    (kdir / "build" / new / "stale.py").unlink()
    rehash(kdir / "build" / new)
    r = upload(env, kdir, "--org", "up-keep")
    assert r.returncode == 0, r.stderr
    assert f"delete  build/{new}/stale.py" in r.stdout
    after = local_hub.files(repo_id, "v1")
    assert f"build/{new}/stale.py" not in after
    assert {p: c for p, c in after.items() if p.startswith(f"build/{old}/")} == {
        p: c for p, c in before.items() if p.startswith(f"build/{old}/")
    }
    # --variant selects a subset; an unknown one is a clear error.
    r = upload(env, kdir, "--org", "up-keep", "--variant", "torch299-cxx11-cpu-x86_64-linux")
    assert r.returncode == 1 and "variant torch299-cxx11-cpu-x86_64-linux not found" in r.stderr


def test_org_resolution(hub_env, tmp_path):
    kdir = make_fake_kernel(tmp_path)
    env = hub_env()

    def repo_for(env_, *args):
        r = upload(env_, kdir, "--dry-run", "--output-json", tmp_path / "o.json", *args)
        assert r.returncode == 0, r.stderr
        return json.loads((tmp_path / "o.json").read_text())["repo_id"]

    assert repo_for(env) == "open-kernels/fakek"  # build.toml [general.hub] repo-id
    assert repo_for({**env, "KERNELS_ORG": "env-org"}) == "env-org/fakek"
    assert repo_for({**env, "KERNELS_ORG": "env-org"}, "--org", "flag-org") == "flag-org/fakek"


def test_token_is_never_printed(tmp_path):
    secret = "hf_very_secret_value_42"
    kdir = make_fake_kernel(tmp_path)
    with LocalHub(tmp_path / "store", tokens={secret}) as hub:
        env = client_env(hub.endpoint, tmp_path / "client", token=None)
        bad = "hf_wrong_secret_value_43"
        r = upload(
            env, kdir, "--org", "tok", "--token", bad, "--output-json", tmp_path / "bad.json"
        )
        assert r.returncode == 1
        assert len(r.stderr.strip().splitlines()) == 1 and "401" in r.stderr, r.stderr
        r2 = upload(
            {**env, "HF_TOKEN": secret}, kdir, "--org", "tok", "--output-json", tmp_path / "ok.json"
        )
        assert r2.returncode == 0, r2.stderr
        assert "v1" in hub.branches("tok/fakek")
        r3 = upload(env, kdir, "--org", "tok")  # no token at all
        assert r3.returncode == 1 and "no Hugging Face token" in r3.stderr
    for text in (
        r.stdout,
        r.stderr,
        r2.stdout,
        r2.stderr,
        (tmp_path / "bad.json").read_text(),
        (tmp_path / "ok.json").read_text(),
    ):
        assert bad not in text and secret not in text


def test_branch_main(local_hub, hub_env, tmp_path):
    """`--branch main` (how kernels-community also publishes version-1 kernels): one commit on main."""
    kdir = make_fake_kernel(tmp_path)
    r = upload(hub_env(), kdir, "--org", "up-main", "--branch", "main")
    assert r.returncode == 0, r.stderr
    assert set(local_hub.branches("up-main/fakek")) == {"main"}
    files = local_hub.files("up-main/fakek", "main")
    assert {"README.md", f"build/{VARIANT}/__init__.py", "benchmarks/benchmark.py"} <= set(files)
    assert local_hub.commit_count("up-main/fakek") == 2  # the repo's initial commit and the upload


def test_card_names_the_repository_uploaded_to(local_hub, hub_env, tmp_path):
    kdir = make_fake_kernel(tmp_path)
    (kdir / "build" / "CARD.md").write_text(
        "---\nlibrary_name: kernels\n---\n"
        'k = get_kernel("open-kernels/fakek", version=1)\n'
        "kernels benchmark open-kernels/fakek@v1\n"
        'LayerRepository(repo_id="open-kernels/fakek", layer_name="X")\n'
        "Related, not this repository: open-kernels/fakek-extra\n"
    )
    r = upload(hub_env(), kdir, "--org", "card-org")
    assert r.returncode == 0, r.stderr
    for branch in ("main", "v1"):
        card = local_hub.files("card-org/fakek", branch)["README.md"].decode()
        assert 'get_kernel("card-org/fakek", version=1)' in card
        assert "kernels benchmark card-org/fakek@v1" in card and 'repo_id="card-org/fakek"' in card
        assert "open-kernels/fakek-extra" in card and "open-kernels/fakek\"" not in card


def _state(hub: LocalHub, repo_id: str) -> dict:
    return {b: hub.files(repo_id, b) for b in hub.branches(repo_id)} | {
        "heads": hub.branches(repo_id)
    }


def test_failed_upload_leaves_the_repository_as_it_was(local_hub, hub_env, tmp_path):
    kdir = make_fake_kernel(tmp_path)
    env, repo_id = hub_env(), "up-atomic/fakek"
    assert upload(env, kdir, "--org", "up-atomic").returncode == 0
    before = _state(local_hub, repo_id)
    (kdir / "build" / "CARD.md").write_text("---\nlibrary_name: kernels\n---\nnew card\n")
    (kdir / "build" / VARIANT / "__init__.py").write_text("CHANGED = True\n")
    rehash(kdir / "build" / VARIANT)

    # The existing branch's commit fails: nothing moved.
    local_hub.fail_next("POST", f"/api/kernels/{repo_id}/commit/v1")
    r = upload(env, kdir, "--org", "up-atomic")
    assert r.returncode == 1 and "no branch was changed" in r.stderr, r.stderr
    assert _state(local_hub, repo_id) == before

    # main's README is committed last: its failure puts the already committed v1 back.
    local_hub.fail_next("POST", f"/api/kernels/{repo_id}/commit/main")
    r = upload(env, kdir, "--org", "up-atomic")
    assert (
        r.returncode == 1
        and "500" in r.stderr
        and "branch v1 of up-atomic/fakek was put back" in r.stderr
    )
    assert _state(local_hub, repo_id) == before

    # A new branch whose commit fails is removed again.
    local_hub.fail_next("POST", f"/api/kernels/{repo_id}/commit/v7")
    r = upload(env, kdir, "--org", "up-atomic", "--branch", "v7")
    assert r.returncode == 1 and "v7" not in local_hub.branches(repo_id), r.stderr
    assert _state(local_hub, repo_id) == before

    # Xet (which the local Hub lacks) fails while the large files are stored: before any ref moves.
    (kdir / "build" / VARIANT / "weights.bin").write_bytes(b"\0\1\2" * 1000)
    rehash(kdir / "build" / VARIANT)
    xet_env = {k: v for k, v in env.items() if k != "HF_HUB_DISABLE_XET"}
    r = upload(xet_env, kdir, "--org", "up-atomic")
    assert r.returncode == 1 and "no branch was changed" in r.stderr, r.stderr
    assert _state(local_hub, repo_id) == before
    # A repository that the failed upload created is deleted again.
    r = upload(xet_env, kdir, "--org", "up-atomic-new")
    assert (
        r.returncode == 1
        and "up-atomic-new/fakek created by this upload was deleted again" in r.stderr
    )
    assert not repo_exists(local_hub, "up-atomic-new/fakek")
    # The same upload with LFS goes through whole.
    assert upload(env, kdir, "--org", "up-atomic").returncode == 0
    assert b"CHANGED" in local_hub.files(repo_id, "v1")[f"build/{VARIANT}/__init__.py"]
    assert local_hub.files(repo_id, "main")["README.md"].endswith(b"new card\n")


def test_dry_run_offline_plans_and_says_what_it_could_not_check(hub_env, tmp_path):
    kdir = make_fake_kernel(tmp_path)
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for env in ({**hub_env(), "HF_ENDPOINT": endpoint}, {**hub_env(), "HF_HUB_OFFLINE": "1"}):
        r = upload(
            env, kdir, "--org", "offline", "--dry-run", "--output-json", tmp_path / "plan.json"
        )
        assert r.returncode == 0, r.stderr
        assert (
            "could not reach the Hub at " in r.stdout
            and "planning from the local build alone" in r.stdout
        )
        assert (
            f"send    build/{VARIANT}/__init__.py" in r.stdout and "send    README.md" in r.stdout
        )
        assert (
            "not checked (the Hub at " in r.stdout
            and "whether offline/fakek and its branches exist" in r.stdout
        )
        plan = json.loads((tmp_path / "plan.json").read_text())
        assert plan["status"] == "dry_run" and plan["offline"] is True and plan["not_checked"]
        assert f"build/{VARIANT}/metadata.json" in plan["branches"]["v1"]["add"]
    # Without --dry-run it still fails, naming the Hub it could not reach.
    r = upload({**hub_env(), "HF_ENDPOINT": endpoint}, kdir, "--org", "offline")
    assert (
        r.returncode == 1 and f"Hub at {endpoint}; check the network or HF_ENDPOINT" in r.stderr
    ), r.stderr
