"""A local Hugging Face Hub for tests (stdlib only).

It answers the HTTP calls that `huggingface_hub` makes for repo creation and deletion,
branches, the NDJSON commit API (regular files, legacy LFS files, deletions),
tree listings and `resolve` downloads, and that the `kernels` loader makes for
versions, variants, downloads and the publisher-trust check.

Storage is git-like and kept on disk under `root`:

    root/blobs/<sha256>                    file contents, by sha256
    root/repos/<type>/<ns>/<name>/repo.json    refs (branches, tags), settings
    root/repos/<type>/<ns>/<name>/commits/<oid>.json   immutable commits

A commit records its parents and a full tree ``{path: {sha256, size, lfs}}``;
its id is the sha1 of its canonical JSON, so a commit never changes.

Two listeners are started on 127.0.0.1 (random ports): the Hub itself and a
"CDN" origin for LFS blob uploads/downloads. The CDN is a different origin on
purpose: huggingface_hub only follows same-origin redirects when it reads
file metadata, exactly as with the real Hub and its CDN.

Xet storage is not implemented: run clients with ``HF_HUB_DISABLE_XET=1`` so
that huggingface_hub uses the LFS batch API for large/binary files.
"""

from __future__ import annotations

import base64
import datetime as _dt
import fnmatch
import hashlib
import json
import re
import secrets
import shutil
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

REPO_TYPES = ("model", "dataset", "space", "kernel")
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/", "kernel": "kernels/"}
PLURAL_TO_TYPE = {t + "s": t for t in REPO_TYPES}
PREFIX_TO_TYPE = {"datasets": "dataset", "spaces": "space", "kernels": "kernel"}

# Files at least this large always go through LFS (as on the Hub).
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024

# Initial content of every new repo (written by the first commit on `main`).
DEFAULT_GITATTRIBUTES = (
    "*.bin filter=lfs diff=lfs merge=lfs -text\n"
    "*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    "*.pt filter=lfs diff=lfs merge=lfs -text\n"
    "*.pth filter=lfs diff=lfs merge=lfs -text\n"
    "*.tar.gz filter=lfs diff=lfs merge=lfs -text\n"
    "*.zip filter=lfs diff=lfs merge=lfs -text\n"
)

_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob with this content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
    )


def looks_binary(data: bytes) -> bool:
    """NUL bytes or invalid UTF-8 (a multi-byte character cut at the end of a sample is fine)."""
    if b"\0" in data:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return not (e.reason == "unexpected end of data" and e.start >= len(data) - 3)
    return False


def _now() -> str:
    return (
        _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")
    )


class HubError(Exception):
    """An error answered as JSON, with the X-Error-* headers huggingface_hub reads."""

    def __init__(
        self, status: int, message: str, code: str | None = None, extra: dict | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.extra = extra or {}


@dataclass
class Repo:
    type: str
    id: str
    path: Path
    private: bool = False
    created_at: str = field(default_factory=_now)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "type": self.type,
            "id": self.id,
            "private": self.private,
            "createdAt": self.created_at,
            "branches": self.branches,
            "tags": self.tags,
        }


