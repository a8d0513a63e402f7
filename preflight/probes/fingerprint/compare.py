"""Read a fingerprint file and say what differs between two fingerprints (pure)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preflight.probes.fingerprint.gather import FINGERPRINT_VERSION, NON_CANONICAL


class FingerprintError(ValueError):
    """A fingerprint file is unreadable or not a fingerprint; the message names the file."""


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
