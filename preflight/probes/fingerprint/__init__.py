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

Gathering: :mod:`.gather` (the target interpreter through :mod:`preflight.probes.pyenv`, the
driver, the hashes of :mod:`.hashing`); reading and comparing, pure: :mod:`.compare`.
"""

from __future__ import annotations

from preflight.probes.fingerprint.compare import (
    Difference,
    FingerprintError,
    diff,
    load,
    parse,
    summary,
)
from preflight.probes.fingerprint.gather import (
    FINGERPRINT_VERSION,
    NON_CANONICAL,
    PYENV_TIMEOUT_S,
    build,
    canonical_sha256,
    gather,
)
from preflight.probes.fingerprint.hashing import (
    HASH_MAX_BYTES,
    HASH_MAX_FILES,
    HASH_SKIP_DIRS,
    hash_path,
)

__all__ = ["FINGERPRINT_VERSION", "HASH_MAX_BYTES", "HASH_MAX_FILES", "HASH_SKIP_DIRS",
           "NON_CANONICAL", "PYENV_TIMEOUT_S", "Difference", "FingerprintError", "build",
           "canonical_sha256", "diff", "gather", "hash_path", "load", "parse", "summary"]