class HubState:
    """Repos, commits, blobs and settings. All methods are thread-safe."""

    def __init__(
        self,
        root: Path,
        *,
        user: str = "local-user",
        tokens: set[str] | None = None,
        page_size: int = 1000,
    ):
        self.root = Path(root)
        self.blobs = self.root / "blobs"
        self.blobs.mkdir(parents=True, exist_ok=True)
        (self.root / "repos").mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self.user = user
        # None: any non-empty bearer token may write; otherwise only these.
        self.tokens = tokens
        self.page_size = page_size
        self.orgs: dict[str, dict[str, Any]] = {}
        self.repos: dict[tuple[str, str], Repo] = {}
        self._commits: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []
        # Injected failures: (method, path pattern, status), each answered once (see LocalHub.fail_next).
        self.failures: list[tuple[str, re.Pattern, int]] = []
        self._load()

    # ---- persistence -------------------------------------------------
    def _load(self) -> None:
        orgs_file = self.root / "orgs.json"
        if orgs_file.exists():
            self.orgs = json.loads(orgs_file.read_text())
        for repo_json in (self.root / "repos").glob("*/*/*/repo.json"):
            d = json.loads(repo_json.read_text())
            repo = Repo(
                type=d["type"],
                id=d["id"],
                path=repo_json.parent,
                private=d.get("private", False),
                created_at=d.get("createdAt", _now()),
                branches=d.get("branches", {}),
                tags=d.get("tags", {}),
            )
            self.repos[(repo.type, repo.id)] = repo

    def _save_repo(self, repo: Repo) -> None:
        repo.path.mkdir(parents=True, exist_ok=True)
        tmp = repo.path / "repo.json.tmp"
        tmp.write_text(json.dumps(repo.to_json(), indent=2, sort_keys=True))
        tmp.replace(repo.path / "repo.json")

    def _save_orgs(self) -> None:
        (self.root / "orgs.json").write_text(json.dumps(self.orgs, indent=2, sort_keys=True))

    # ---- organizations -----------------------------------------------
    def set_org(self, name: str, *, trusted: bool = False) -> None:
        with self.lock:
            self.orgs[name] = {"trusted": bool(trusted)}
            self._save_orgs()

    def org_overview(self, name: str) -> dict:
        with self.lock:
            org = self.orgs.get(name)
            if org is None:
                raise HubError(404, f"Organization {name!r} not found", "OrganizationNotFound")
            n_repos = sum(1 for (_, rid) in self.repos if rid.split("/")[0] == name)
            return {
                "name": name,
                "fullname": name,
                "avatarUrl": "",
                "isVerified": org["trusted"],
                "numUsers": 1,
                "numModels": n_repos,
                "trustedKernelPublisher": org["trusted"],
            }

    # ---- blobs -------------------------------------------------------
    def put_blob(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        path = self.blobs / sha
        if not path.exists():
            tmp = self.blobs / f".{sha}.{secrets.token_hex(4)}.tmp"
            tmp.write_bytes(data)
            tmp.replace(path)
        return sha

    def has_blob(self, sha256: str, size: int | None = None) -> bool:
        path = self.blobs / sha256
        return path.is_file() and (size is None or path.stat().st_size == size)

    def read_blob(self, sha256: str) -> bytes:
        return (self.blobs / sha256).read_bytes()

    # ---- repos -------------------------------------------------------
    def get_repo(self, repo_type: str, repo_id: str) -> Repo:
        repo = self.repos.get((repo_type, repo_id))
        if repo is None:
            raise HubError(404, f"Repository {repo_id!r} ({repo_type}) not found", "RepoNotFound")
        return repo

    def delete_repo(self, repo_type: str, repo_id: str) -> None:
        with self.lock:
            repo = self.get_repo(repo_type, repo_id)
            del self.repos[(repo_type, repo_id)]
            shutil.rmtree(repo.path, ignore_errors=True)

    def create_repo(
        self, repo_type: str, repo_id: str, *, private: bool = False
    ) -> tuple[Repo, bool]:
        ns, _, name = repo_id.partition("/")
        if not ns or not name or "/" in name:
            raise HubError(400, f"Invalid repo id {repo_id!r}: expected <namespace>/<name>")
        with self.lock:
            if (repo_type, repo_id) in self.repos:
                return self.repos[(repo_type, repo_id)], False
            if ns != self.user and ns not in self.orgs:
                # Namespaces are organizations (untrusted unless configured).
                self.orgs[ns] = {"trusted": False}
                self._save_orgs()
            repo = Repo(
                type=repo_type,
                id=repo_id,
                path=self.root / "repos" / repo_type / ns / name,
                private=private,
            )
            self.repos[(repo_type, repo_id)] = repo
            gitattributes = DEFAULT_GITATTRIBUTES.encode()
            tree = {".gitattributes": self._entry(gitattributes, lfs=False)}
            oid = self._write_commit(
                repo, parents=[], tree=tree, title="initial commit", message=""
            )
            repo.branches["main"] = oid
            self._save_repo(repo)
            return repo, True

    def _entry(self, data: bytes, *, lfs: bool) -> dict:
        return {
            "sha256": self.put_blob(data),
            "size": len(data),
            "lfs": lfs,
            "gitOid": git_blob_sha1(data),
        }

    # ---- commits -----------------------------------------------------
    def _write_commit(
        self, repo: Repo, *, parents: list[str], tree: dict, title: str, message: str
    ) -> str:
        body = {
            "parents": parents,
            "tree": tree,
            "title": title,
            "message": message,
            "date": _now(),
            "author": self.user,
        }
        oid = hashlib.sha1(json.dumps(body, sort_keys=True).encode()).hexdigest()
        body["id"] = oid
        cdir = repo.path / "commits"
        cdir.mkdir(parents=True, exist_ok=True)
        (cdir / f"{oid}.json").write_text(json.dumps(body, indent=1, sort_keys=True))
        self._commits[oid] = body
        return oid

    def commit(self, repo: Repo, oid: str) -> dict:
        c = self._commits.get(oid)
        if c is None:
            path = repo.path / "commits" / f"{oid}.json"
            if not path.exists():
                raise HubError(404, f"Invalid rev id: {oid}", "RevisionNotFound")
            c = json.loads(path.read_text())
            self._commits[oid] = c
        return c

    def resolve(self, repo: Repo, revision: str) -> str:
        """Branch, tag, full or abbreviated (>= 7 hex digits) commit id -> commit id."""
        with self.lock:
            rev = revision
            for prefix in ("refs/heads/", "refs/tags/"):
                if rev.startswith(prefix):
                    rev = rev[len(prefix) :]
            if rev in repo.branches:
                return repo.branches[rev]
            if rev in repo.tags:
                return repo.tags[rev]
            if re.fullmatch(r"[0-9a-f]{7,40}", rev):
                cdir = repo.path / "commits"
                matches = [p.stem for p in cdir.glob(f"{rev}*.json")] if cdir.is_dir() else []
                if len(matches) == 1:
                    return matches[0]
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def history(self, repo: Repo, oid: str) -> list[dict]:
        out, seen, todo = [], set(), [oid]
        while todo:
            cur = todo.pop(0)
            if cur in seen:
                continue
            seen.add(cur)
            c = self.commit(repo, cur)
            out.append(c)
            todo.extend(c["parents"])
        out.sort(key=lambda c: c["date"], reverse=True)
        return out

    def create_branch(self, repo: Repo, branch: str, starting_point: str | None) -> str:
        with self.lock:
            if branch in repo.branches:
                raise HubError(409, f"Reference already exists: refs/heads/{branch}")
            if not branch or branch.startswith("refs/") or ".." in branch or branch.endswith("/"):
                raise HubError(400, f"Invalid branch name {branch!r}")
            oid = self.resolve(repo, starting_point or "main")
            repo.branches[branch] = oid
            self._save_repo(repo)
            return oid

    def delete_branch(self, repo: Repo, branch: str) -> None:
        with self.lock:
            if branch == "main":
                raise HubError(403, "Cannot delete the main branch")
            if branch not in repo.branches:
                raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            del repo.branches[branch]
            self._save_repo(repo)

    def gitattributes_lfs_patterns(self, repo: Repo, oid: str) -> list[str]:
        entry = self.commit(repo, oid)["tree"].get(".gitattributes")
        if entry is None:
            return []
        patterns = []
        for line in self.read_blob(entry["sha256"]).decode(errors="replace").splitlines():
            parts = line.split()
            if len(parts) >= 2 and "filter=lfs" in parts[1:]:
                patterns.append(parts[0])
        return patterns

    def apply_commit(self, repo: Repo, branch: str, ops: list[dict], header: dict) -> str:
        """Apply NDJSON commit operations on top of `branch`; returns the new commit id."""
        with self.lock:
            if branch not in repo.branches:
                # The Hub commits only to branches (not to tags or commit ids).
                if branch in repo.tags or _HEX40.match(branch):
                    raise HubError(400, f"Can only commit to a branch, got {branch!r}")
                raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            head = repo.branches[branch]
            parent_commit = header.get("parentCommit")
            if parent_commit and not head.startswith(parent_commit):
                raise HubError(
                    412,
                    f"A commit has happened since. Please refresh and try again. (parent {parent_commit}, head {head})",
                )
            tree = dict(self.commit(repo, head)["tree"])
            for op in ops:
                key, value = op.get("key"), op.get("value") or {}
                path = value.get("path", "")
                if key == "file":
                    _check_path(path)
                    if value.get("encoding", "base64") != "base64":
                        raise HubError(400, f"Unsupported encoding for {path}")
                    data = base64.b64decode(value.get("content", ""))
                    if looks_binary(data):
                        raise HubError(
                            400,
                            f"Your push was rejected because it contains binary files ({path}). "
                            "Please use LFS/Xet to store binary files.",
                        )
                    if len(data) >= LFS_SIZE_THRESHOLD:
                        raise HubError(
                            400, f"{path} is too large to be committed as a regular file; use LFS"
                        )
                    tree[path] = self._entry(data, lfs=False)
                elif key == "lfsFile":
                    _check_path(path)
                    sha, size = value.get("oid", ""), value.get("size")
                    if value.get("algo", "sha256") != "sha256" or not _HEX64.match(sha):
                        raise HubError(400, f"Invalid LFS oid for {path}")
                    blob = self.blobs / sha
                    if not blob.is_file():
                        raise HubError(422, f"LFS object {sha} for {path} was not uploaded")
                    real = blob.stat().st_size
                    if size is not None and int(size) != real:
                        raise HubError(
                            422, f"LFS object size mismatch for {path}: {size} != {real}"
                        )
                    tree[path] = {
                        "sha256": sha,
                        "size": real,
                        "lfs": True,
                        "gitOid": git_blob_sha1(lfs_pointer(sha, real)),
                    }
                elif key == "deletedFile":
                    if path not in tree:
                        raise HubError(
                            404, f"A file with this name doesn't exist: {path}", "EntryNotFound"
                        )
                    del tree[path]
                elif key == "deletedFolder":
                    prefix = path.rstrip("/") + "/"
                    doomed = [p for p in tree if p.startswith(prefix)]
                    if not doomed:
                        raise HubError(
                            404, f"A folder with this name doesn't exist: {path}", "EntryNotFound"
                        )
                    for p in doomed:
                        del tree[p]
                else:
                    raise HubError(400, f"Unknown commit operation {key!r}")
            oid = self._write_commit(
                repo,
                parents=[head],
                tree=tree,
                title=header.get("summary") or "Commit",
                message=header.get("description") or "",
            )
            repo.branches[branch] = oid
            self._save_repo(repo)
            return oid


def _check_path(path: str) -> None:
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in path.split("/")):
        raise HubError(400, f"Invalid path in repo: {path!r}")
    if path.startswith(".git/") or "/.git/" in path:
        raise HubError(400, f"Invalid path in repo: {path!r}")


