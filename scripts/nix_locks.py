#!/usr/bin/env python3
"""Write and check this repo's Nix ``flake.lock`` files without network access.

Every flake in the repo (the top-level aggregator ``flake.nix`` and each kernel
folder's ``<name>/flake.nix``) has a single input, ``kernel-builder`` =
``github:huggingface/kernels``. Its lock is fully determined by pinned data that
is vendored next to this script (docs: nix.md §5):

* ``scripts/nix/kernel-builder-pin.json``: the pinned ``huggingface/kernels``
  rev with its ``lastModified`` and ``narHash``;
* ``scripts/nix/upstream-kernels-flake.lock``: ``huggingface/kernels``' own
  ``flake.lock`` at that rev (source of the transitive nodes).

Commands::

    python scripts/nix_locks.py generate            # (re)write every flake.lock
    python scripts/nix_locks.py new-kernel [NAME…]  # add <name>/flake.nix + lock
    python scripts/nix_locks.py check               # offline checks, exit 1 on failure

Only the standard library is used.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

SCRIPT_DIR = Path(__file__).resolve().parent
REPO_ROOT = SCRIPT_DIR.parent
DATA_DIR = SCRIPT_DIR / "nix"
UPSTREAM_LOCK_PATH = DATA_DIR / "upstream-kernels-flake.lock"
PIN_PATH = DATA_DIR / "kernel-builder-pin.json"

KERNEL_BUILDER_INPUT = "kernel-builder"
LOCK_VERSION = 7
LOCKED_GITHUB_KEYS = ("lastModified", "narHash", "owner", "repo", "rev", "type")

REV_RE = re.compile(r"^[0-9a-f]{40}$")
NARHASH_RE = re.compile(r"^sha256-[A-Za-z0-9+/]{43}=$")
KERNEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

KERNEL_FLAKE_TEMPLATE = """\
{{
  description = "Flake for the {name} kernel";

  inputs = {{
    kernel-builder.url = "github:huggingface/kernels";
  }};

  outputs =
    {{ self, kernel-builder }}:
    kernel-builder.lib.genKernelFlakeOutputs {{
      inherit self;
      path = ./.;
    }};
}}
"""


class LockError(Exception):
    """A flake or lock that this script cannot handle (message is user-facing)."""


# --------------------------------------------------------------------------
# Repository layout
# --------------------------------------------------------------------------


def kernel_dirs(root: Path) -> List[Path]:
    """Top-level directories that contain a build.toml (same rule as flake.nix)."""
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / "build.toml").is_file())


def flake_dirs(root: Path) -> List[Path]:
    """Directories whose flake.lock this script owns: the root and every kernel folder with a flake.nix."""
    return [root] + [d for d in kernel_dirs(root) if (d / "flake.nix").is_file()]


def rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root)) or "."
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------
# Reading the `inputs` of a flake.nix without Nix
# --------------------------------------------------------------------------
#
# A small Nix lexer plus a parser for literal attribute sets. Values that are
# not literals (functions, `let`, operators, …) are skipped and recorded as
# UNKNOWN; `outputs` is such a value. This is enough for the `inputs` of a
# flake, which Nix itself requires to be a literal attribute set.


class NixParseError(LockError):
    pass


class _Unknown:
    def __repr__(self) -> str:
        return "<non-literal>"


UNKNOWN = _Unknown()

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<comment>\#[^\n]*|/\*.*?\*/)
  | (?P<uri>[a-zA-Z][a-zA-Z0-9+\-.]*:[a-zA-Z0-9%/?:@&=+$,\-_.!~*']+)
  | (?P<path>[a-zA-Z0-9._\-+]*(?:/[a-zA-Z0-9._\-+]+)+/?|~(?:/[a-zA-Z0-9._\-+]+)+/?|<[a-zA-Z0-9._\-+/]+>)
  | (?P<ident>[a-zA-Z_][a-zA-Z0-9_'\-]*)
  | (?P<number>[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)
  | (?P<op>\.\.\.|==|!=|<=|>=|&&|\|\||->|//|\+\+|\$\{|[{}()\[\];=.,@:?+\-*/<>!])
    """,
    re.VERBOSE | re.DOTALL,
)


class _Tok:
    __slots__ = ("kind", "text", "value", "pos")

    def __init__(self, kind: str, text: str, value: Any, pos: int) -> None:
        self.kind, self.text, self.value, self.pos = kind, text, value, pos

    def __repr__(self) -> str:
        return f"{self.kind}:{self.text!r}"


def _line_col(src: str, pos: int) -> str:
    line = src.count("\n", 0, pos) + 1
    col = pos - (src.rfind("\n", 0, pos) + 1) + 1
    return f"line {line}, column {col}"


