#!/usr/bin/env python3
"""Upload a kernel's build/ to the Hugging Face Hub as a `kernel` repository.

Repository layout (as kernel-builder publishes it):

    main      README.md               <- build/CARD.md, naming the repository uploaded to
    v<N>      build/<variant>/...     <- build/<variant>/ (every file of the variant)
              README.md               <- the same card, on a new branch
              benchmarks/benchmark*.py <- build/benchmarks/ (or <kernel>/benchmarks/)

The repository is `<org>/<name>`: `--repo-id`, else `--org` / `KERNELS_ORG` with the
name from build.toml, else `[general.hub] repo-id`. The branch is `--branch`, else
`[general.hub] branch`, else `v<version>`.

On an existing branch only the variants being uploaded are replaced (files inside those
variant directories that are no longer produced are deleted); other variants stay. A new
branch starts from `main`, and anything under build/ and benchmarks/ that is not uploaded
is removed from it. Content is compared with the Hub first, so uploading the same build
twice makes no commit ("no changes").

Before anything is sent, every variant is checked: metadata.json must parse as the loader
parses it, the build must not be dirty (`provenance.kernel.dirty`, or an id ending in
`_dirty`), its digest must match a recomputed one, and its version must equal build.toml's.
Every shared object must pass kernel-abi-check (manylinux_2_28, abi3): local builds usually do
not, releases come from Nix. `--allow-dirty`, `--allow-digest-mismatch`,
`--allow-version-mismatch` and `--allow-abi-violations` relax these.

An upload lands whole or changes nothing: large files go to storage first, then the version
branch gets one commit (a new branch is created from main's head just before it) and main's
README comes last; each commit names its parent commit, and when a step fails the branch is put
back where it was; a repository the failed upload created is deleted again.

`--dry-run` prints the plan. When the Hub cannot be reached it plans from the build alone and
lists what it could not check (existing branches and files, write access) and why.

The token comes from `--token`, else the usual huggingface_hub sources (HF_TOKEN, the saved
token file); it is never printed. The Hub endpoint comes from HF_ENDPOINT (or --endpoint).

Exit status: 0 on success (including "no changes" and --dry-run), 1 on any error.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # build.py: the ABI check it runs
COMMIT_BATCH = 1000
DEFAULT_MESSAGE = "Uploaded using scripts/upload.py"


class UploadError(Exception):
    """A failure reported as a single line on stderr."""


# --------------------------------------------------------------------------------------
# Local build inspection
# --------------------------------------------------------------------------------------


@dataclass
class LocalFile:
    source: Path | bytes  # a file, or content made here (the card rewritten for its repository)
    size: int
    sha256: str
    git_oid: str

    @classmethod
    def from_bytes(cls, data: bytes, source: Path | None = None) -> "LocalFile":
        return cls(
            source=data if source is None else source,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            git_oid=hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
        )

    @classmethod
    def from_path(cls, path: Path) -> "LocalFile":
        return cls.from_bytes(path.read_bytes(), path)

    def payload(self) -> str | bytes:
        """What CommitOperationAdd takes: a path, or the bytes themselves."""
        return self.source if isinstance(self.source, bytes) else str(self.source)

    def same_as(self, remote) -> bool:
        """Whether a huggingface_hub RepoFile has this content."""
        if getattr(remote, "lfs", None) is not None:
            return remote.lfs.sha256 == self.sha256
        return remote.blob_id == self.git_oid


@dataclass
class Variant:
    name: str
    path: Path
    metadata: dict
    files: dict[str, LocalFile] = field(default_factory=dict)  # variant-relative path -> file
    warnings: list[str] = field(default_factory=list)

    @property
    def version(self):
        return self.metadata.get("version")


def _variant_files(variant_dir: Path) -> dict[str, LocalFile]:
    """Every regular file (symlinks followed), minus bytecode: what the digest covers, plus metadata."""
    files: dict[str, LocalFile] = {}
    for root, dirs, names in os.walk(variant_dir, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith(".pyc"):
                continue
            path = Path(root) / name
            if not path.is_file():
                continue
            rel = path.relative_to(variant_dir).as_posix()
            files[rel] = LocalFile.from_path(path)
    return files


def read_build_toml(kernel_dir: Path) -> dict:
    path = kernel_dir / "build.toml"
    if not path.is_file():
        raise UploadError(f"{kernel_dir.name}: no build.toml in {kernel_dir}")
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise UploadError(f"{kernel_dir.name}: cannot parse {path}: {e}") from None
    general = data.get("general") or {}
    hub = general.get("hub") or {}
    if "name" not in general:
        raise UploadError(f"{kernel_dir.name}: build.toml has no [general] name")
    return {
        "name": general["name"],
        "version": general.get("version"),
        "repo_id": hub.get("repo-id"),
        "branch": hub.get("branch"),
    }


def discover_variants(build_dir: Path, wanted: list[str] | None, kernel: str) -> list[Path]:
    if not build_dir.is_dir():
        raise UploadError(
            f"{kernel}: build directory {build_dir} does not exist (build the kernel first)"
        )
    found = {
        p.name: p
        for p in sorted(build_dir.iterdir())
        if p.is_dir() and (p / "metadata.json").is_file()
    }
    if wanted:
        missing = [v for v in wanted if v not in found]
        if missing:
            raise UploadError(
                f"{kernel}: variant {missing[0]} not found in {build_dir} "
                f"(available: {', '.join(found) or 'none'})"
            )
        return [found[v] for v in dict.fromkeys(wanted)]
    if not found:
        raise UploadError(
            f"{kernel}: no build variants (directories with metadata.json) in {build_dir}"
        )
    return list(found.values())


def _digest_problems(variant_dir: Path, digest: dict) -> list[str]:
    from kernels._rust import Digest, DigestAlgorithm

    algorithm = str(digest.get("algorithm", "")).lower()
    algorithms = {"sha256": DigestAlgorithm.SHA256, "sha512": DigestAlgorithm.SHA512}
    if algorithm not in algorithms:
        return [f"unsupported digest algorithm {digest.get('algorithm')!r}"]
    expected = digest.get("files") or {}
    actual = Digest.hash_variant(algorithms[algorithm], variant_dir).files
    problems = []
    for rel in sorted(set(expected) | set(actual)):
        if rel not in actual:
            problems.append(f"{rel} is in the digest but missing")
        elif rel not in expected:
            problems.append(f"{rel} is not in the digest")
        elif expected[rel] != actual[rel]:
            problems.append(f"{rel} has a different hash")
    return problems


def check_variant(
    variant_dir: Path, build: dict, args: argparse.Namespace
) -> tuple[Variant | None, list[str]]:
    """Returns the variant and a list of refusal reasons (empty when it may be uploaded)."""
    from kernels._rust import Metadata
    from kernels.variants import parse_variant

    name = variant_dir.name
    problems: list[str] = []
    try:
        parse_variant(name)
    except ValueError as e:
        problems.append(
            f"directory name does not parse as a build variant, the loader would ignore it ({e})"
        )

    meta_path = variant_dir / "metadata.json"
    try:
        raw = json.loads(meta_path.read_text())
        Metadata.from_bytes(meta_path.read_bytes())
    except (ValueError, OSError) as e:
        return None, problems + [f"metadata.json is invalid: {str(e).splitlines()[0]}"]
    variant = Variant(name=name, path=variant_dir, metadata=raw)

    if raw.get("name") != build["name"]:
        problems.append(f"metadata name {raw.get('name')!r} is not build.toml's {build['name']!r}")

    provenance = raw.get("provenance") or {}
    kernel_prov = provenance.get("kernel") or {}
    dirty = kernel_prov.get("dirty") is True or str(raw.get("id", "")).endswith("_dirty")
    if dirty and not args.allow_dirty:
        problems.append(
            f"dirty build (id {raw.get('id')!r}"
            f"{', provenance.kernel.dirty = true' if kernel_prov.get('dirty') is True else ''}); "
            "rebuild from a clean, committed tree or pass --allow-dirty"
        )

    if (
        build["version"] is not None
        and raw.get("version") != build["version"]
        and not args.allow_version_mismatch
    ):
        problems.append(
            f"metadata version {raw.get('version')} differs from build.toml version {build['version']}; "
            "rebuild or pass --allow-version-mismatch"
        )

    digest = raw.get("digest")
    if not args.allow_digest_mismatch:
        if not digest:
            problems.append(
                "metadata.json has no digest; rebuild (or hash the variant) or pass --allow-digest-mismatch"
            )
        else:
            bad = _digest_problems(variant_dir, digest)
            if bad:
                more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
                problems.append(
                    f"digest mismatch: {'; '.join(bad[:3])}{more}; rebuild or pass --allow-digest-mismatch"
                )

    variant.files = _variant_files(variant_dir)
    for finding in abi_findings(variant_dir, variant.files):
        if args.allow_abi_violations:
            variant.warnings.append(
                f"ABI check failed, uploading anyway (--allow-abi-violations): {finding}"
            )
        else:
            problems.append(
                f"ABI check failed: {finding}; this build is not publishable: releases come from Nix, whose "
                "toolchain is manylinux_2_28 (README.md, Releases with Nix); --allow-abi-violations uploads it anyway"
            )
    return variant, problems


def abi_findings(variant_dir: Path, files: dict[str, LocalFile]) -> list[str]:
    """kernel-abi-check's manylinux_2_28 / abi3 findings for every shared object of the variant.

    Checked here rather than trusted from the build: the build may come from elsewhere (--build-dir)
    and a local build only reports its findings, it does not fail on them.
    """
    from build import check_abi

    findings = []
    for rel in sorted(r for r in files if r.endswith(".so")):
        try:
            found = check_abi(variant_dir / rel)
        except Exception as e:  # noqa: BLE001 - an unreadable object is a finding, not a crash
            found = [f"not readable as a shared object ({type(e).__name__}: {e})"]
        findings += [f"{rel}: {f}" for f in found]
    return findings


def card_for_repo(card: Path, rendered_for: str | None, repo_id: str) -> LocalFile | None:
    """build/CARD.md, telling users to load `repo_id` rather than the repository it was rendered for.

    The build renders the card for build.toml's repo-id; uploaded with --org or --repo-id to another
    repository, every `get_kernel("...")` and `kernels benchmark ...` line in it would name the
    wrong one.
    """
    if not card.is_file():
        return None
    data = card.read_bytes()
    if rendered_for and rendered_for != repo_id:
        pattern = re.compile(rb"(?<![\w.-])" + re.escape(rendered_for.encode()) + rb"(?![\w-])")
        data = pattern.sub(repo_id.encode(), data)
    return LocalFile.from_bytes(data)


def benchmark_files(build_dir: Path, kernel_dir: Path) -> dict[str, LocalFile]:
    """`benchmarks/benchmark*.py` of the build (bundle layout), else of the kernel folder."""
    for bench_dir in (build_dir / "benchmarks", kernel_dir / "benchmarks"):
        if bench_dir.is_dir():
            return {
                f"benchmarks/{p.name}": LocalFile.from_path(p)
                for p in sorted(bench_dir.glob("benchmark*.py"))
                if p.is_file()
            }
    return {}


# --------------------------------------------------------------------------------------
# Planning against the Hub
# --------------------------------------------------------------------------------------


@dataclass
class BranchPlan:
    branch: str
    exists: bool
    base: str | None  # commit the changes apply to (branch head, or main's head for a new branch)
    add: list[str] = field(default_factory=list)
    replace: list[str] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    sources: dict[str, LocalFile] = field(default_factory=dict)
    commit: str | None = None

    @property
    def changed(self) -> bool:
        return bool(self.add or self.replace or self.delete)

    def to_json(self) -> dict:
        return {
            "exists": self.exists,
            "add": self.add,
            "replace": self.replace,
            "delete": self.delete,
            "unchanged": len(self.unchanged),
            "commit": self.commit,
        }


def _remote_files(api, repo_id: str, revision: str | None) -> dict:
    if revision is None:
        return {}
    from huggingface_hub.hf_api import RepoFile

    return {
        f.path: f
        for f in api.list_repo_tree(repo_id, recursive=True, revision=revision, repo_type="kernel")
        if isinstance(f, RepoFile)
    }


def plan_branch(
    branch: str,
    exists: bool,
    base: str | None,
    local: dict[str, LocalFile],
    remote: dict,
    owned: callable,
) -> BranchPlan:
    """Diff `local` against `remote`; remote files for which `owned(path)` holds and that are not
    produced any more are deleted."""
    plan = BranchPlan(branch=branch, exists=exists, base=base, sources=local)
    for path, lf in sorted(local.items()):
        if path not in remote:
            plan.add.append(path)
        elif lf.same_as(remote[path]):
            plan.unchanged.append(path)
        else:
            plan.replace.append(path)
    plan.delete = sorted(p for p in remote if p not in local and owned(p))
    return plan


def _is_benchmark(path: str) -> bool:
    p = PurePosixPath(path)
    return (
        len(p.parts) == 2
        and p.parts[0] == "benchmarks"
        and p.name.startswith("benchmark")
        and p.suffix == ".py"
    )


def print_plan(plans: list[BranchPlan], out) -> None:
    for plan in plans:
        if plan.exists:
            state = "existing"
        elif plan.branch == "main":
            state = "new repository"
        else:
            state = "new, from main"
        print(f"branch {plan.branch} ({state}):", file=out)
        for kind in ("add", "replace", "delete"):
            for path in getattr(plan, kind):
                print(f"  {kind:<8}{path}", file=out)
        if plan.unchanged:
            print(f"  ({len(plan.unchanged)} unchanged)", file=out)
        if not plan.changed:
            print("  no changes", file=out)


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


def _scrub(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text


def _hub_error_line(err: Exception) -> str:
    response = getattr(err, "response", None)
    status = getattr(response, "status_code", None)
    server = getattr(err, "server_message", None)
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    detail = server.strip().splitlines()[0] if server else first
    return f"Hub request failed{f' ({status})' if status else ''}: {detail}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Upload a kernel's build/ to the Hugging Face Hub (repo type `kernel`).",
        epilog="Environment: HF_TOKEN (or the saved token), HF_ENDPOINT, KERNELS_ORG.",
    )
    ap.add_argument(
        "kernel", help="kernel folder (a path, or a folder name in the repository root)"
    )
    ap.add_argument(
        "--org",
        help="Hub organization (default: $KERNELS_ORG, else build.toml [general.hub] repo-id)",
    )
    ap.add_argument("--repo-id", help="full <org>/<name> repository id (overrides --org)")
    ap.add_argument(
        "--branch", help="target branch (default: build.toml [general.hub] branch, else v<version>)"
    )
    ap.add_argument("--build-dir", type=Path, help="build directory (default: <kernel>/build)")
    ap.add_argument(
        "--variant", action="append", metavar="NAME", help="upload only this variant (repeatable)"
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="print what would change on each branch; change nothing",
    )
    ap.add_argument("--allow-dirty", action="store_true", help="upload builds of a dirty tree")
    ap.add_argument(
        "--allow-version-mismatch",
        action="store_true",
        help="upload variants whose metadata version differs from build.toml",
    )
    ap.add_argument(
        "--allow-digest-mismatch",
        action="store_true",
        help="upload variants whose digest is missing or does not match their files",
    )
    ap.add_argument(
        "--allow-abi-violations",
        action="store_true",
        help="upload shared objects that fail kernel-abi-check (manylinux_2_28, abi3), with a warning",
    )
    ap.add_argument("--private", action="store_true", help="create the repository as private")
    ap.add_argument(
        "--token", help="Hub token (default: HF_TOKEN or the saved token); never printed"
    )
    ap.add_argument(
        "--endpoint", help="Hub endpoint (default: HF_ENDPOINT or https://huggingface.co)"
    )
    ap.add_argument("--message", default=DEFAULT_MESSAGE, help="commit message")
    ap.add_argument(
        "--output-json", type=Path, help="write a JSON summary of the result to this file"
    )
    ap.add_argument("-q", "--quiet", action="store_true", help="print only the result lines")
    return ap.parse_args(argv)


def resolve_kernel_dir(arg: str) -> Path:
    path = Path(arg)
    if not path.is_dir() and (REPO_ROOT / arg).is_dir():
        path = REPO_ROOT / arg
    if not path.is_dir():
        raise UploadError(f"{arg}: kernel folder not found")
    return path.resolve()


def resolve_repo_id(args: argparse.Namespace, build: dict) -> str:
    if args.repo_id:
        repo_id = args.repo_id
    else:
        name = build["repo_id"].split("/", 1)[-1] if build["repo_id"] else build["name"]
        org = args.org or os.environ.get("KERNELS_ORG")
        if org:
            repo_id = f"{org}/{name}"
        elif build["repo_id"]:
            repo_id = build["repo_id"]
        else:
            raise UploadError(
                f"{build['name']}: no organization: pass --org, set KERNELS_ORG or add [general.hub] repo-id to build.toml"
            )
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise UploadError(
            f"{build['name']}: invalid repository id {repo_id!r} (expected <org>/<name>)"
        )
    return repo_id


def run(args: argparse.Namespace, out, result: dict) -> int:
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=out))

    kernel_dir = resolve_kernel_dir(args.kernel)
    build = read_build_toml(kernel_dir)
    kernel = build["name"]
    result["kernel"] = kernel
    build_dir = (args.build_dir or kernel_dir / "build").resolve()

    # 1. Check every variant before talking to the Hub.
    variants: list[Variant] = []
    problems: list[str] = []
    for vdir in discover_variants(build_dir, args.variant, kernel):
        variant, issues = check_variant(vdir, build, args)
        problems += [f"{kernel}: variant {vdir.name}: {issue}" for issue in issues]
        if variant is not None:
            variants.append(variant)
    if problems:
        raise UploadError("\n".join(problems))

    versions = sorted({v.version for v in variants})
    branch = args.branch or build["branch"]
    if branch is None:
        if len(versions) != 1:
            raise UploadError(
                f"{kernel}: found multiple versions in build variants ({', '.join(map(str, versions))}); pass --branch"
            )
        branch = f"v{versions[0]}"
    repo_id = resolve_repo_id(args, build)
    result.update(repo_id=repo_id, branch=branch, variants=[v.name for v in variants])

    card = build_dir / "CARD.md"
    readme = card_for_repo(card, build["repo_id"], repo_id)
    main_local = {"README.md": readme} if readme else {}
    branch_local: dict[str, LocalFile] = {}
    for v in variants:
        for rel, lf in v.files.items():
            branch_local[f"build/{v.name}/{rel}"] = lf
    branch_local.update(benchmark_files(build_dir, kernel_dir))
    if branch == "main":
        # `--branch main` (kernels-community also publishes version-1 kernels there): one plan, README included.
        branch_local.update(main_local)
        main_local = {}

    for v in variants:
        for warning in v.warnings:
            print(f"warning: {kernel}: variant {v.name}: {warning}", file=sys.stderr)
    if branch != "main" and main_local:
        # A new version branch gets the card too: it may start from a main without it (see commit_all).
        branch_local.setdefault("README.md", main_local["README.md"])

    # 2. Hub state.
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import RepositoryNotFoundError

    if args.quiet:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()

    token = args.token or get_token()
    result["_token"] = token
    if token is None and not args.dry_run:
        raise UploadError(
            f"{kernel}: no Hugging Face token: set HF_TOKEN, run `hf auth login`, or pass --token"
        )
    api = HfApi(endpoint=args.endpoint, token=token)
    result["url"] = f"{api.endpoint}/kernels/{repo_id}"

    def refs() -> dict[str, str] | None:
        try:
            return {
                b.name: b.target_commit
                for b in api.list_repo_refs(repo_id, repo_type="kernel").branches
            }
        except RepositoryNotFoundError:
            return None

    try:
        branches = refs()
    except Exception as e:  # noqa: BLE001 - offline, DNS, proxy, refused connection...
        if not args.dry_run:
            raise
        return offline_plan(
            e, api.endpoint, repo_id, branch, main_local, branch_local, token, say, out, result
        )
    say(
        f"{kernel}: {len(variants)} variant(s) -> {repo_id} (kernel repo{'' if branches is not None else ', new'})"
    )
    for v in variants:
        say(f"  {v.name} (version {v.version}, id {v.metadata.get('id')}, {len(v.files)} files)")
    new_repo = branches is None
    branches = branches or {}

    main_head = branches.get("main")
    main_plan = plan_branch(
        "main",
        main_head is not None,
        main_head,
        main_local,
        _remote_files(api, repo_id, main_head) if main_local else {},
        lambda p: False,
    )
    exists = branch in branches
    base = branches[branch] if exists else main_head
    uploaded_prefixes = tuple(f"build/{v.name}/" for v in variants)
    if exists and branch != "main":
        branch_local.pop("README.md", None)  # an existing version branch keeps the card it has
    if exists:

        def owned(p: str) -> bool:
            return p.startswith(uploaded_prefixes) or _is_benchmark(p)
    else:

        def owned(p: str) -> bool:
            return p.startswith(("build/", "benchmarks/"))

    branch_plan = plan_branch(
        branch, exists, base, branch_local, _remote_files(api, repo_id, base), owned
    )

    plans = ([main_plan] if main_local else []) + [branch_plan]
    if not main_local and branch != "main":
        say(f"main: no {card} to publish as README.md; main is left as is")
    if not args.quiet:
        print_plan(plans, out)
    result["branches"] = {p.branch: p.to_json() for p in plans}

    if args.dry_run:
        would = [p.branch for p in plans if p.changed or not p.exists]
        say(
            "dry run: nothing was changed"
            + (f" (would update {', '.join(would)})" if would else "; no changes")
        )
        result["status"] = "dry_run"
        return 0

    # 3. Commit: all or nothing (see commit_all). A new repository is created only now, and
    # deleted again when the upload fails, so a failure leaves no empty repository behind.
    created_here = False
    if new_repo:
        try:
            api.create_repo(repo_id, repo_type="kernel", private=args.private)
            created_here = True
        except Exception as e:  # noqa: BLE001 - reported as one line
            status = getattr(getattr(e, "response", None), "status_code", None)
            if status in (401, 403):
                raise UploadError(
                    f"{kernel}: not allowed to create kernel repo {repo_id} ({status}); ask an admin of "
                    f"{repo_id.split('/')[0]} for write access or choose another --org"
                ) from None
            if status != 409:  # 409: created meanwhile by someone else, used but never deleted
                raise
    try:
        if new_repo:
            head = (refs() or {}).get("main")
            for plan in (main_plan, branch_plan):
                plan.base = head
                plan.exists = plan.exists or plan.branch == "main"
        commit_all(api, repo_id, main_plan if main_local else None, branch_plan, args.message, out)
    except BaseException:
        if created_here:
            try:
                api.delete_repo(repo_id, repo_type="kernel")
                print(
                    f"the repository {repo_id} created by this upload was deleted again",
                    file=sys.stderr,
                )
            except Exception as e:  # noqa: BLE001 - the upload's own error follows
                print(
                    f"warning: could not delete {repo_id}, created by this upload: {e}",
                    file=sys.stderr,
                )
        raise
    result["branches"] = {p.branch: p.to_json() for p in plans}
    changed = new_repo or not branch_plan.exists or any(p.commit for p in plans)
    result["status"] = "uploaded" if changed else "no_changes"
    print(f"{kernel}: {'uploaded to ' + result['url'] if changed else 'no changes'}", file=out)
    return 0


def offline_plan(
    error, endpoint, repo_id, branch, main_local, branch_local, token, say, out, result
) -> int:
    """A dry run without the Hub: what would be sent, and what could not be checked and why."""
    reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    say(f"could not reach the Hub at {endpoint} ({reason}); planning from the local build alone")
    plans = []
    if main_local and branch != "main":
        plans.append(plan_branch("main", False, None, main_local, {}, lambda p: False))
    local = dict(branch_local)
    if branch != "main":
        local.pop("README.md", None)
    plans.append(plan_branch(branch, False, None, local, {}, lambda p: False))
    for plan in plans:
        print(f"branch {plan.branch} (state unknown):", file=out)
        for path in plan.add:
            print(f"  send    {path}", file=out)
    not_checked = [
        f"whether {repo_id} and its branches exist (files already on the Hub are listed as sent)",
        "which files on the branch the upload would replace or delete",
        "whether the token may write to " + repo_id.split("/")[0]
        if token
        else "no token was found (HF_TOKEN)",
    ]
    print(f"not checked (the Hub at {endpoint} was unreachable):", file=out)
    for item in not_checked:
        print(f"  - {item}", file=out)
    say("dry run: nothing was changed")
    result.update(
        status="dry_run",
        offline=True,
        hub_error=reason,
        not_checked=not_checked,
        branches={p.branch: p.to_json() for p in plans},
    )
    return 0


def _operations(plan: BranchPlan) -> list:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    ops = [
        CommitOperationAdd(path_in_repo=p, path_or_fileobj=plan.sources[p].payload())
        for p in plan.add + plan.replace
    ]
    return ops + [CommitOperationDelete(path_in_repo=p) for p in plan.delete]


def commit_all(
    api, repo_id: str, main_plan: BranchPlan | None, branch_plan: BranchPlan, message: str, out
) -> None:
    """Land the version branch and main's README together, or leave every ref where it was.

    Large files go to storage first (no ref moves; the xet/LFS calls that fail most often fail
    here). Then the version branch gets one commit (a new branch is created from main's head just
    before it), and main's README last; each commit names its parent, so a concurrent change is a
    failure, not an overwrite. When a step fails, the refs moved so far are put back.
    """
    kinds = {"repo_type": "kernel"}
    main_ops = _operations(main_plan) if main_plan and main_plan.changed else []
    branch_ops = _operations(branch_plan) if branch_plan.changed else []
    additions = [op for op in main_ops + branch_ops if hasattr(op, "path_or_fileobj")]
    undo: list = []  # how to put back each ref moved so far, newest last
    try:
        branch = branch_plan.branch
        if additions:
            where = branch if branch_plan.exists else "main"  # whose .gitattributes decide LFS
            api.preupload_lfs_files(repo_id, additions, revision=where, **kinds)
        if not branch_plan.exists:
            api.create_branch(repo_id, branch=branch, revision=branch_plan.base, **kinds)
            undo.append(lambda: api.delete_branch(repo_id, branch=branch, **kinds))
        if branch_ops:
            branch_plan.commit = _commit(
                api, repo_id, branch, branch_plan.base, branch_ops, message
            )
            if branch_plan.exists:
                # Only once our commit is in: a failed commit moved nothing, and a parent_commit
                # conflict means someone else's commit, which must not be reset.
                old = branch_plan.base

                def restore() -> None:
                    api.delete_branch(repo_id, branch=branch, **kinds)
                    api.create_branch(repo_id, branch=branch, revision=old, **kinds)

                undo.append(restore)
            print(f"{branch}: committed {branch_plan.commit}", file=out)
        else:
            print(
                f"{branch}: {'created from main, ' if not branch_plan.exists else ''}no changes",
                file=out,
            )
        if main_plan is not None and main_ops:
            main_plan.commit = _commit(api, repo_id, "main", main_plan.base, main_ops, message)
            print(f"main: committed {main_plan.commit}", file=out)
        elif main_plan is not None:
            print("main: no changes", file=out)
    except BaseException as e:
        failed = []
        for step in reversed(undo):
            try:
                step()
            except Exception as undo_error:  # noqa: BLE001 - reported with the original failure
                failed.append(f"{type(undo_error).__name__}: {undo_error}")
        if failed:
            raise UploadError(
                f"upload failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}) and putting "
                f"branch {branch_plan.branch} of {repo_id} back failed too ({failed[0]}); check it on the Hub"
            ) from e
        what = (
            f"branch {branch_plan.branch} of {repo_id} was put back"
            if undo
            else "no branch was changed"
        )
        print(f"upload failed; {what}", file=sys.stderr)
        branch_plan.commit = None
        if main_plan is not None:
            main_plan.commit = None
        raise


def _commit(api, repo_id: str, branch: str, parent: str | None, ops: list, message: str) -> str:
    if len(ops) > COMMIT_BATCH:
        raise UploadError(
            f"{len(ops)} files in one commit; more than {COMMIT_BATCH} cannot be landed atomically"
        )
    info = api.create_commit(
        repo_id,
        ops,
        commit_message=message,
        repo_type="kernel",
        revision=branch,
        parent_commit=parent,
    )
    return info.oid


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result: dict = {"status": "error", "kernel": args.kernel, "_token": args.token}
    code = 1
    try:
        code = run(args, sys.stdout, result)
    except UploadError as e:
        for line in str(e).splitlines():
            print(f"error: {_scrub(line, result.get('_token'))}", file=sys.stderr)
        result["error"] = _scrub(str(e), result.get("_token"))
    except Exception as e:  # noqa: BLE001 - Hub/network errors: one line, non-zero exit
        from huggingface_hub.errors import HfHubHTTPError

        kernel = result.get("kernel", args.kernel)
        where = f" ({result['repo_id']})" if "repo_id" in result else ""
        line = _hub_error_line(e) if isinstance(e, HfHubHTTPError) else f"{type(e).__name__}: {e}"
        line = line.splitlines()[0] if line else type(e).__name__
        if not isinstance(e, HfHubHTTPError) and "url" in result:
            # No answer from the Hub at all (DNS, refused connection, proxy): say which Hub.
            endpoint = result["url"].split("/kernels/")[0]
            line += (
                f" (Hub at {endpoint}; check the network or HF_ENDPOINT; --dry-run plans offline)"
            )
        msg = _scrub(f"{kernel}{where}: {line}", result.get("_token"))
        print(f"error: {msg}", file=sys.stderr)
        result["error"] = msg
    token = result.pop("_token", None)
    if args.output_json:
        text = _scrub(json.dumps(result, indent=2, sort_keys=True), token)
        args.output_json.write_text(text + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