def tree_listing(tree: dict, path: str, *, recursive: bool) -> list[dict]:
    """Files and folders under `path` (immediate children, or all with `recursive`)."""
    prefix = path.strip("/")
    if prefix and prefix in tree:
        raise HubError(404, f"{prefix} is a file, not a directory", "EntryNotFound")
    base = prefix + "/" if prefix else ""
    files: dict[str, dict] = {}
    folders: set[str] = set()
    for p, entry in tree.items():
        if not p.startswith(base):
            continue
        rest = p[len(base) :].split("/")
        for i in range(1, len(rest)):
            if recursive or i == 1:
                folders.add(base + "/".join(rest[:i]))
        if recursive or len(rest) == 1:
            files[p] = entry
    if prefix and not files and not folders:
        raise HubError(404, f"Entry {prefix!r} not found", "EntryNotFound")
    out = [{"type": "directory", "oid": _folder_oid(tree, f), "path": f} for f in sorted(folders)]
    out += [file_info(p, e) for p, e in sorted(files.items())]
    out.sort(key=lambda d: d["path"])
    return out


def _folder_oid(tree: dict, folder: str) -> str:
    base = folder + "/"
    h = hashlib.sha1(b"tree\0")
    for p in sorted(p for p in tree if p.startswith(base)):
        h.update(f"{p[len(base) :]}\0{tree[p]['gitOid']}\n".encode())
    return h.hexdigest()


