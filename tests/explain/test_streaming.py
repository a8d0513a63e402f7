"""Block-wise reading gives the same answer as whole-file reading, in bounded memory."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from preflight.explain import classify_texts, explain_streams, iter_blocks
from preflight.explain.classifier import Classifier

LOGS = Path(__file__).parent / "logs"


def summary(expl: object) -> object:
    return [(f.reason, f.ranks, [(e.line, e.text) for e in f.evidence], f.count)
            for f in expl.findings], expl.ranks  # type: ignore[attr-defined]


@pytest.mark.parametrize("block", [7, 64, 300, 4096])
@pytest.mark.parametrize("name", ["shm_then_watchdog.log", "stall_watchdog.log",
                                  "no_socket_iface.log", "ib_error.log"])
def test_tiny_blocks_give_the_same_findings(name: str, block: int) -> None:
    data = (LOGS / name).read_bytes()
    whole = classify_texts([(name, data.decode())])
    c = Classifier()
    c.begin(name)
    for b in iter_blocks(io.BytesIO(data), block_bytes=block, max_line_bytes=1 << 16):
        c.feed(b)
    assert summary(c.finish()) == summary(whole)


def test_blocks_end_at_newlines_and_keep_every_byte() -> None:
    data = b"a\nbb\n" * 100 + b"no newline at end"
    blocks = list(iter_blocks(io.BytesIO(data), block_bytes=13))
    assert all(b.endswith(b"\n") for b in blocks)
    assert b"".join(blocks) == data + b"\n"


def test_a_line_without_newline_is_cut_so_memory_stays_bounded() -> None:
    data = b"x" * 10_000 + b" CUDA error: out of memory\n"
    blocks = list(iter_blocks(io.BytesIO(data), block_bytes=1000, max_line_bytes=2000))
    assert max(len(b) for b in blocks) <= 3001
    assert b"".join(blocks).replace(b"\n", b"") == data.replace(b"\n", b"")


def test_evidence_is_capped_on_a_huge_number_of_matches() -> None:
    line = b"[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
    expl = explain_streams([("big", io.BytesIO(line * 50_000))])
    f = expl.findings[0]
    assert f.count == 50_000 and len(f.evidence) == 5 and f.ranks == (1,)
    assert expl.lines == 50_000