def _tokenize(src: str) -> List[_Tok]:
    toks: List[_Tok] = []
    i, n = 0, len(src)

    def skip_interpolation(j: int) -> int:
        # src[j-2:j] == "${"; return the index after the matching "}".
        depth = 1
        while j < n:
            c = src[j]
            if c == '"':
                j = scan_string(j)[0]
                continue
            if src.startswith("''", j):
                j = scan_indented(j)[0]
                continue
            if src.startswith("${", j):
                depth += 1
                j += 2
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return j + 1
            elif c == "#":
                k = src.find("\n", j)
                j = n if k < 0 else k
                continue
            elif src.startswith("/*", j):
                k = src.find("*/", j + 2)
                if k < 0:
                    raise NixParseError(f"unterminated comment at {_line_col(src, j)}")
                j = k + 2
                continue
            j += 1
        raise NixParseError("unterminated ${ … } interpolation")

    def scan_string(j: int):
        # src[j] == '"'; returns (end index, literal value or UNKNOWN)
        start = j
        j += 1
        out: List[str] = []
        literal = True
        escapes = {"n": "\n", "t": "\t", "r": "\r"}
        while j < n:
            c = src[j]
            if c == "\\":
                if j + 1 >= n:
                    break
                out.append(escapes.get(src[j + 1], src[j + 1]))
                j += 2
            elif c == '"':
                return j + 1, ("".join(out) if literal else UNKNOWN)
            elif src.startswith("${", j):
                literal = False
                j = skip_interpolation(j + 2)
            else:
                out.append(c)
                j += 1
        raise NixParseError(f"unterminated string starting at {_line_col(src, start)}")

    def scan_indented(j: int):
        # src[j:j+2] == "''"; indented strings are never treated as literals here.
        start = j
        j += 2
        while j < n:
            if src.startswith("'''", j) or src.startswith("''$", j):
                j += 3
            elif src.startswith("''\\", j):
                j += 4
            elif src.startswith("''", j):
                return j + 2, UNKNOWN
            elif src.startswith("${", j):
                j = skip_interpolation(j + 2)
            else:
                j += 1
        raise NixParseError(f"unterminated ''-string starting at {_line_col(src, start)}")

    while i < n:
        c = src[i]
        if c == '"':
            end, value = scan_string(i)
            toks.append(_Tok("string", src[i:end], value, i))
            i = end
            continue
        if src.startswith("''", i):
            end, value = scan_indented(i)
            toks.append(_Tok("string", src[i:end], value, i))
            i = end
            continue
        m = _TOKEN_RE.match(src, i)
        if not m:
            raise NixParseError(f"unexpected character {c!r} at {_line_col(src, i)}")
        kind = m.lastgroup or ""
        if kind not in ("ws", "comment"):
            text = m.group()
            toks.append(_Tok(kind, text, text, i))
        i = m.end()
    toks.append(_Tok("eof", "", None, n))
    return toks


class _NotLiteral(Exception):
    pass