def file_info(path: str, entry: dict) -> dict:
    info = {"type": "file", "oid": entry["gitOid"], "size": entry["size"], "path": path}
    if entry["lfs"]:
        info["lfs"] = {
            "oid": entry["sha256"],
            "size": entry["size"],
            "pointerSize": len(lfs_pointer(entry["sha256"], entry["size"])),
        }
    return info


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "LocalHub/1"

    hub: "LocalHub"  # set on the subclass
    role: str  # "hub" or "cdn"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep stderr quiet
        pass

    # ---- plumbing ------------------------------------------------------
    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size_line = self.rfile.readline().strip()
                size = int(size_line.split(b";")[0] or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        ctype: str | None = None,
    ):
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers, "application/json; charset=utf-8")

    def _error(self, err: HubError) -> None:
        headers = {"X-Error-Message": err.message.encode("ascii", "replace").decode()}
        if err.code:
            headers["X-Error-Code"] = err.code
        self._json(err.status, {"error": err.message, **err.extra}, headers)

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip() or None
        return None

    def _require_write(self) -> None:
        token = self._token()
        state = self.hub.state
        if token is None:
            raise HubError(401, "Invalid username or password.")
        if state.tokens is not None and token not in state.tokens:
            raise HubError(401, "Invalid credentials in Authorization header")

    def _can_read(self, repo: Repo) -> None:
        if not repo.private:
            return
        token = self._token()
        state = self.hub.state
        if token is None or (state.tokens is not None and token not in state.tokens):
            raise HubError(401, f"Repository {repo.id!r} not found", "RepoNotFound")

    def _dispatch(self) -> None:
        split = urlsplit(self.path)
        self.query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        segments = [unquote(s) for s in split.path.split("/")[1:]]
        with self.hub.state.lock:
            self.hub.state.requests.append((self.command, split.path))
            failures = self.hub.state.failures
            injected = next(
                (f for f in failures if f[0] == self.command and f[1].fullmatch(split.path)), None
            )
            if injected is not None:
                failures.remove(injected)
        body = self._read_body() if self.command in ("POST", "PUT", "DELETE") else b""
        if injected is not None:
            return self._error(
                HubError(injected[2], f"Injected failure for {self.command} {split.path}")
            )
        try:
            if self.role == "cdn":
                self._route_cdn(segments, body)
            else:
                self._route_hub(segments, split.path, body)
        except HubError as err:
            self._error(err)
        except (ValueError, KeyError) as err:
            self._error(HubError(400, f"Bad request: {err}"))

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _dispatch

    # ---- CDN origin (LFS storage) ------------------------------------------
    def _route_cdn(self, seg: list[str], body: bytes) -> None:
        state = self.hub.state
        if len(seg) == 2 and seg[0] == "lfs-upload" and self.command == "PUT":
            sha = seg[1]
            if not self.hub.check_signature(f"upload:{sha}", self.query.get("sig", "")):
                raise HubError(403, "Invalid or missing upload signature")
            if hashlib.sha256(body).hexdigest() != sha:
                raise HubError(400, f"Uploaded content does not match oid {sha}")
            state.put_blob(body)
            self._send(200, b"", {"ETag": f'"{hashlib.md5(body).hexdigest()}"'})
            return
        if len(seg) == 2 and seg[0] == "lfs-blobs" and self.command in ("GET", "HEAD"):
            sha = seg[1]
            if not _HEX64.match(sha) or not state.has_blob(sha):
                raise HubError(404, "Not found")
            data = state.read_blob(sha)
            self._send_content(data, {"ETag": f'"{sha}"'}, "application/octet-stream")
            return
        raise HubError(404, f"No route for {self.command} {self.path}")

    def _send_content(self, data: bytes, headers: dict[str, str], ctype: str) -> None:
        headers = dict(headers)
        headers["Accept-Ranges"] = "bytes"
        rng = self.headers.get("Range")
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng or "")
        if m and self.command == "GET":
            start = int(m.group(1))
            end = int(m.group(2)) if m.group(2) else len(data) - 1
            if start >= len(data):
                self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                return
            end = min(end, len(data) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            self._send(206, data[start : end + 1], headers, ctype)
            return
        self._send(200, data, headers, ctype)

    # ---- Hub origin ----------------------------------------------------------
    def _route_hub(self, seg: list[str], raw_path: str, body: bytes) -> None:
        state = self.hub.state
        m = self.command
        if seg[:1] == ["api"]:
            api = seg[1:]
            if api == ["repos", "create"] and m == "POST":
                return self._create_repo(body)
            if api == ["repos", "delete"] and m == "DELETE":
                self._require_write()
                payload = json.loads(body or b"{}")
                repo_id = f"{payload.get('organization') or state.user}/{payload.get('name')}"
                state.delete_repo(payload.get("type") or "model", repo_id)
                return self._json(200, {})
            if api == ["validate-yaml"] and m == "POST":
                return self._validate_yaml(body)
            if api == ["whoami-v2"] and m == "GET":
                return self._whoami()
            if len(api) == 3 and api[0] == "organizations" and api[2] == "overview" and m == "GET":
                return self._json(200, state.org_overview(api[1]))
            if len(api) >= 3 and api[0] in PLURAL_TO_TYPE:
                repo_type = PLURAL_TO_TYPE[api[0]]
                repo_id = f"{api[1]}/{api[2]}"
                # Keep the raw (still quoted) remainder: revisions are quoted with safe="".
                raw_rest = raw_path.split("/")[5:]
                return self._repo_api(repo_type, repo_id, api[3:], raw_rest, body)
            raise HubError(404, f"No route for {m} {raw_path}")

        # Git LFS batch API: /{prefix}{ns}/{name}.git/info/lfs/objects/{batch|verify}
        repo_type, rest = "model", seg
        if seg and seg[0] in PREFIX_TO_TYPE:
            repo_type, rest = PREFIX_TO_TYPE[seg[0]], seg[1:]
        if (
            len(rest) == 6
            and rest[1].endswith(".git")
            and rest[2:5] == ["info", "lfs", "objects"]
            and m == "POST"
        ):
            repo = state.get_repo(repo_type, f"{rest[0]}/{rest[1][:-4]}")
            return self._lfs(repo, rest[5], body)
        # Downloads: /{prefix}{ns}/{name}/resolve/{rev}/{path...}
        if len(rest) >= 5 and rest[2] == "resolve" and m in ("GET", "HEAD"):
            repo = state.get_repo(repo_type, f"{rest[0]}/{rest[1]}")
            self._can_read(repo)
            return self._resolve(repo, rest[3], "/".join(rest[4:]))
        raise HubError(404, f"No route for {m} {raw_path}")

    def _create_repo(self, body: bytes) -> None:
        self._require_write()
        payload = json.loads(body or b"{}")
        repo_type = payload.get("type") or "model"
        if repo_type not in REPO_TYPES:
            raise HubError(400, f"Invalid repo type {repo_type!r}")
        name = payload.get("name") or ""
        ns = payload.get("organization") or self.hub.state.user
        private = payload.get("private") or payload.get("visibility") == "private"
        repo, created = self.hub.state.create_repo(repo_type, f"{ns}/{name}", private=bool(private))
        url = f"{self.hub.endpoint}/{URL_PREFIX[repo_type]}{repo.id}"
        if not created:
            # Like the Hub, the conflict answer carries the url (create_repo(exist_ok=True) reads it).
            raise HubError(409, f"You already created this {repo_type} repo", extra={"url": url})
        self._json(200, {"url": url, "name": repo.id, "id": repo.id})

    def _validate_yaml(self, body: bytes) -> None:
        content = json.loads(body or b"{}").get("content", "")
        errors = []
        if content.startswith("---"):
            lines = content.splitlines()
            if "---" not in (line.rstrip() for line in lines[1:]):
                errors.append({"message": "README.md front matter is not closed with '---'"})
        if errors:
            self._json(400, {"errors": errors, "warnings": []})
        else:
            self._json(200, {"errors": [], "warnings": []})

    def _whoami(self) -> None:
        token = self._token()
        state = self.hub.state
        if token is None or (state.tokens is not None and token not in state.tokens):
            raise HubError(401, "Invalid credentials in Authorization header")
        self._json(
            200,
            {
                "type": "user",
                "id": "0" * 24,
                "name": state.user,
                "fullname": state.user,
                "orgs": [
                    {"type": "org", "name": o, "roleInOrg": "admin"} for o in sorted(state.orgs)
                ],
                "auth": {
                    "type": "access_token",
                    "accessToken": {"displayName": "local", "role": "write"},
                },
            },
        )

    def _repo_api(
        self, repo_type: str, repo_id: str, rest: list[str], raw_rest: list[str], body: bytes
    ) -> None:
        state = self.hub.state
        m = self.command
        repo = state.get_repo(repo_type, repo_id)
        self._can_read(repo)
        action = rest[0] if rest else ""
        # The revision is a single (quoted) path segment.
        rev = unquote(raw_rest[1]) if len(raw_rest) > 1 else None
        sub = "/".join(unquote(s) for s in raw_rest[2:])

        if action == "" and m == "GET":
            return self._json(200, self._repo_info(repo, "main"))
        if action == "revision" and rev and m == "GET":
            return self._json(200, self._repo_info(repo, rev))
        if action == "refs" and m == "GET":
            return self._json(
                200,
                {
                    "branches": [
                        {"name": b, "ref": f"refs/heads/{b}", "targetCommit": o}
                        for b, o in sorted(repo.branches.items())
                    ],
                    "tags": [
                        {"name": t, "ref": f"refs/tags/{t}", "targetCommit": o}
                        for t, o in sorted(repo.tags.items())
                    ],
                    "converts": [],
                    "pullRequests": [],
                },
            )
        if action == "branch" and rev:
            self._require_write()
            if m == "POST":
                payload = json.loads(body or b"{}")
                state.create_branch(repo, rev, payload.get("startingPoint"))
                return self._json(200, {})
            if m == "DELETE":
                state.delete_branch(repo, rev)
                return self._json(200, {})
        if action == "tree" and rev and m == "GET":
            oid = state.resolve(repo, rev)
            tree = state.commit(repo, oid)["tree"]
            recursive = self.query.get("recursive", "false").lower() in ("1", "true")
            items = tree_listing(tree, sub, recursive=recursive)
            return self._paged(items)
        if action == "paths-info" and rev and m == "POST":
            oid = state.resolve(repo, rev)
            tree = state.commit(repo, oid)["tree"]
            form = parse_qs(body.decode())
            out = []
            for p in form.get("paths", []):
                p = p.strip("/")
                if p in tree:
                    out.append(file_info(p, tree[p]))
                elif any(k.startswith(p + "/") for k in tree):
                    out.append({"type": "directory", "oid": _folder_oid(tree, p), "path": p})
            return self._json(200, out)
        if action == "commits" and rev and m == "GET":
            oid = state.resolve(repo, rev)
            items = [
                {
                    "id": c["id"],
                    "title": c["title"],
                    "message": c["message"],
                    "date": c["date"],
                    "authors": [{"user": c["author"]}],
                    "parents": c["parents"],
                }
                for c in state.history(repo, oid)
            ]
            return self._paged(items)
        if action == "preupload" and rev and m == "POST":
            self._require_write()
            return self._preupload(repo, rev, json.loads(body or b"{}"))
        if action == "commit" and rev and m == "POST":
            self._require_write()
            if self.query.get("create_pr") in ("1", "true", "True"):
                raise HubError(400, "Pull requests are not supported by the local hub")
            lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
            if not lines or lines[0].get("key") != "header":
                raise HubError(400, "The first line of a commit must be its header")
            oid = state.apply_commit(repo, rev, lines[1:], lines[0].get("value") or {})
            url = f"{self.hub.endpoint}/{URL_PREFIX[repo.type]}{repo.id}/commit/{oid}"
            return self._json(
                200, {"success": True, "commitOid": oid, "commitUrl": url, "hookOutput": ""}
            )
        if action.startswith("xet-") and action.endswith("-token"):
            raise HubError(
                501,
                "The local hub does not implement Xet storage; set HF_HUB_DISABLE_XET=1 to use the LFS protocol",
            )
        raise HubError(404, f"No route for {m} {self.path}")

    def _paged(self, items: list) -> None:
        size = self.hub.state.page_size
        start = int(self.query.get("cursor", "0") or 0)
        page = items[start : start + size]
        headers = {}
        if start + size < len(items):
            split = urlsplit(self.path)
            q = {k: v for k, v in self.query.items() if k != "cursor"}
            q["cursor"] = str(start + size)
            qs = "&".join(f"{quote(k)}={quote(v)}" for k, v in q.items())
            headers["Link"] = f'<{self.hub.endpoint}{split.path}?{qs}>; rel="next"'
        self._json(200, page, headers)

    def _repo_info(self, repo: Repo, rev: str) -> dict:
        state = self.hub.state
        oid = state.resolve(repo, rev)
        c = state.commit(repo, oid)
        return {
            "_id": hashlib.sha1(repo.id.encode()).hexdigest()[:24],
            "id": repo.id,
            "author": repo.id.split("/")[0],
            "sha": oid,
            "lastModified": c["date"],
            "createdAt": repo.created_at,
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": [{"rfilename": p} for p in sorted(c["tree"])],
        }

    def _preupload(self, repo: Repo, rev: str, payload: dict) -> None:
        state = self.hub.state
        oid = state.resolve(repo, rev)
        tree = state.commit(repo, oid)["tree"]
        patterns = state.gitattributes_lfs_patterns(repo, oid)
        files = []
        for f in payload.get("files", []):
            path = f["path"]
            sample = base64.b64decode(f.get("sample", ""))
            size = int(f.get("size", 0))
            name = path.rsplit("/", 1)[-1]
            is_lfs = (
                size >= LFS_SIZE_THRESHOLD
                or looks_binary(sample)
                or any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(name, p) for p in patterns)
            )
            existing = tree.get(path)
            remote_oid = None
            if existing is not None:
                remote_oid = existing["sha256"] if existing["lfs"] else existing["gitOid"]
            files.append(
                {
                    "path": path,
                    "uploadMode": "lfs" if is_lfs else "regular",
                    "shouldIgnore": False,
                    "oid": remote_oid,
                }
            )
        self._json(200, {"files": files, "commitOid": oid})

    def _lfs(self, repo: Repo, op: str, body: bytes) -> None:
        self._require_write()
        state = self.hub.state
        payload = json.loads(body or b"{}")
        if op == "batch":
            if payload.get("operation") != "upload":
                raise HubError(400, "Only LFS uploads are supported")
            objects = []
            for obj in payload.get("objects", []):
                sha, size = obj.get("oid", ""), obj.get("size")
                if not _HEX64.match(sha) or not isinstance(size, int):
                    objects.append(
                        {
                            "oid": str(sha),
                            "size": int(size or 0),
                            "error": {"code": 422, "message": "Invalid oid"},
                        }
                    )
                    continue
                entry: dict[str, Any] = {"oid": sha, "size": size, "authenticated": True}
                if not state.has_blob(sha, size):
                    sig = self.hub.sign(f"upload:{sha}")
                    verify = f"{self.hub.endpoint}/{URL_PREFIX[repo.type]}{repo.id}.git/info/lfs/objects/verify"
                    entry["actions"] = {
                        "upload": {
                            "href": f"{self.hub.cdn_endpoint}/lfs-upload/{sha}?sig={sig}",
                            "header": {},
                        },
                        "verify": {"href": verify, "header": {}},
                    }
                objects.append(entry)
            return self._json(
                200,
                {"transfer": "basic", "objects": objects},
                {"Content-Type": "application/vnd.git-lfs+json"},
            )
        if op == "verify":
            sha, size = payload.get("oid", ""), payload.get("size")
            if not _HEX64.match(sha) or not state.has_blob(sha, size):
                raise HubError(404, f"LFS object {sha} not found")
            return self._json(200, {})
        raise HubError(404, f"Unknown LFS operation {op!r}")

    def _resolve(self, repo: Repo, rev: str, path: str) -> None:
        state = self.hub.state
        oid = state.resolve(repo, rev)
        entry = state.commit(repo, oid)["tree"].get(path)
        if entry is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
        headers = {"X-Repo-Commit": oid, "ETag": f'"{entry["gitOid"]}"'}
        if entry["lfs"]:
            # Like the Hub: a redirect to the storage origin, carrying the linked metadata.
            headers["X-Linked-Etag"] = f'"{entry["sha256"]}"'
            headers["X-Linked-Size"] = str(entry["size"])
            headers["Location"] = f"{self.hub.cdn_endpoint}/lfs-blobs/{entry['sha256']}"
            self._send(302, b"", headers)
            return
        data = state.read_blob(entry["sha256"])
        self._send_content(data, headers, "application/octet-stream")


