"""The local Hub, driven by the real huggingface_hub client (in-process, explicit endpoint)."""

from __future__ import annotations

import hashlib
import os

import pytest
from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    constants,
    hf_hub_download,
)
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
from localhub import LocalHub
from localhub.client import FAKE_TOKEN

SO_BYTES = b"\x7fELF\x02\x01\x01\x00" + os.urandom(1_500_000)


@pytest.fixture(autouse=True)
def _no_xet(monkeypatch):
    # hf_xet is installed; the local hub implements the LFS protocol only.
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)


@pytest.fixture
def api(local_hub):
    return HfApi(endpoint=local_hub.endpoint, token=FAKE_TOKEN)


def _repo(api, request) -> str:
    repo_id = f"unit-org/{request.node.name.replace('[', '-').replace(']', '')}"
    api.create_repo(repo_id, repo_type="kernel")
    return repo_id


def test_commit_regular_and_lfs_files_then_download(api, local_hub, request, tmp_path):
    repo_id = _repo(api, request)
    # exist_ok: a second creation is not an error and creates nothing.
    api.create_repo(repo_id, repo_type="kernel", exist_ok=True)
    assert local_hub.commit_count(repo_id) == 1
    assert set(local_hub.files(repo_id)) == {".gitattributes"}

    local_hub.clear_requests()
    info = api.create_commit(
        repo_id,
        [
            CommitOperationAdd("build/torch-cpu/__init__.py", b"X = 1\n"),
            CommitOperationAdd("build/torch-cpu/_k.abi3.so", SO_BYTES),
        ],
        commit_message="add",
        repo_type="kernel",
    )
    calls = local_hub.requests_log()
    # The client asked for upload modes, used the LFS batch API for the binary and PUT it to storage.
    assert ("POST", f"/api/kernels/{repo_id}/preupload/main") in calls
    assert ("POST", f"/kernels/{repo_id}.git/info/lfs/objects/batch") in calls
    assert any(m == "PUT" and p.startswith("/lfs-upload/") for m, p in calls)
    assert local_hub.lfs_paths(repo_id, "main") == {"build/torch-cpu/_k.abi3.so"}
    assert local_hub.branches(repo_id)["main"] == info.oid

    tree = {f.path: f for f in api.list_repo_tree(repo_id, recursive=True, repo_type="kernel")}
    assert set(tree) == {
        ".gitattributes",
        "build",
        "build/torch-cpu",
        "build/torch-cpu/__init__.py",
        "build/torch-cpu/_k.abi3.so",
    }
    so = tree["build/torch-cpu/_k.abi3.so"]
    assert so.lfs.sha256 == hashlib.sha256(SO_BYTES).hexdigest() and so.size == len(SO_BYTES)
    assert tree["build/torch-cpu/__init__.py"].lfs is None
    # Non-recursive listing of a sub-folder, as the kernels loader does for build/.
    assert [f.path for f in api.list_repo_tree(repo_id, "build", repo_type="kernel")] == [
        "build/torch-cpu"
    ]

    cache = tmp_path / "cache"
    for path, content in [
        ("build/torch-cpu/_k.abi3.so", SO_BYTES),
        ("build/torch-cpu/__init__.py", b"X = 1\n"),
    ]:
        got = hf_hub_download(
            repo_id,
            path,
            repo_type="kernel",
            endpoint=local_hub.endpoint,
            cache_dir=cache,
            token=FAKE_TOKEN,
        )
        assert open(got, "rb").read() == content
    # LFS content came from the storage origin (a redirect), not from the API origin.
    assert any(p.startswith("/lfs-blobs/") for _, p in local_hub.requests_log())


