#!/usr/bin/env python3
"""Upload a kernel's build/ to the Hugging Face Hub as a `kernel` repository.

Repository layout (as kernel-builder publishes it):

    main      README.md               <- build/CARD.md
    v<N>      build/<variant>/...     <- build/<variant>/ (every file of the variant)
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
`--allow-dirty`, `--allow-digest-mismatch` and `--allow-version-mismatch` relax these.

The token comes from `--token`, else the usual huggingface_hub sources (HF_TOKEN, the saved
token file); it is never printed. The Hub endpoint comes from HF_ENDPOINT (or --endpoint).

Exit status: 0 on success (including "no changes" and --dry-run), 1 on any error.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMIT_BATCH = 1000
DEFAULT_MESSAGE = "Uploaded using scripts/upload.py"


class UploadError(Exception):
    """A failure reported as a single line on stderr."""


# --------------------------------------------------------------------------------------
# Local build inspection
# --------------------------------------------------------------------------------------


@dataclass
class LocalFile:
    source: Path
    size: int
    sha256: str
    git_oid: str

    @classmethod
    def from_path(cls, path: Path) -> "LocalFile":
        data = path.read_bytes()
        return cls(
            source=path,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            git_oid=hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
        )

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
    return variant, problems


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
    main_local = {"README.md": LocalFile.from_path(card)} if card.is_file() else {}
    branch_local: dict[str, LocalFile] = {}
    for v in variants:
        for rel, lf in v.files.items():
            branch_local[f"build/{v.name}/{rel}"] = lf
    branch_local.update(benchmark_files(build_dir, kernel_dir))
    if branch == "main":
        # `--branch main` (kernels-community also publishes version-1 kernels there): one plan, README included.
        branch_local.update(main_local)
        main_local = {}

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

    branches = refs()
    repo_created = False
    say(
        f"{kernel}: {len(variants)} variant(s) -> {repo_id} (kernel repo{'' if branches is not None else ', new'})"
    )
    for v in variants:
        say(f"  {v.name} (version {v.version}, id {v.metadata.get('id')}, {len(v.files)} files)")
    if branches is None and not args.dry_run:
        try:
            api.create_repo(repo_id, repo_type="kernel", private=args.private, exist_ok=True)
        except Exception as e:  # noqa: BLE001 - reported as one line
            status = getattr(getattr(e, "response", None), "status_code", None)
            if status in (401, 403):
                raise UploadError(
                    f"{kernel}: not allowed to create kernel repo {repo_id} ({status}); ask an admin of "
                    f"{repo_id.split('/')[0]} for write access or choose another --org"
                ) from None
            raise
        repo_created = True
        branches = refs() or {}
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

    # 3. Commit: README on main first, so that a new version branch starts from it.
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    def commit(plan: BranchPlan) -> None:
        paths = plan.add + plan.replace
        ops = [
            CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(plan.sources[p].source))
            for p in paths
        ]
        ops += [CommitOperationDelete(path_in_repo=p) for p in plan.delete]
        parent = plan.base
        for i in range(0, len(ops), COMMIT_BATCH):
            info = api.create_commit(
                repo_id,
                ops[i : i + COMMIT_BATCH],
                commit_message=args.message,
                repo_type="kernel",
                revision=plan.branch,
                parent_commit=parent,
            )
            parent = info.oid
        plan.commit = parent

    if main_plan.changed and main_local:
        commit(main_plan)
        print(f"main: committed {main_plan.commit}", file=out)
    elif main_local:
        print("main: no changes", file=out)

    branch_created = False
    if not branch_plan.exists:
        start = main_plan.commit or main_head
        api.create_branch(repo_id, branch=branch, revision=start, repo_type="kernel")
        branch_created = True
        branch_plan.base = start
    if branch_plan.changed:
        commit(branch_plan)
        print(f"{branch}: committed {branch_plan.commit}", file=out)
    else:
        print(f"{branch}: {'created from main, ' if branch_created else ''}no changes", file=out)

    result["branches"] = {p.branch: p.to_json() for p in plans}
    changed = repo_created or branch_created or any(p.commit for p in plans)
    result["status"] = "uploaded" if changed else "no_changes"
    print(f"{kernel}: {'uploaded to ' + result['url'] if changed else 'no changes'}", file=out)
    return 0


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
        msg = _scrub(
            f"{kernel}{where}: {line.splitlines()[0] if line else type(e).__name__}",
            result.get("_token"),
        )
        print(f"error: {msg}", file=sys.stderr)
        result["error"] = msg
    token = result.pop("_token", None)
    if args.output_json:
        text = _scrub(json.dumps(result, indent=2, sort_keys=True), token)
        args.output_json.write_text(text + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
