"""How far each rank got: the last ``iteration N`` / ``step N`` / ``epoch N`` it printed.

A hang is located by the rank that "never printed iteration 10". Only the LAST progress line of
each rank matters, so blocks are gathered into a window (``WINDOW_BYTES``) and the window is read
backwards, newest block first, and only at lines that hold a progress word: the three words are
found with ``bytes.rfind`` in the lower-cased block, each line once, and the walk stops when
every rank prefix of the window is resolved. Work is linear in the input whatever the number of
ranks: with 8 ranks the walk ends in the last lines of the newest block; with 8,192 it reads
about one line per tracked rank per window, and a larger window makes that share smaller. A rank
that printed no progress costs nothing beyond the passes.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from preflight.explain.ranks import MAX_MATCH_CHARS, line_rank

#: A rank prefix at line start: torchrun's ``[default3]:`` or PyTorch's ``[rank3]:``.
KEY = re.compile(rb"\[(?:rank|[A-Za-z_][A-Za-z_-]{0,30})\d{1,7}\]:")
_WORDS = (b"iter", b"step", b"epoch")
_DIGITS = re.compile(rb"\d{1,7}")
#: Blocks read together backwards (bounded memory: at most this much is held).
WINDOW_BYTES = 16 << 20
_ONE = rb"(\[(?:rank|[A-Za-z_][A-Za-z_-]{0,30})\d{1,7}\]:)"
#: Up to three prefixes at a line's start (``[default3]:[rank3]:``), one regex call.
_CHAIN = re.compile(_ONE + b"(?:" + _ONE + b"(?:" + _ONE + b")?)?")
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
        #: prefix -> its rank, for the prefixes met so far (bounded): a rank is seen once.
        self._key_rank: dict[bytes, int] = {}
        self._window: list[tuple[bytes, set[bytes], int | None]] = []
        self._window_bytes = 0
        self._decode: Callable[[bytes], str] = bytes.decode
        self._last_keys: set[bytes] = set()
        self._last_untracked: list[bytes] = []

    def track(self, block: bytes, source_rank: int | None, decode: Callable[[bytes], str]
              ) -> None:
        """Take ``block`` (whole lines of one source) into the window; read the window when it
        is full. ``flush`` reads what is left (at the end of a source)."""
        keys: set[bytes] = set(KEY.findall(block)) if b"]:" in block else set()
        if keys:
            self._drop_untracked(keys)
        if source_rank is not None:
            keys.add(b"")
        if not keys:
            return
        self._decode = decode
        self._window.append((block, keys, source_rank))
        self._window_bytes += len(block)
        if self._window_bytes >= WINDOW_BYTES:
            self.flush()

    def flush(self) -> None:
        """Record each rank's last progress line in the window, newest block first."""
        window, self._window, self._window_bytes = self._window, [], 0
        todo: set[bytes] = set()
        for _, keys, _ in window:
            todo |= keys
        for block, keys, source_rank in reversed(window):
            if not todo:
                break
            if not todo.isdisjoint(keys):
                self._walk(block, todo, source_rank)

    def _walk(self, block: bytes, todo: set[bytes], source_rank: int | None) -> None:
        decode = self._decode
        low = block.lower()
        p_iter, p_step, p_epoch = low.rfind(b"iter"), low.rfind(b"step"), low.rfind(b"epoch")
        progress, room = self.progress, self.max_ranks
        while todo:
            hit = max(p_iter, p_step, p_epoch)
            if hit < 0:
                break
            start = block.rfind(b"\n", 0, hit) + 1
            if p_iter >= start:
                p_iter = low.rfind(b"iter", 0, start)
            if p_step >= start:
                p_step = low.rfind(b"step", 0, start)
            if p_epoch >= start:
                p_epoch = low.rfind(b"epoch", 0, start)
            m = _CHAIN.match(block, start)
            chain = [k for k in m.groups() if k is not None] if m else [b""]
            if not any(k in todo for k in chain):
                continue
            end = block.find(b"\n", hit)
            if end < 0:
                end = len(block)
            v = _PROGRESS.search(block, start, min(end, start + MAX_MATCH_CHARS))
            if v is None:
                continue
            rank: int | None = None
            for key in chain:
                if key.startswith(b"[rank"):  # PyTorch's [rankN]: is the global rank
                    rank = int(key[5:-2])
                    break
            else:
                found = line_rank(decode(block[start:end])).rank
                rank = found if found is not None else source_rank
            todo.difference_update(chain)
            if rank is not None and (rank in progress or len(progress) < room):
                progress[rank] = int(v.group(1))

    def _drop_untracked(self, keys: set[bytes]) -> None:
        """See every rank the prefixes name; drop the prefixes of ranks past the cap (their
        progress is not kept, so their lines are not read)."""
        if keys == self._last_keys:  # the same prefixes as the block before: the same answer
            self.capped += len(self._last_untracked)
            keys.difference_update(self._last_untracked)
            return
        cache = self._key_rank
        full = len(self.progress) >= self.max_ranks
        # the answer only holds while no rank can join: cache it once the cap is reached
        self._last_keys = set(keys) if full else set()
        untracked: list[bytes] = []
        for key in keys:
            rank = cache.get(key)
            if rank is None:
                m = _DIGITS.search(key)
                if m is None:
                    continue
                rank = int(m.group(0))
                self._see(rank)
                if len(cache) < 4 * self.max_ranks:
                    cache[key] = rank
            if full and rank not in self.progress:
                untracked.append(key)
        self._last_untracked = untracked
        self.capped += len(untracked)
        keys.difference_update(untracked)


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
