"""``preflight explain`` on the public-log corpus (tests/explain/corpus, docs/explain.md).

Every log runs; the issue-15 targets are asserted on the ``report`` part, which was split off
by URL hash before tuning and never tuned on. The dev part is held to the same bar so that a
regression in either shows.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from preflight.explain import Classifier, iter_blocks
from tests.explain.corpus import CORPUS, Entry, Outcome, entries, run, split_of, table

ENTRIES = entries()
OUTCOMES = {e.file: run(e) for e in ENTRIES}
DOC = Path(__file__).parents[2] / "docs" / "explain.md"


def _part(split: str, *, healthy: bool) -> list[Outcome]:
    return [o for o in OUTCOMES.values()
            if o.entry.split == split and (o.entry.expected is None) == healthy]


def test_corpus_is_as_large_as_issue_15_asks() -> None:
    failures = [e for e in ENTRIES if e.expected is not None]
    assert len(failures) >= 150
    assert len(ENTRIES) - len(failures) >= 20
    assert len({e.file for e in ENTRIES}) == len(ENTRIES)
    for e in ENTRIES:
        assert (CORPUS / e.file).is_file(), e.file
        assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+", e.url)


def test_split_is_the_documented_hash_of_the_url() -> None:
    for e in ENTRIES:
        assert e.split == split_of(e.url), e.file
    assert {"dev", "report"} == {e.split for e in ENTRIES}


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.file for e in ENTRIES])
def test_every_log_is_read_without_a_crash(entry: Entry) -> None:
    assert OUTCOMES[entry.file].crashed is None


@pytest.mark.parametrize("split", ["report", "dev"])
def test_issue_15_targets(split: str) -> None:
    fails = _part(split, healthy=False)
    recognised = sum(o.recognised for o in fails) / len(fails)
    first = sum(o.first_right for o in fails) / len(fails)
    misses = [(o.entry.file, o.entry.expected, o.reasons) for o in fails if not o.first_right]
    assert recognised >= 0.95, misses
    assert first >= 0.85, misses
    assert not [o.entry.file for o in _part(split, healthy=True) if o.flagged]


def test_docs_table_is_the_one_the_corpus_gives() -> None:
    """docs/explain.md carries the figures this corpus gives now (regenerate with
    ``python -m tests.explain.corpus``)."""
    assert table(list(OUTCOMES.values())) in DOC.read_text()


def test_manifest_lines_are_plain_json_objects() -> None:
    for line in (CORPUS / "manifest.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert set(row) == {"file", "url", "torch", "nccl", "expected", "split"}


@pytest.mark.parametrize("block", [7, 64])
def test_small_blocks_give_the_whole_file_answer(block: int) -> None:
    """NCCL's "Last error:" detail is found across block edges, below or above it."""
    for e in ENTRIES:
        c = Classifier()
        c.begin(e.file)
        data = (CORPUS / e.file).read_bytes()
        for b in iter_blocks(io.BytesIO(data), block_bytes=block, max_line_bytes=1 << 16):
            c.feed(b)
        assert tuple(f.reason for f in c.finish().findings) == OUTCOMES[e.file].reasons, e.file