def test_branches_are_git_like(api, local_hub, request):
    repo_id = _repo(api, request)
    first = api.create_commit(
        repo_id, [CommitOperationAdd("a.txt", b"one\n")], commit_message="1", repo_type="kernel"
    ).oid
    api.create_branch(repo_id, branch="v1", repo_type="kernel")
    assert local_hub.branches(repo_id)["v1"] == first
    second = api.create_commit(
        repo_id,
        [CommitOperationAdd("a.txt", b"two\n"), CommitOperationAdd("b/c.txt", b"c\n")],
        commit_message="2",
        repo_type="kernel",
        revision="v1",
    ).oid
    # main did not move; the old commit is unchanged and still addressable.
    assert local_hub.branches(repo_id)["main"] == first
    assert local_hub.files(repo_id, first)["a.txt"] == b"one\n"
    assert local_hub.files(repo_id, "v1")["a.txt"] == b"two\n"
    assert local_hub.commit_info(repo_id, second)["parents"] == [first]
    # A branch from an explicit commit id.
    api.create_branch(repo_id, branch="old", revision=first, repo_type="kernel")
    refs = {
        b.name: b.target_commit for b in api.list_repo_refs(repo_id, repo_type="kernel").branches
    }
    assert refs == {"main": first, "v1": second, "old": first}
    with pytest.raises(HfHubHTTPError) as exc:
        api.create_branch(repo_id, branch="v1", repo_type="kernel")
    assert exc.value.response.status_code == 409
    api.create_branch(repo_id, branch="v1", repo_type="kernel", exist_ok=True)
    assert api.repo_info(repo_id, repo_type="kernel", revision="v1").sha == second
    assert [c.commit_id for c in api.list_repo_commits(repo_id, repo_type="kernel", revision="v1")][
        :2
    ] == [second, first]

    # Deletes: a file and a folder.
    api.create_commit(
        repo_id,
        [CommitOperationDelete("a.txt"), CommitOperationDelete("b/")],
        commit_message="rm",
        repo_type="kernel",
        revision="v1",
    )
    assert set(local_hub.files(repo_id, "v1")) == {".gitattributes"}
    with pytest.raises(HfHubHTTPError):
        api.create_commit(
            repo_id,
            [CommitOperationDelete("missing.txt")],
            commit_message="rm",
            repo_type="kernel",
            revision="v1",
        )
    # Optimistic concurrency: a stale parent commit is refused.
    with pytest.raises(HfHubHTTPError) as exc:
        api.create_commit(
            repo_id,
            [CommitOperationAdd("z", b"z")],
            commit_message="z",
            repo_type="kernel",
            revision="v1",
            parent_commit=first,
        )
    assert exc.value.response.status_code == 412
    with pytest.raises(RevisionNotFoundError):
        api.list_repo_tree(repo_id, repo_type="kernel", revision="nope").__next__()
    with pytest.raises(RepositoryNotFoundError):
        api.list_repo_refs("unit-org/does-not-exist", repo_type="kernel")


def test_organization_trust_flag_and_auth(api, local_hub):
    local_hub.set_org("trusted-org", trusted=True)
    local_hub.set_org("plain-org", trusted=False)
    assert api.get_organization_overview("trusted-org").trustedKernelPublisher is True
    assert api.get_organization_overview("plain-org").trustedKernelPublisher is False
    with pytest.raises(HfHubHTTPError) as exc:
        api.get_organization_overview("nobody")
    assert exc.value.response.status_code == 404
    assert api.whoami()["name"] == "local-user"
    # Writes need a token.
    with pytest.raises(HfHubHTTPError) as exc:
        HfApi(endpoint=local_hub.endpoint, token=False).create_repo(
            "plain-org/x", repo_type="kernel"
        )
    assert exc.value.response.status_code == 401


def test_pagination_persistence_and_xet_message(tmp_path, monkeypatch):
    root = tmp_path / "store"
    with LocalHub(root, page_size=2, tokens={"hf_good"}) as hub:
        api = HfApi(endpoint=hub.endpoint, token="hf_good")
        api.create_repo("o/k", repo_type="kernel")
        ops = [CommitOperationAdd(f"d/f{i}.txt", f"{i}\n".encode()) for i in range(5)]
        oid = api.create_commit("o/k", ops, commit_message="files", repo_type="kernel").oid
        # 1 + 5 files and a folder, over 2-entry pages (Link: rel="next").
        assert len(list(api.list_repo_tree("o/k", recursive=True, repo_type="kernel"))) == 7
        with pytest.raises(HfHubHTTPError) as exc:
            HfApi(endpoint=hub.endpoint, token="hf_bad").create_repo("o/k2", repo_type="kernel")
        assert exc.value.response.status_code == 401
        # With Xet enabled the client asks for a Xet write token, which the local hub refuses (501).
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)
        with pytest.raises(Exception, match=r"501.*xet-write-token"):
            api.create_commit(
                "o/k",
                [CommitOperationAdd("x.bin", b"\0" * 100)],
                commit_message="x",
                repo_type="kernel",
            )
    # Everything is on disk: a new server on the same store sees the same refs and files.
    with LocalHub(root) as hub:
        assert hub.branches("o/k") == {"main": oid}
        assert hub.files("o/k")["d/f3.txt"] == b"3\n"