class _Parser:
    def __init__(self, src: str) -> None:
        self.src = src
        self.toks = _tokenize(src)
        self.i = 0

    # -- helpers
    def peek(self, k: int = 0) -> _Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def next(self) -> _Tok:
        tok = self.peek()
        self.i += 1
        return tok

    def is_op(self, text: str, k: int = 0) -> bool:
        tok = self.peek(k)
        return tok.kind == "op" and tok.text == text

    def expect_op(self, text: str) -> None:
        tok = self.next()
        if tok.kind != "op" or tok.text != text:
            raise NixParseError(
                f"expected {text!r} but found {tok.text or 'end of file'!r} at {_line_col(self.src, tok.pos)}"
            )

    # -- skipping a non-literal expression up to the ';' that ends its binding
    def skip_expression(self) -> None:
        stack: List[str] = []
        closers = {"}": "{", ")": "(", "]": "["}
        while True:
            tok = self.peek()
            if tok.kind == "eof":
                raise NixParseError("unexpected end of file inside an expression")
            if tok.kind == "op" and tok.text in ("{", "(", "[", "${"):
                stack.append("{" if tok.text == "${" else tok.text)
            elif tok.kind == "op" and tok.text in closers:
                if not stack:
                    return  # end of the enclosing attribute set / list
                if stack[-1] != closers[tok.text]:
                    raise NixParseError(f"unbalanced {tok.text!r} at {_line_col(self.src, tok.pos)}")
                stack.pop()
            elif tok.kind == "ident" and tok.text == "let":
                stack.append("let")
            elif tok.kind == "ident" and tok.text == "in" and stack and stack[-1] == "let":
                stack.pop()
            elif tok.kind == "ident" and tok.text in ("with", "assert"):
                stack.append(";")
            elif tok.kind == "op" and tok.text == ";":
                if not stack:
                    return
                if stack[-1] == ";":
                    stack.pop()
            self.i += 1

    # -- literal values
    def value(self) -> Any:
        start = self.i
        try:
            val = self.literal()
            if not (self.is_op(";") or self.is_op("}") or self.is_op("]") or self.peek().kind == "eof"):
                raise _NotLiteral
            return val
        except _NotLiteral:
            self.i = start
            self.skip_expression()
            return UNKNOWN

    def literal(self) -> Any:
        tok = self.peek()
        if tok.kind == "string":
            self.i += 1
            return tok.value
        if tok.kind == "uri":
            self.i += 1
            return tok.text
        if tok.kind == "number":
            self.i += 1
            return float(tok.text) if any(ch in tok.text for ch in ".eE") else int(tok.text)
        if tok.kind == "ident" and tok.text in ("true", "false", "null"):
            self.i += 1
            return {"true": True, "false": False, "null": None}[tok.text]
        if tok.kind == "ident" and tok.text == "rec" and self.is_op("{", 1):
            raise _NotLiteral
        if tok.kind == "op" and tok.text == "{" and not self.looks_like_lambda():
            self.i += 1
            attrs = self.bindings()
            self.expect_op("}")
            return attrs
        if tok.kind == "op" and tok.text == "[":
            self.i += 1
            items = []
            while not self.is_op("]"):
                if self.peek().kind == "eof":
                    raise NixParseError("unterminated list")
                items.append(self.literal())
            self.i += 1
            return items
        raise _NotLiteral

    def looks_like_lambda(self) -> bool:
        # `{ a, b ? x, ... }:` or `{ }:` versus an attribute set.
        a, b = self.peek(1), self.peek(2)
        if a.kind == "op" and a.text == "...":
            return True
        if a.kind == "op" and a.text == "}":
            return b.kind == "op" and b.text in (":", "@")
        return a.kind == "ident" and b.kind == "op" and b.text in (",", "?", "}")

    def attr_name(self) -> str:
        tok = self.next()
        if tok.kind == "ident":
            return tok.text
        if tok.kind == "string" and isinstance(tok.value, str):
            return tok.value
        raise _NotLiteral

    def bindings(self) -> Dict[str, Any]:
        attrs: Dict[str, Any] = {}
        while not self.is_op("}"):
            tok = self.peek()
            if tok.kind == "eof":
                raise NixParseError("unterminated attribute set")
            if tok.kind == "ident" and tok.text == "inherit":
                self.i += 1
                if self.is_op("("):
                    self.skip_balanced()
                while not self.is_op(";"):
                    names = self.attr_name()
                    attrs[names] = UNKNOWN
                self.i += 1
                continue
            path = [self.attr_name()]
            while self.is_op("."):
                self.i += 1
                path.append(self.attr_name())
            self.expect_op("=")
            val = self.value()
            self.expect_op(";")
            self.assign(attrs, path, val, tok.pos)
        return attrs

    def skip_balanced(self) -> None:
        depth = 0
        while True:
            tok = self.next()
            if tok.kind == "eof":
                raise NixParseError("unbalanced parentheses")
            if tok.kind == "op" and tok.text in ("(", "{", "[", "${"):
                depth += 1
            elif tok.kind == "op" and tok.text in (")", "}", "]"):
                depth -= 1
                if depth == 0:
                    return

    def assign(self, attrs: Dict[str, Any], path: List[str], val: Any, pos: int) -> None:
        cur = attrs
        for part in path[:-1]:
            nxt = cur.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise NixParseError(f"attribute '{'.'.join(path)}' already defined ({_line_col(self.src, pos)})")
            cur = nxt
        last = path[-1]
        if last in cur:
            if isinstance(cur[last], dict) and isinstance(val, dict):
                for k, v in val.items():
                    self.assign(cur[last], [k], v, pos)
                return
            raise NixParseError(f"attribute '{'.'.join(path)}' already defined ({_line_col(self.src, pos)})")
        cur[last] = val

    def top_level(self) -> Dict[str, Any]:
        if not self.is_op("{"):
            raise NixParseError("flake.nix must be an attribute set")
        self.i += 1
        attrs = self.bindings()
        self.expect_op("}")
        if self.peek().kind != "eof":
            raise NixParseError(f"trailing text at {_line_col(self.src, self.peek().pos)}")
        return attrs


def parse_flake_attrs(src: str) -> Dict[str, Any]:
    """Top-level attributes of a flake.nix; non-literal values are UNKNOWN."""
    try:
        return _Parser(src).top_level()
    except _NotLiteral:
        raise NixParseError("flake.nix top level is not a plain attribute set") from None


