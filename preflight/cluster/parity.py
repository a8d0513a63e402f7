"""Parity: what must be equal on every node of a job, compared with the majority value. Pure.

A job whose nodes run different torch / NCCL / CUDA builds, see a different number of GPUs, or set
NCCL_* differently fails at init or, worse, hangs in the first collective (docs/cluster.md,
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html: NCCL_* must agree across
ranks). The node whose value differs from the majority is the suspect.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

#: Fingerprint fields compared as they are (fingerprint.build).
FINGERPRINT_KEYS = ("python", "python_implementation", "torch", "torch_git", "cuda", "cudnn",
                    "nccl", "driver", "driver_cuda")


def flatten(fingerprint: Mapping[str, Any] | None, facts: Mapping[str, Any]) -> dict[str, str]:
    """One flat ``key -> text`` map per node: fingerprint fields, ``package:NAME``,
    ``hash:PATH``, and the node facts (``gpu_model``, ``gpu_count``, ``mtu``, ``env:NCCL_X``)."""
    out: dict[str, str] = {}
    fp = fingerprint or {}
    for key in FINGERPRINT_KEYS:
        if fp.get(key) is not None:
            out[key] = str(fp[key])
    for name, version in (fp.get("packages") or {}).items():
        out[f"package:{name}"] = str(version)
    for path, digest in (fp.get("hashes") or {}).items():
        out[f"hash:{path}"] = str(digest)
    for key, value in facts.items():
        if key == "env" and isinstance(value, Mapping):
            out.update({f"env:{k}": str(v) for k, v in value.items()})
        elif value is not None:
            out[key] = str(value)
    return out


def compare(nodes: Mapping[int, Mapping[str, str]]) -> list[dict[str, Any]]:
    """Every key whose value is not the same on all nodes (absent counts as a value: "unset").

    Returns:
        ``{"key", "values": {"<node_rank>": value}, "majority": value or None on a tie,
        "odd_nodes": [node ranks whose value is not the majority]}``, sorted by key.
    """
    keys = sorted({k for flat in nodes.values() for k in flat})
    out = []
    for key in keys:
        values = {r: nodes[r].get(key) for r in sorted(nodes)}
        if len(set(values.values())) < 2:
            continue
        counts = Counter(values.values()).most_common()
        tie = len(counts) > 1 and counts[0][1] == counts[1][1]
        majority = None if tie else counts[0][0]
        odd = [r for r, v in values.items() if tie or v != majority]
        out.append({"key": key, "values": {str(r): v for r, v in values.items()},
                    "majority": majority, "odd_nodes": odd})
    return out


def describe(diff: Mapping[str, Any]) -> str:
    """``package:fakepkg differs: 1.0 on nodes 0, 1, 3 (majority); 2.0 on node 2``."""
    by_value: dict[str, list[str]] = {}
    for rank, value in diff["values"].items():
        by_value.setdefault("unset" if value is None else str(value), []).append(rank)
    majority = diff.get("majority")
    parts = []
    for value, ranks in sorted(by_value.items(), key=lambda kv: -len(kv[1])):
        noun = "nodes" if len(ranks) > 1 else "node"
        tag = " (majority)" if majority is not None and value == str(majority) else ""
        parts.append(f"{value} on {noun} {', '.join(ranks)}{tag}")
    return f"{diff['key']} differs: " + "; ".join(parts)
