"""The environment fingerprint: what a node's training environment is made of, as canonical JSON.

Why: torchrun copies nothing between nodes; if their Python environments differ, the job still
starts and silently computes different things. A typical case (days to find):
scikit-learn differing across two machines: preprocessing differed slightly and the loss began to
swing after 200 steps. A fingerprint per node, compared with a golden one (or between two nodes
with ``preflight diff``), finds that in a second.

Shape (``fingerprint_version`` 1; documented in docs/fingerprint.md)::

    {"fingerprint_version": 1, "python": "3.11.7", "python_implementation": "CPython",
     "torch": "2.11.0+cu128", "torch_git": "...", "cuda": "12.8", "cudnn": "9.10.2.21",
     "nccl": "2.28.9", "driver": "570.124.06", "driver_cuda": "12.8",
     "packages": {"numpy": "2.1.0", ...}, "hashes": {"/srv/code": "<sha256 hex>"},
     "sha256": "<sha256 of all the above>", "meta": {host, executable, sources, ...}}

``sha256`` covers everything except ``meta`` (host name, time, paths, where each version was
read): two nodes with the same environment have the same ``sha256``, which is what the metric
``preflight_fingerprint_info{sha256}`` exposes so that version skew shows as more than one series.

Gathering (:func:`gather`) lives here; parsing (:func:`parse`), comparing (:func:`diff`) are pure.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preflight import __version__
from preflight.core.context import Context, activity
from preflight.core.units import fmt_bytes
from preflight.probes import pyenv

FINGERPRINT_VERSION = 1
#: Keys outside the canonical part (not hashed, not compared).
NON_CANONICAL = frozenset({"sha256", "meta"})
#: Trees with more entries (files + directories), or more bytes, than this are not hashed (the
#: entry says so): hashing is for code and data manifests, not datasets, and must stay within a
#: check's deadline.
HASH_MAX_FILES = 20_000
HASH_MAX_BYTES = 512 * (1 << 20)
#: Directory names skipped when hashing a tree: their content differs between identical checkouts
#: (.pyc files embed source mtimes; .git holds index timestamps and packs).
HASH_SKIP_DIRS = frozenset({"__pycache__", ".git"})
#: Longest the target interpreter may take to describe itself, seconds (also <= 80 % of the
#: check's deadline, so a hang is reported by us, naming the interpreter, not as a CheckTimeout).
PYENV_TIMEOUT_S = 8.0
_CHUNK = 1 << 20


class FingerprintError(ValueError):
    """A fingerprint file is unreadable or not a fingerprint; the message names the file."""


# --------------------------------------------------------------------------- hashing paths


class _TooLarge(Exception):
    pass


def _hash_file(path: str, into: Any, budget: list[int]) -> None:
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            budget[0] -= len(chunk)
            if budget[0] < 0:
                raise _TooLarge(f"more than {fmt_bytes(budget[1])}")
            into.update(chunk)


def hash_path(path: str | Path, *, max_files: int = HASH_MAX_FILES,
              max_bytes: int = HASH_MAX_BYTES) -> str:
    """sha256 of a file's bytes, or of a directory tree, deterministically.

    A tree's hash covers, for each entry in sorted relative-path order (``/`` separators): the
    path, its kind and its content (a symlink's target text, not what it points to, so links
    cannot loop or escape). ``__pycache__`` and ``.git`` are skipped. Modes, owners and times are
    not hashed: they differ between identical copies.

    Returns:
        64 hex digits, or a text in angle brackets saying why there is no hash: ``<missing>``,
        ``<unreadable: ...>``, ``<too large: ...>`` (trees beyond
        ``max_files`` / ``max_bytes`` are refused rather than hashed in part, because a partial
        hash would claim a sameness it never checked).
    """
    p = os.fspath(path)
    budget = [max_bytes, max_bytes]  # [left, limit]
    try:
        st = os.lstat(p)
        if stat.S_ISREG(st.st_mode):
            h = hashlib.sha256()
            _hash_file(p, h, budget)
            return h.hexdigest()
        if stat.S_ISLNK(st.st_mode):
            # A configured path that is a link: hash what it names, as a user would expect.
            return hash_path(os.path.realpath(p), max_files=max_files, max_bytes=max_bytes)
        if not stat.S_ISDIR(st.st_mode):
            return "<not a file or directory>"
        tree = hashlib.sha256()
        for rel, kind, full in _walk(p, max_entries=max_files):
            tree.update(f"{kind}\0{rel}\0".encode("utf-8", "surrogateescape"))
            if kind == "f":
                h = hashlib.sha256()
                _hash_file(full, h, budget)
                tree.update(h.digest())
            elif kind == "l":
                tree.update(os.readlink(full).encode("utf-8", "surrogateescape"))
            tree.update(b"\n")
        return tree.hexdigest()
    except FileNotFoundError:
        return "<missing>"
    except _TooLarge as exc:
        return f"<too large: {exc}; hash a manifest file instead>"
    except RecursionError:
        return "<too large: directories nested too deeply>"
    except OSError as exc:
        return f"<unreadable: {exc.strerror or exc}>"


def _walk(root: str, *, max_entries: int) -> list[tuple[str, str, str]]:
    """(relative path, kind f/d/l/o, full path) of every entry under ``root``, sorted by path;
    stops with _TooLarge past ``max_entries`` (directories count too) so a huge tree is not
    listed in full before being refused."""
    out: list[tuple[str, str, str]] = []

    def visit(directory: str, prefix: str) -> None:
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            rel = f"{prefix}{e.name}"
            if e.is_symlink():
                out.append((rel, "l", e.path))
            elif e.is_dir(follow_symlinks=False):
                if e.name in HASH_SKIP_DIRS:
                    continue
                out.append((rel, "d", e.path))
                visit(e.path, rel + "/")
            elif e.is_file(follow_symlinks=False):
                out.append((rel, "f", e.path))
            else:
                out.append((rel, "o", e.path))
            if len(out) > max_entries:
                raise _TooLarge(f"more than {max_entries} files and directories")

    visit(root, "")
    return out


# --------------------------------------------------------------------------- gathering


def _cuda_text(code: int | None) -> str | None:
    """NVML's CUDA driver version int as text: 12080 -> "12.8"."""
    return None if code is None else f"{code // 1000}.{code % 1000 // 10}"