def _strip_unknown(value: Any, where: str) -> Any:
    if value is UNKNOWN:
        raise NixParseError(f"{where} is not a literal value; this script only reads literal flake inputs")
    if isinstance(value, dict):
        return {k: _strip_unknown(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_strip_unknown(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def parse_flake_inputs(src: str) -> Dict[str, Any]:
    """The `inputs` attribute set of a flake.nix, as `(import ./flake.nix).inputs` would give it."""
    attrs = parse_flake_attrs(src)
    inputs = attrs.get("inputs", {})
    inputs = _strip_unknown(inputs, "inputs")
    if not isinstance(inputs, dict):
        raise NixParseError("`inputs` must be an attribute set")
    return inputs


def read_flake_inputs(flake_dir: Path) -> Dict[str, Any]:
    return parse_flake_inputs((flake_dir / "flake.nix").read_text(encoding="utf-8"))


# --------------------------------------------------------------------------
# Flake references
# --------------------------------------------------------------------------

_GITHUB_URL_RE = re.compile(r"^github:([^/?#]+)/([^/?#]+)(?:/([^?#]+))?(?:\?([^#]*))?$")


def github_original(name: str, spec: Any) -> Dict[str, Any]:
    """The lock-file `original` attrs of a github input, as Nix writes them."""
    if not isinstance(spec, dict):
        raise LockError(f"input {name!r}: expected an attribute set, got {spec!r}")
    if "url" in spec:
        url = spec["url"]
        if not isinstance(url, str):
            raise LockError(f"input {name!r}: url is not a string")
        m = _GITHUB_URL_RE.match(url)
        if not m:
            raise LockError(f"input {name!r}: only github: URLs are supported, got {url!r}")
        owner, repo, ref_or_rev, query = m.groups()
        original: Dict[str, Any] = {"owner": owner, "repo": repo, "type": "github"}
        if ref_or_rev is not None:
            original["rev" if REV_RE.match(ref_or_rev) else "ref"] = ref_or_rev
        for key, value in urllib.parse.parse_qsl(query or "", keep_blank_values=True):
            if key not in ("ref", "rev"):
                raise LockError(f"input {name!r}: URL parameter {key!r} is not supported ({url!r})")
            if key in original:
                raise LockError(f"input {name!r}: {key} given twice in {url!r}")
            original[key] = value
        return original
    if spec.get("type") == "github":
        original = {"type": "github"}
        for key in ("owner", "repo", "ref", "rev"):
            if key in spec:
                original[key] = spec[key]
        if "owner" not in original or "repo" not in original:
            raise LockError(f"input {name!r}: github input without owner/repo")
        return original
    raise LockError(f"input {name!r}: only github inputs (url = \"github:…\") are supported")


# --------------------------------------------------------------------------
# Pinned data
# --------------------------------------------------------------------------


def load_pin(path: Path = PIN_PATH) -> Dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return {key: data[key] for key in LOCKED_GITHUB_KEYS}


def load_upstream(path: Path = UPSTREAM_LOCK_PATH) -> Dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------
# Writing a lock (nix.md §5)
# --------------------------------------------------------------------------


class _Node:
    def __init__(self, locked: Optional[dict] = None, original: Optional[dict] = None, flake: bool = True):
        self.locked = locked
        self.original = original
        self.flake = flake
        self.inputs: Dict[str, Union["_Node", List[str]]] = {}


def serialize_lock(root: _Node) -> str:
    """Serialize a lock graph the way Nix's LockFile::toJSON does.

    Node names come from a depth-first walk over input names in sorted order;
    a name that is already taken gets the first free suffix _2, _3, …; a node
    reached twice keeps its first name.
    """
    nodes: Dict[str, Any] = {}
    taken: set = set()
    names: Dict[int, str] = {}

    def dump(key: str, node: _Node) -> str:
        if id(node) in names:
            return names[id(node)]
        if key in taken:
            n = 2
            while f"{key}_{n}" in taken:
                n += 1
            key = f"{key}_{n}"
        taken.add(key)
        names[id(node)] = key
        obj: Dict[str, Any] = {}
        if node.inputs:
            inputs: Dict[str, Any] = {}
            for input_name in sorted(node.inputs):
                target = node.inputs[input_name]
                inputs[input_name] = dump(input_name, target) if isinstance(target, _Node) else list(target)
            obj["inputs"] = inputs
        if node.locked is not None:
            obj["locked"] = dict(node.locked)
            obj["original"] = dict(node.original or {})
            if not node.flake:
                obj["flake"] = False
        nodes[key] = obj
        return key

    root_key = dump("root", root)
    doc = {"nodes": nodes, "root": root_key, "version": LOCK_VERSION}
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _graft_upstream(parent: _Node, input_name: str, upstream: Dict[str, Any]) -> None:
    """Copy upstream's non-root nodes under `parent`, re-rooting follows paths."""
    up_nodes = upstream["nodes"]
    copies: Dict[str, _Node] = {}

    def link(target: Any) -> Union[_Node, List[str]]:
        if isinstance(target, str):
            return copy(target)
        return [input_name] + list(target)

    def copy(key: str) -> _Node:
        if key not in copies:
            src = up_nodes[key]
            node = _Node(src["locked"], src["original"], src.get("flake", True))
            copies[key] = node
            for name, target in src.get("inputs", {}).items():
                node.inputs[name] = link(target)
        return copies[key]

    for name, target in up_nodes[upstream["root"]].get("inputs", {}).items():
        parent.inputs[name] = link(target)


def render_lock(
    flake_inputs: Dict[str, Any],
    pin: Optional[Dict[str, Any]] = None,
    upstream: Optional[Dict[str, Any]] = None,
) -> str:
    """The flake.lock text for a flake with these inputs (nix.md §5 recipe)."""
    pin = load_pin() if pin is None else pin
    upstream = load_upstream() if upstream is None else upstream
    root = _Node()
    for name in sorted(flake_inputs):
        spec = flake_inputs[name]
        if name != KERNEL_BUILDER_INPUT:
            raise LockError(
                f"input {name!r}: only the {KERNEL_BUILDER_INPUT!r} input can be locked offline "
                "(pinned data exists only for it); take other inputs from kernel-builder.inputs"
            )
        original = github_original(name, spec)
        extra = sorted(set(spec) - {"url", "type", "owner", "repo", "ref", "rev"})
        if extra:
            raise LockError(f"input {name!r}: attribute(s) {extra} are not supported by the offline lock writer")
        if (original["owner"], original["repo"]) != (pin["owner"], pin["repo"]):
            raise LockError(
                f"input {name!r}: points at {original['owner']}/{original['repo']}, "
                f"but the pin is for {pin['owner']}/{pin['repo']}"
            )
        if "rev" in original and original["rev"] != pin["rev"]:
            raise LockError(
                f"input {name!r}: URL pins rev {original['rev']}, but the vendored pin is {pin['rev']} "
                f"(update {rel(PIN_PATH, REPO_ROOT)} and {rel(UPSTREAM_LOCK_PATH, REPO_ROOT)} together)"
            )
        node = _Node(dict(pin), original)
        _graft_upstream(node, name, upstream)
        root.inputs[name] = node
    return serialize_lock(root)


# --------------------------------------------------------------------------
# Checks (nix.md §6.B and §6.C)
# --------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_locked_node(key: str, node: Dict[str, Any], err: Callable[[str], None]) -> None:
    locked, original = node.get("locked"), node.get("original")
    if not isinstance(locked, dict):
        err(f"node {key!r} has no 'locked' entry")
        return
    if not isinstance(original, dict):
        err(f"node {key!r} has no 'original' entry")
        return
    if "flake" in node and not isinstance(node["flake"], bool):
        err(f"node {key!r}: 'flake' must be a boolean")
    for attr in ("type", "owner", "repo"):
        if locked.get(attr) != original.get(attr):
            err(f"node {key!r}: locked.{attr} {locked.get(attr)!r} differs from original.{attr} {original.get(attr)!r}")
    if locked.get("type") != "github":
        err(f"node {key!r}: locked.type is {locked.get('type')!r}; only 'github' nodes are expected in this repo")
        return
    for attr in ("owner", "repo"):
        if not isinstance(locked.get(attr), str) or not locked.get(attr):
            err(f"node {key!r}: locked.{attr} missing")
    rev = locked.get("rev")
    if not isinstance(rev, str) or not REV_RE.match(rev):
        err(f"node {key!r}: locked.rev {rev!r} is not 40 lowercase hex characters")
    if "rev" in original and original["rev"] != rev:
        err(f"node {key!r}: locked.rev {rev!r} differs from original.rev {original['rev']!r}")
    nar = locked.get("narHash")
    if not isinstance(nar, str) or not NARHASH_RE.match(nar):
        err(f"node {key!r}: locked.narHash {nar!r} does not match sha256-<43 base64 chars>=")
    if not _is_int(locked.get("lastModified")):
        err(f"node {key!r}: locked.lastModified {locked.get('lastModified')!r} is not an integer")
    unknown = sorted(set(locked) - set(LOCKED_GITHUB_KEYS) - {"ref"})
    if unknown:
        err(f"node {key!r}: unexpected locked attribute(s) {unknown}")


def _resolve_follows(nodes: Dict[str, Any], root_key: str, path: List[str], seen: frozenset = frozenset()) -> str:
    """Node key that a follows path designates, resolved from the root (raises LockError)."""
    key = root_key
    for i, name in enumerate(path):
        node = nodes.get(key)
        inputs = node.get("inputs", {}) if isinstance(node, dict) else {}
        target = inputs.get(name) if isinstance(inputs, dict) else None
        where = "/".join(path[:i]) or "the root"
        if target is None:
            raise LockError(f"no input {name!r} at {where}")
        if isinstance(target, list):
            token = "/".join(path[: i + 1])
            if token in seen:
                raise LockError(f"follows cycle through {token!r}")
            key = _resolve_follows(nodes, root_key, target, seen | {token})
        elif isinstance(target, str) and target in nodes:
            key = target
        else:
            raise LockError(f"input {name!r} at {where} is dangling")
    return key


def check_lock_structure(lock_text: str, flake_inputs: Optional[Dict[str, Any]], label: str) -> List[str]:
    """§6.B.1–B.6 for one lock. `flake_inputs` = the sibling flake.nix inputs (None: skip B.2/B.3)."""
    errors: List[str] = []

    def err(msg: str) -> None:
        errors.append(f"{label}: {msg}")

    try:
        lock = json.loads(lock_text)
    except json.JSONDecodeError as exc:
        return [f"{label}: not valid JSON ({exc})"]
    if not isinstance(lock, dict):
        return [f"{label}: top level is not a JSON object"]
    version = lock.get("version")
    if not _is_int(version) or version != LOCK_VERSION:
        err(f"\"version\" is {version!r}, expected {LOCK_VERSION}")
    root_key = lock.get("root")
    if root_key != "root":
        err(f"\"root\" is {root_key!r}, expected \"root\"")
    nodes = lock.get("nodes")
    if not isinstance(nodes, dict):
        err("\"nodes\" is missing or not an object")
        return errors
    if not isinstance(root_key, str) or root_key not in nodes:
        err(f"\"nodes\" has no root node {root_key!r}")
        return errors
    extra_top = sorted(set(lock) - {"nodes", "root", "version"})
    if extra_top:
        err(f"unexpected top-level key(s) {extra_top}")

    # Node shape, references and follows (B.4, B.5).
    for key in sorted(nodes):
        node = nodes[key]
        if not isinstance(node, dict):
            err(f"node {key!r} is not an object")
            continue
        unknown = sorted(set(node) - {"inputs", "locked", "original", "flake"})
        if unknown:
            err(f"node {key!r}: unexpected key(s) {unknown}")
        inputs = node.get("inputs", {})
        if not isinstance(inputs, dict):
            err(f"node {key!r}: 'inputs' is not an object")
            inputs = {}
        for name in sorted(inputs):
            target = inputs[name]
            if isinstance(target, str):
                if target not in nodes:
                    err(f"node {key!r} input {name!r} refers to missing node {target!r}")
            elif isinstance(target, list):
                if not target or not all(isinstance(p, str) for p in target):
                    err(f"node {key!r} input {name!r}: follows must be a non-empty list of input names, got {target!r}")
                    continue
                try:
                    _resolve_follows(nodes, root_key, target)
                except LockError as exc:
                    err(
                        f"node {key!r} input {name!r} follows {target!r}, which does not resolve from the root "
                        f"({exc}); follows paths start at the root, e.g. ['{KERNEL_BUILDER_INPUT}', 'nixpkgs']"
                    )
            else:
                err(f"node {key!r} input {name!r}: expected a node name or a follows list, got {target!r}")
        if key == root_key:
            if "locked" in node or "original" in node:
                err("the root node must not have 'locked'/'original'")
            continue
        _check_locked_node(key, node, err)

    # Reachability (B.6).
    reachable = {root_key}
    todo = [root_key]
    while todo:
        node = nodes.get(todo.pop())
        inputs = node.get("inputs", {}) if isinstance(node, dict) else {}
        for target in (inputs.values() if isinstance(inputs, dict) else []):
            if isinstance(target, str) and target in nodes and target not in reachable:
                reachable.add(target)
                todo.append(target)
    for key in sorted(set(nodes) - reachable):
        err(f"node {key!r} is not reachable from the root (orphan)")

    # Root inputs against flake.nix (B.2, B.3).
    if flake_inputs is not None:
        root_inputs = nodes[root_key].get("inputs", {})
        root_inputs = root_inputs if isinstance(root_inputs, dict) else {}
        missing = sorted(set(flake_inputs) - set(root_inputs))
        extra = sorted(set(root_inputs) - set(flake_inputs))
        if missing:
            err(f"flake.nix input(s) {missing} missing from the root node's inputs (stale lock)")
        if extra:
            err(f"root node has input(s) {extra} that flake.nix does not declare (stale lock)")
        for name in sorted(set(flake_inputs) & set(root_inputs)):
            spec, target = flake_inputs[name], root_inputs[name]
            if isinstance(spec, dict) and "follows" in spec:
                want = [p for p in str(spec["follows"]).split("/") if p]
                if target != want:
                    err(f"root input {name!r} should follow {want!r}, lock has {target!r}")
                continue
            if not isinstance(target, str) or not isinstance(nodes.get(target), dict):
                continue  # already reported above
            try:
                expected = github_original(name, spec)
            except LockError as exc:
                err(str(exc))
                continue
            actual = nodes[target].get("original")
            if actual != expected:
                err(
                    f"input {name!r}: lock original {actual!r} does not match flake.nix "
                    f"(expected {expected!r}; stale lock)"
                )
    return errors


def kernel_builder_rev(lock_text: str) -> Optional[str]:
    try:
        lock = json.loads(lock_text)
        nodes = lock["nodes"]
        key = nodes[lock["root"]]["inputs"][KERNEL_BUILDER_INPUT]
        return nodes[key]["locked"]["rev"]
    except (ValueError, KeyError, TypeError):
        return None


def check_same_kernel_builder_rev(locks: Dict[str, str]) -> List[str]:
    """B.7: every lock (label -> text) pins the same kernel-builder rev."""
    revs = {label: kernel_builder_rev(text) for label, text in locks.items()}
    distinct = sorted({rev for rev in revs.values() if rev is not None})
    if len(distinct) <= 1:
        return []
    listing = ", ".join(f"{label}: {rev}" for label, rev in sorted(revs.items()))
    return [f"locks pin different {KERNEL_BUILDER_INPUT} revs ({listing})"]


def check_against_upstream(
    lock_text: str,
    label: str,
    pin: Optional[Dict[str, Any]] = None,
    upstream: Optional[Dict[str, Any]] = None,
) -> List[str]:
    """C.1 (against the vendored pin) and C.2 (transitive nodes against upstream's lock)."""
    pin = load_pin() if pin is None else pin
    upstream = load_upstream() if upstream is None else upstream
    errors: List[str] = []

    def err(msg: str) -> None:
        errors.append(f"{label}: {msg}")

    try:
        lock = json.loads(lock_text)
        nodes = lock["nodes"]
        root_inputs = nodes[lock["root"]].get("inputs", {})
    except (ValueError, KeyError, TypeError, AttributeError):
        return [f"{label}: cannot compare with upstream, lock is malformed"]
    kb_key = root_inputs.get(KERNEL_BUILDER_INPUT) if isinstance(root_inputs, dict) else None
    if not isinstance(kb_key, str) or not isinstance(nodes.get(kb_key), dict):
        return [f"{label}: root has no {KERNEL_BUILDER_INPUT!r} node"]
    kb = nodes[kb_key]
    locked = kb.get("locked") if isinstance(kb.get("locked"), dict) else {}
    for attr in LOCKED_GITHUB_KEYS:
        if locked.get(attr) != pin[attr]:
            err(
                f"node {kb_key!r}: locked.{attr} is {locked.get(attr)!r}, the pin "
                f"({rel(PIN_PATH, REPO_ROOT)}) says {pin[attr]!r}"
            )

    up_nodes = upstream["nodes"]
    mapping: Dict[str, str] = {}  # upstream key -> our key

    def compare_inputs(up_inputs: Dict[str, Any], our_inputs: Any, our_key: str, where: str) -> None:
        if not isinstance(our_inputs, dict):
            err(f"node {our_key!r} ({where}): inputs missing")
            return
        if set(up_inputs) != set(our_inputs):
            err(
                f"node {our_key!r} ({where}): inputs {sorted(our_inputs)} differ from upstream's "
                f"{sorted(up_inputs)} (missing transitive nodes?)"
            )
        for name in sorted(set(up_inputs) & set(our_inputs)):
            up_target, our_target = up_inputs[name], our_inputs[name]
            if isinstance(up_target, list):
                want = [KERNEL_BUILDER_INPUT] + up_target
                if our_target != want:
                    err(
                        f"node {our_key!r} ({where}) input {name!r} is {our_target!r}; upstream follows "
                        f"{up_target!r}, re-rooted that is {want!r}"
                    )
            elif not isinstance(our_target, str) or not isinstance(nodes.get(our_target), dict):
                err(f"node {our_key!r} ({where}) input {name!r} should be a node like upstream's {up_target!r}")
            else:
                compare_node(up_target, our_target, f"{where}/{name}")

    def compare_node(up_key: str, our_key: str, where: str) -> None:
        if up_key in mapping:
            if mapping[up_key] != our_key:
                err(f"node {our_key!r} ({where}) should be the same node as {mapping[up_key]!r} (shared upstream)")
            return
        mapping[up_key] = our_key
        up, ours = up_nodes[up_key], nodes[our_key]
        for field in ("locked", "original"):
            if ours.get(field) != up.get(field):
                err(
                    f"node {our_key!r} ({where}): {field} {ours.get(field)!r} differs from upstream's "
                    f"{up.get(field)!r} ({rel(UPSTREAM_LOCK_PATH, REPO_ROOT)})"
                )
        if ours.get("flake", True) != up.get("flake", True):
            err(f"node {our_key!r} ({where}): 'flake' differs from upstream")
        compare_inputs(up.get("inputs", {}), ours.get("inputs", {}), our_key, where)

    compare_inputs(up_nodes[upstream["root"]].get("inputs", {}), kb.get("inputs"), kb_key, KERNEL_BUILDER_INPUT)
    return errors


def check_regeneration(lock_text: str, flake_inputs: Dict[str, Any], label: str, **kw: Any) -> List[str]:
    """C.3: the lock must be byte-identical to what the §5 recipe writes."""
    try:
        expected = render_lock(flake_inputs, **kw)
    except LockError as exc:
        return [f"{label}: cannot regenerate: {exc}"]
    if lock_text == expected:
        return []
    diff = list(
        difflib.unified_diff(
            expected.splitlines(), lock_text.splitlines(), "expected (generated)", label, lineterm="", n=1
        )
    )
    shown = "\n    ".join(diff[:20]) + ("\n    …" if len(diff) > 20 else "")
    return [
        f"{label}: not byte-identical to the generated lock "
        f"(run `python scripts/nix_locks.py generate`):\n    {shown}"
    ]


def _git_untracked(root: Path, paths: List[Path]) -> Optional[List[Path]]:
    """Which of `paths` git does not track; None when `root` is not a git work tree."""
    try:
        inside = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
            capture_output=True,
            text=True,
        )
    except OSError:
        return None
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        return None
    untracked = []
    for path in paths:
        res = subprocess.run(
            ["git", "-C", str(root), "ls-files", "--error-unmatch", "--", rel(path, root)],
            capture_output=True,
        )
        if res.returncode != 0:
            untracked.append(path)
    return untracked


def check_repo(root: Path = REPO_ROOT, git: bool = True) -> List[str]:
    """All offline lock checks for the repo at `root`; returns error messages."""
    errors: List[str] = []
    pin, upstream = load_pin(), load_upstream()
    for kdir in kernel_dirs(root):
        if not (kdir / "flake.nix").is_file():
            errors.append(
                f"{rel(kdir, root)}/: kernel folder has no flake.nix "
                f"(run `python scripts/nix_locks.py new-kernel {kdir.name}`)"
            )
    texts: Dict[str, str] = {}
    files: List[Path] = []
    for fdir in flake_dirs(root):
        flake, lock = fdir / "flake.nix", fdir / "flake.lock"
        label = rel(lock, root)
        if not flake.is_file():
            errors.append(f"{rel(flake, root)}: missing")
            continue
        files += [flake, lock]
        try:
            inputs: Optional[Dict[str, Any]] = read_flake_inputs(fdir)
        except LockError as exc:
            errors.append(f"{rel(flake, root)}: cannot read inputs: {exc}")
            inputs = None
        if not lock.is_file():
            errors.append(f"{label}: missing (run `python scripts/nix_locks.py generate`)")
            continue
        text = lock.read_text(encoding="utf-8")
        texts[label] = text
        structure = check_lock_structure(text, inputs, label)
        errors += structure
        if structure:
            continue
        errors += check_against_upstream(text, label, pin=pin, upstream=upstream)
        if inputs is not None:
            errors += check_regeneration(text, inputs, label, pin=pin, upstream=upstream)
    errors += check_same_kernel_builder_rev(texts)
    if git:
        untracked = _git_untracked(root, [f for f in files if f.is_file()])
        for path in untracked or []:
            errors.append(f"{rel(path, root)}: not tracked by git; Nix ignores untracked files (git add it)")
    return errors


# --------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------


def write_if_changed(path: Path, text: str, root: Path) -> None:
    old = path.read_text(encoding="utf-8") if path.is_file() else None
    if old == text:
        print(f"unchanged {rel(path, root)}")
        return
    path.write_text(text, encoding="utf-8")
    print(f"wrote     {rel(path, root)}")


def cmd_generate(root: Path) -> int:
    for fdir in flake_dirs(root):
        if not (fdir / "flake.nix").is_file():
            raise LockError(f"{rel(fdir / 'flake.nix', root)} is missing")
        write_if_changed(fdir / "flake.lock", render_lock(read_flake_inputs(fdir)), root)
    missing = [d.name for d in kernel_dirs(root) if not (d / "flake.nix").is_file()]
    if missing:
        print(f"note: kernel folder(s) without flake.nix: {', '.join(missing)} "
              f"(add them with `python scripts/nix_locks.py new-kernel`)")
    print("remember to `git add` the lock files: Nix ignores untracked files")
    return 0


def cmd_new_kernel(root: Path, names: List[str], force: bool) -> int:
    if not names:
        names = [d.name for d in kernel_dirs(root) if not (d / "flake.nix").is_file()]
        if not names:
            print("every kernel folder already has a flake.nix")
            return 0
    for name in names:
        kdir = root / name
        if not KERNEL_NAME_RE.match(name) or not (kdir / "build.toml").is_file():
            raise LockError(f"{name!r} is not a top-level kernel folder with a build.toml")
        flake = kdir / "flake.nix"
        if flake.exists() and not force:
            raise LockError(f"{rel(flake, root)} exists (use --force to overwrite it)")
        write_if_changed(flake, KERNEL_FLAKE_TEMPLATE.format(name=name), root)
        write_if_changed(kdir / "flake.lock", render_lock(read_flake_inputs(kdir)), root)
    print("remember to `git add` the new flake.nix and flake.lock: Nix ignores untracked files")
    return 0


def cmd_check(root: Path, git: bool) -> int:
    errors = check_repo(root, git=git)
    for msg in errors:
        print(f"error: {msg}", file=sys.stderr)
    n = len(flake_dirs(root))
    if errors:
        print(f"FAILED: {len(errors)} problem(s) in {n} flake lock(s)", file=sys.stderr)
        return 1
    print(f"OK: {n} flake lock(s) checked ({', '.join(rel(d / 'flake.lock', root) for d in flake_dirs(root))})")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="repository root (default: this checkout)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("generate", help="write every flake.lock from the pinned data")
    new = sub.add_parser("new-kernel", help="write <name>/flake.nix from the template, plus its lock")
    new.add_argument("names", nargs="*", help="kernel folders (default: every kernel folder without flake.nix)")
    new.add_argument("--force", action="store_true", help="overwrite an existing flake.nix")
    check = sub.add_parser("check", help="offline checks of every flake.lock (nix.md §6.B, C.2, C.3)")
    check.add_argument("--no-git", action="store_true", help="skip the 'tracked by git' check")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        if args.command == "generate":
            return cmd_generate(root)
        if args.command == "new-kernel":
            return cmd_new_kernel(root, args.names, args.force)
        return cmd_check(root, git=not args.no_git)
    except LockError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
