"""How far each rank got: the last ``iteration N`` / ``step N`` / ``epoch N`` it printed.

A hang is located by the rank that "never printed iteration 10". Per block only the LAST progress
line of each rank matters, so the block is read backwards, and only at lines that hold a progress
word: the three words are found with ``bytes.rfind`` in the lower-cased block, each line once, and
the walk stops when every rank prefix of the block is resolved. Work per block is linear in its
size whatever the number of ranks (8 or 8,192 distinct prefixes cost the same passes); a rank
that printed no progress in the block costs nothing beyond those passes.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from preflight.explain.ranks import MAX_MATCH_CHARS, line_rank

#: A rank prefix at line start: torchrun's ``[default3]:`` or PyTorch's ``[rank3]:``.
KEY = re.compile(rb"\[(?:rank|[A-Za-z_][A-Za-z_-]{0,30})\d{1,7}\]:")
_WORDS = (b"iter", b"step", b"epoch")
_DIGITS = re.compile(rb"\d{1,7}")
#: ranks.PROGRESS on bytes: the line is not decoded unless its rank needs the text.
_PROGRESS = re.compile(rb"(?i)\b(?:iteration|iter|step|epoch)\b[\s:=#\[]{0,8}(\d{1,12})")


class ProgressTracker:
    """Last progress value per rank over all blocks fed.

    Args:
        max_ranks: ranks kept; a further rank is counted in ``capped``.
        see: called with every rank a block's prefixes name.
    """

    def __init__(self, max_ranks: int, see: Callable[[int], None]) -> None:
        self.max_ranks = max_ranks
        self.progress: dict[int, int] = {}
        self.capped = 0
        self._see = see

    def track(self, block: bytes, source_rank: int | None, decode: Callable[[bytes], str]
              ) -> None:
        """Record each rank's last progress line in ``block`` (whole lines)."""
        keys: set[bytes] = set(KEY.findall(block)) if b"]:" in block else set()
        full = len(self.progress) >= self.max_ranks
        untracked: list[bytes] = []
        for key in keys:
            m = _DIGITS.search(key)
            if m:
                rank = int(m.group(0))
                self._see(rank)
                if full and rank not in self.progress:
                    untracked.append(key)  # beyond the cap: its progress is not kept
        self.capped += len(untracked)
        keys.difference_update(untracked)
        if source_rank is not None:
            keys.add(b"")
        if not keys:
            return
        low = block.lower()
        pos = {w: low.rfind(w) for w in _WORDS}
        todo = set(keys)
        while todo:
            hit = max(pos.values())
            if hit < 0:
                break
            start = block.rfind(b"\n", 0, hit) + 1
            for w, p in pos.items():
                if p >= start:
                    pos[w] = low.rfind(w, 0, start)
            end = block.find(b"\n", hit)
            self._line(block, (start, end if end >= 0 else len(block)), todo, source_rank,
                       decode)

    def _line(self, block: bytes, span: tuple[int, int], todo: set[bytes],
              source_rank: int | None, decode: Callable[[bytes], str]) -> None:
        start, end = span
        chain: list[bytes] = []
        pos = start
        while len(chain) < 3:
            m = KEY.match(block, pos)
            if m is None:
                break
            chain.append(m.group(0))
            pos = m.end()
        if not chain:
            chain = [b""]
        if not todo.intersection(chain):
            return
        m = _PROGRESS.search(block, start, min(end, start + MAX_MATCH_CHARS))
        if m is None:
            return
        value = int(m.group(1))
        rank: int | None = None
        for key in chain:
            if key.startswith(b"[rank"):  # PyTorch's [rankN]: is the global rank (line_rank)
                rank = int(key[5:-2])
                break
        else:
            found = line_rank(decode(block[start:end])).rank
            rank = found if found is not None else source_rank
        todo.difference_update(chain)
        if rank is None:
            return
        if rank in self.progress or len(self.progress) < self.max_ranks:
            self.progress[rank] = value


def stalled_and_silent(progress: dict[int, int], seen: set[int]
                       ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Ranks behind the furthest one (earliest stop first), and ranks seen that printed no
    progress while at least two others did (a log where only rank 0 prints accuses nobody)."""
    if not progress:
        return (), ()
    top = max(progress.values())
    stalled = tuple(sorted((r for r, v in progress.items() if v < top),
                           key=lambda r: (progress[r], r)))
    never = tuple(sorted(seen - set(progress))) if len(progress) >= 2 else ()
    return stalled, never
