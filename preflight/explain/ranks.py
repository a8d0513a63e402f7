"""Which rank printed a line, and how far each rank got (pure functions over decoded lines).

Prefixes understood:

* ``[rank3]:``: PyTorch's own prefix on C++ log lines and tracebacks (global rank);
* ``[Rank 3]`` or ``[PG ID 0 PG GUID 0(default_pg) Rank 3]``: inside ProcessGroupNCCL messages;
* ``[rank: 3]``: Lightning's rank-prefixed messages;
* ``[default3]:``: torchrun's ``--tee``/``--log-dir`` prefix ``[${role_name}${local_rank}]:``
  (torch/distributed/elastic/agent/server/local_elastic_agent.py): the LOCAL rank, equal to the
  global rank on a single node;
* ``host:pid:tid [3] NCCL``: NCCL's prefix, where ``[3]`` is the CUDA device, not the rank; the
  classifier maps ``host:pid`` to a rank through NCCL's own ``ncclCommInitRank ... rank R nranks N``
  line and falls back to the device only for single-host logs.

Progress: a hang is located by the rank that "never printed iteration 10".
A progress line is a rank-prefixed line with ``iteration N``, ``iter N``, ``step N`` or
``epoch N`` (any case, ``=``/``:``/``#`` allowed, Megatron's ``iteration  10/ 500``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: torchrun's role prefix, optionally followed by PyTorch's ``[rankN]:``; anchored at line start.
ROLE_PREFIX = re.compile(r"\[([A-Za-z_][A-Za-z_-]{0,30})(\d{1,7})\]:")
TORCH_RANK = re.compile(r"\[rank(\d{1,7})\]:")
PG_RANK = re.compile(r"\bRank (\d{1,7})\]")
#: Lightning's ``rank_prefixed_message``: ``[rank: 2] Child process with PID ...``.
LIGHTNING_RANK = re.compile(r"\[rank: (\d{1,7})\] ")
NCCL_PREFIX = re.compile(r"([\w.-]{1,253}):(\d{1,10}):\d{1,10} \[(\d{1,4})\] ")
NCCL_INIT = re.compile(r"\brank (\d{1,7}) n[Rr]anks (\d{1,7})\b")
WORLD_SIZES = re.compile(r"global_world_sizes=\[(\d{1,7})")
SUMMARY_RANK = re.compile(r"rank\s{0,8}: (\d{1,7}) \(local_rank: (\d{1,7})\)")
PROGRESS = re.compile(r"(?i)\b(?:iteration|iter|step|epoch)\b[\s:=#\[]{0,8}(\d{1,12})")

#: What ``Rule`` regexes and rank parsing look at: the head of a line. Error text is short; a
#: megabyte-long garbage line must not cost more than this.
MAX_MATCH_CHARS = 4096


@dataclass(frozen=True)
class LineRank:
    """Who printed a line.

    Attributes:
        rank: the rank, or None when the line says nothing about it.
        nccl: ``(host, pid, cuda_device)`` when the line has NCCL's prefix (to resolve later).
    """

    rank: int | None
    nccl: tuple[str, int, int] | None = None


def strip_role_prefix(line: str) -> tuple[int | None, str]:
    """Split torchrun's ``[default3]:`` prefix off a line: (local rank or None, rest)."""
    m = ROLE_PREFIX.match(line)
    if m is None or m.group(1) == "rank":
        return None, line
    return int(m.group(2)), line[m.end():]


def line_rank(line: str) -> LineRank:
    """The rank a line belongs to, most specific prefix first.

    ``[rankN]:`` (global) beats ``[Rank N]`` beats torchrun's ``[defaultN]:`` (local); an NCCL
    line without any of them yields its ``(host, pid, device)`` to be resolved by the caller.
    """
    role, rest = strip_role_prefix(line)
    m = TORCH_RANK.match(rest)
    if m:
        return LineRank(int(m.group(1)))
    m = PG_RANK.search(rest, 0, MAX_MATCH_CHARS)
    if m:
        return LineRank(int(m.group(1)))
    m = LIGHTNING_RANK.search(rest, 0, 200)
    if m:
        return LineRank(int(m.group(1)))
    if role is not None:
        return LineRank(role)
    m = NCCL_PREFIX.match(rest)
    if m:
        return LineRank(None, (m.group(1), int(m.group(2)), int(m.group(3))))
    return LineRank(None)


def progress_of(line: str) -> int | None:
    """The iteration / step / epoch number a line reports, or None."""
    m = PROGRESS.search(line, 0, MAX_MATCH_CHARS)
    return int(m.group(1)) if m else None


def plural(word: str, ranks: list[int] | tuple[int, ...] | set[int]) -> str:
    """``plural("rank", [3])`` -> ``"rank 3"``; ``[0, 1, 2]`` -> ``"ranks 0-2"``."""
    return f"{word}{'s' if len(set(ranks)) != 1 else ''} {compress(ranks)}"


def compress(ranks: list[int] | tuple[int, ...] | set[int]) -> str:
    """``[0,1,2,3,5]`` -> ``"0-3,5"`` for messages."""
    out: list[str] = []
    run: list[int] = []
    for r in sorted(set(ranks)):
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [r]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)