def canonical_sha256(fp: Mapping[str, Any]) -> str:
    """sha256 of the canonical part (everything but ``sha256`` and ``meta``), as sorted JSON."""
    body = {k: v for k, v in fp.items() if k not in NON_CANONICAL}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def build(env: Mapping[str, Any], *, driver: str | None, driver_cuda: int | None,
          hashes: Mapping[str, str], watched: Sequence[str],
          meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Assemble a fingerprint from a :func:`preflight.probes.pyenv.gather` answer and node facts.

    Pure, so tests can build one from data.
    """
    raw_torch = env.get("torch")
    torch: Mapping[str, Any] = raw_torch if isinstance(raw_torch, dict) else {}
    fp: dict[str, Any] = {
        "fingerprint_version": FINGERPRINT_VERSION,
        "python": env.get("python"),
        "python_implementation": env.get("python_implementation"),
        "torch": torch.get("__version__"),
        "torch_git": torch.get("git_version"),
        "cuda": torch.get("cuda"),
        "cudnn": env.get("cudnn"),
        "nccl": env.get("nccl"),
        "driver": driver,
        "driver_cuda": _cuda_text(driver_cuda),
        "packages": dict(sorted((str(k), str(v)) for k, v in env.get("packages", {}).items())),
        "hashes": dict(sorted(hashes.items())),
    }
    fp["sha256"] = canonical_sha256(fp)
    fp["meta"] = {
        "watched": list(watched),
        "executable": env.get("executable"),
        "prefix": env.get("prefix"),
        "torch_version_py": torch.get("path"),
        "nccl_source": env.get("nccl_source"),
        "cudnn_source": env.get("cudnn_source"),
        "nccl4py": env.get("nccl4py"),
        **(meta or {}),
    }
    return fp


def gather(ctx: Context) -> dict[str, Any]:
    """The fingerprint of this node's training environment (``ctx.config.python`` or this one).

    Raises:
        pyenv.PyEnvError: ``--python`` names an interpreter that is missing, hangs or fails.
    """
    cfg = ctx.config
    watched = list(cfg.watched_packages)
    if cfg.python:
        timeout_s = min(PYENV_TIMEOUT_S, 0.8 * cfg.check_timeout_s)
        with activity(f"{cfg.python} describing its environment (deadline {timeout_s:g} s)"):
            env = pyenv.gather_foreign(cfg.python, watched, timeout_s=timeout_s, env=ctx.env)
    else:
        with activity("reading package metadata and ncclGetVersion"):
            env = pyenv.gather(watched)
    errors: list[str] = []
    driver = driver_cuda = None
    try:
        snap = ctx.gpus()
        driver, driver_cuda = snap.driver_version, snap.cuda_driver_version
        if not snap.available and snap.error:
            errors.append(f"driver: {snap.error}")
    except Exception as exc:  # the GPU checks report NVML trouble; the fingerprint goes on
        errors.append(f"driver: {type(exc).__name__}: {exc}")
    hashes = {}
    for path in cfg.hash_paths:
        with activity(f"hashing {path}"):
            hashes[path] = hash_path(path)
    return build(env, driver=driver, driver_cuda=driver_cuda, hashes=hashes, watched=watched,
                 meta={"host": socket.gethostname(), "created_s": round(time.time(), 3),
                       "preflight_version": __version__, "errors": errors})


# --------------------------------------------------------------------------- parsing


def parse(data: Any, *, source: str) -> dict[str, Any]:
    """Validate decoded JSON as a fingerprint; a ``preflight check --json`` report is accepted
    too (its ``fingerprint``).

    Raises:
        FingerprintError: naming ``source`` and what is wrong.
    """
    if isinstance(data, dict) and "results" in data and "fingerprint" in data:
        if data["fingerprint"] is None:
            raise FingerprintError(f"{source}: a preflight report without a fingerprint (was the "
                                   "versions check skipped?)")
        data = data["fingerprint"]
    if not isinstance(data, dict):
        raise FingerprintError(f"{source}: expected a JSON object (preflight fingerprint --json), "
                               f"got {type(data).__name__}")
    version = data.get("fingerprint_version")
    if version != FINGERPRINT_VERSION or isinstance(version, bool):
        raise FingerprintError(f"{source}: not a fingerprint: fingerprint_version is {version!r}, "
                               f"this preflight reads {FINGERPRINT_VERSION} (make it with "
                               "preflight fingerprint --json)")
    for key in ("packages", "hashes"):
        value = data.get(key, {})
        if not isinstance(value, dict) or not all(
                isinstance(v, str) for v in value.values()):
            raise FingerprintError(f"{source}: {key!r} must be an object of name -> version text")
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise FingerprintError(f"{source}: 'meta' must be an object")
    return data


def load(path: str | Path) -> dict[str, Any]:
    """Read and :func:`parse` a fingerprint file (``-`` is not special: name a file)."""
    from preflight.core.boundedio import BoundedReadError, read_bounded

    p = Path(path)
    try:
        # A regular file of bounded size within a deadline: /dev/zero or a FIFO is refused.
        text = read_bounded(p).decode("utf-8")
    except BoundedReadError as exc:
        raise FingerprintError(str(exc)) from None
    except FileNotFoundError:
        raise FingerprintError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise FingerprintError(f"{p}: is a directory, expected a fingerprint JSON file") from None
    except UnicodeDecodeError:
        raise FingerprintError(f"{p}: not UTF-8 text, expected a fingerprint JSON file") from None
    except OSError as exc:
        raise FingerprintError(f"{p}: cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FingerprintError(f"{p}: not valid JSON: {exc}") from None
    except RecursionError:
        raise FingerprintError(f"{p}: JSON nested too deeply") from None
    return parse(data, source=str(p))


# --------------------------------------------------------------------------- comparing

#: Top-level keys in the order differences are listed, with the name a person knows them by.
_LABELS = {"python": "python", "python_implementation": "python implementation",
           "torch": "torch", "torch_git": "torch git commit", "cuda": "CUDA (torch build)",
           "cudnn": "cuDNN", "nccl": "NCCL", "driver": "driver", "driver_cuda": "driver CUDA"}


@dataclass(frozen=True)
class Difference:
    """One thing that differs between fingerprints A and B.

    Attributes:
        key: what differs (a package name, ``NCCL``, ``sha256 of /srv/code``).
        a: its value in A; None when A lacks it.
        b: its value in B; None when B lacks it.
        kind: ``package``, ``hash`` or ``component``.
    """

    key: str
    a: str | None
    b: str | None
    kind: str = "component"

    def describe(self, a_label: str = "on A", b_label: str = "on B") -> str:
        """``scikit-learn: 1.3.2 on A, 1.5.0 on B``; ``only on B: deepspeed 0.14.0``."""
        if self.kind == "package" and self.a is None:
            return f"only {b_label}: {self.key} {self.b}"
        if self.kind == "package" and self.b is None:
            return f"only {a_label}: {self.key} {self.a}"
        return f"{self.key}: {_show(self.a)} {a_label}, {_show(self.b)} {b_label}"

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "kind": self.kind, "a": self.a, "b": self.b,
                "text": self.describe()}


def _show(value: str | None) -> str:
    if value is None:
        return "none"
    if len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12] + "…"
    return value


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    """Everything that differs between two parsed fingerprints, components first, then packages
    (by name), then hashes. Empty when they are the same.

    A package absent on one side is compared only when that side watched it (``meta.watched``):
    a name nobody asked the other node about is not a difference.
    """
    out: list[Difference] = []
    keys = [k for k in _LABELS if k in a or k in b]
    keys += sorted(k for k in {*a, *b} if k not in _LABELS and k not in NON_CANONICAL
                   and k not in ("fingerprint_version", "packages", "hashes"))
    for key in keys:
        va, vb = _text(a.get(key)), _text(b.get(key))
        if va != vb:
            out.append(Difference(_LABELS.get(key, key), va, vb))

    pa, pb = a.get("packages") or {}, b.get("packages") or {}
    wa, wb = _watched(a), _watched(b)
    for name in sorted({*pa, *pb}):
        va, vb = pa.get(name), pb.get(name)
        if va == vb:
            continue
        if (va is None and wa is not None and name not in wa) or \
                (vb is None and wb is not None and name not in wb):
            continue
        out.append(Difference(name, _text(va), _text(vb), "package"))

    ha, hb = a.get("hashes") or {}, b.get("hashes") or {}
    for path in sorted({*ha, *hb}):
        if ha.get(path) != hb.get(path):
            out.append(Difference(f"sha256 of {path}", _text(ha.get(path)),
                                  _text(hb.get(path)), "hash"))
    # torch is both a component (from torch/version.py) and usually a watched package: say once.
    seen: set[tuple[str, str | None, str | None]] = set()
    unique = []
    for d in out:
        if (d.key, d.a, d.b) not in seen:
            seen.add((d.key, d.a, d.b))
            unique.append(d)
    return unique


def _watched(fp: Mapping[str, Any]) -> set[str] | None:
    meta = fp.get("meta")
    watched = meta.get("watched") if isinstance(meta, dict) else None
    if isinstance(watched, list) and all(isinstance(w, str) for w in watched):
        return set(watched)
    return None


def summary(fp: Mapping[str, Any]) -> str:
    """One line a person reads: ``torch 2.11.0+cu128, CUDA 12.8, cuDNN 9.10.2.21, NCCL 2.28.9,
    driver 570.124.06, python 3.11.7, 7 packages``."""
    def v(key: str, none: str = "none") -> str:
        value = fp.get(key)
        return str(value) if value is not None else none

    cuda = v("cuda", "none (CPU build)" if fp.get("torch") else "none")
    return (f"torch {v('torch', 'not installed')}, CUDA {cuda}, cuDNN {v('cudnn')}, "
            f"NCCL {v('nccl', 'not found')}, driver {v('driver', 'none')}, python {v('python')}, "
            f"{_count(len(fp.get('packages') or {}))}")


def _count(n: int) -> str:
    return f"{n} watched package{'s' if n != 1 else ''}"