class LocalHub:
    """Start/stop the local Hub. Usage::

    hub = LocalHub(tmp_path / "hub").start()
    hub.set_org("my-org", trusted=True)
    env["HF_ENDPOINT"] = hub.endpoint
    ...
    hub.stop()
    """

    def __init__(
        self,
        root: str | Path,
        *,
        host: str = "127.0.0.1",
        user: str = "local-user",
        tokens: set[str] | None = None,
        page_size: int = 1000,
    ):
        self.state = HubState(Path(root), user=user, tokens=tokens, page_size=page_size)
        self.host = host
        self._secret = secrets.token_bytes(16)
        self._servers: list[ThreadingHTTPServer] = []
        self._threads: list[threading.Thread] = []
        self.endpoint = ""
        self.cdn_endpoint = ""

    # ---- lifecycle -----------------------------------------------------
    def _make_server(self, role: str) -> ThreadingHTTPServer:
        handler = type(f"_{role.title()}Handler", (_Handler,), {"hub": self, "role": role})
        server = ThreadingHTTPServer((self.host, 0), handler)
        server.daemon_threads = True
        return server

    def start(self) -> "LocalHub":
        if self._servers:
            return self
        hub_srv, cdn_srv = self._make_server("hub"), self._make_server("cdn")
        self._servers = [hub_srv, cdn_srv]
        self.endpoint = f"http://{self.host}:{hub_srv.server_address[1]}"
        self.cdn_endpoint = f"http://{self.host}:{cdn_srv.server_address[1]}"
        for srv in self._servers:
            t = threading.Thread(
                target=srv.serve_forever, name=f"localhub-{srv.server_address[1]}", daemon=True
            )
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()
        for t in self._threads:
            t.join(timeout=5)
        self._servers, self._threads = [], []

    def __enter__(self) -> "LocalHub":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- signed CDN urls -----------------------------------------------
    def sign(self, what: str) -> str:
        return hashlib.sha256(self._secret + what.encode()).hexdigest()[:32]

    def check_signature(self, what: str, sig: str) -> bool:
        return secrets.compare_digest(self.sign(what), sig)

    # ---- test helpers --------------------------------------------------
    def set_org(self, name: str, *, trusted: bool = False) -> None:
        """Declare an organization and whether it is a trusted kernel publisher."""
        self.state.set_org(name, trusted=trusted)

    def branches(self, repo_id: str, repo_type: str = "kernel") -> dict[str, str]:
        with self.state.lock:
            return dict(self.state.get_repo(repo_type, repo_id).branches)

    def files(
        self, repo_id: str, revision: str = "main", repo_type: str = "kernel"
    ) -> dict[str, bytes]:
        """{path: content} of a revision, read from the store."""
        with self.state.lock:
            repo = self.state.get_repo(repo_type, repo_id)
            tree = self.state.commit(repo, self.state.resolve(repo, revision))["tree"]
            return {p: self.state.read_blob(e["sha256"]) for p, e in tree.items()}

    def commit_info(self, repo_id: str, revision: str, repo_type: str = "kernel") -> dict:
        with self.state.lock:
            repo = self.state.get_repo(repo_type, repo_id)
            return dict(self.state.commit(repo, self.state.resolve(repo, revision)))

    def commit_count(self, repo_id: str, repo_type: str = "kernel") -> int:
        with self.state.lock:
            repo = self.state.get_repo(repo_type, repo_id)
            return sum(1 for _ in (repo.path / "commits").glob("*.json"))

    def lfs_paths(self, repo_id: str, revision: str, repo_type: str = "kernel") -> set[str]:
        with self.state.lock:
            repo = self.state.get_repo(repo_type, repo_id)
            tree = self.state.commit(repo, self.state.resolve(repo, revision))["tree"]
            return {p for p, e in tree.items() if e["lfs"]}

    def fail_next(self, method: str, path_pattern: str, status: int = 500) -> None:
        """Answer the next `method` request whose path fully matches `path_pattern` with `status`."""
        with self.state.lock:
            self.state.failures.append((method, re.compile(path_pattern), status))

    def requests_log(self) -> list[tuple[str, str]]:
        with self.state.lock:
            return list(self.state.requests)

    def clear_requests(self) -> None:
        with self.state.lock:
            self.state.requests.clear()

    def wipe(self) -> None:
        """Remove every repo and blob (keeps organizations)."""
        with self.state.lock:
            self.state.repos.clear()
            self.state._commits.clear()
            shutil.rmtree(self.state.root / "repos", ignore_errors=True)
            (self.state.root / "repos").mkdir()


def main() -> None:  # pragma: no cover - manual use
    import argparse
    import tempfile
    import time

    ap = argparse.ArgumentParser(description="Run the local test Hub")
    ap.add_argument("--root", default=None)
    ap.add_argument(
        "--trusted", action="append", default=[], help="trusted kernel publisher org (repeatable)"
    )
    args = ap.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="localhub-")
    hub = LocalHub(root).start()
    for org in args.trusted:
        hub.set_org(org, trusted=True)
    print(f"HF_ENDPOINT={hub.endpoint}  (store: {root})", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        hub.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
