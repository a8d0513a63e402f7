"""``preflight explain`` on the fresh corpus (tests/explain/fresh): logs gathered after the rules
were frozen, by the rule in fresh/RULE.md, from threads used for no rule, never tuned on.

The figures are those of docs/explain.md. The floor below is the score the corpus gave when it was
first scored, so that a change that loses ground shows; the targets (95 % recognised, 90 % right
cause first) are not met, and the strict xfail says so until they are (then it fails, and the
floor moves up with the docs).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from preflight.explain import classify_texts

FRESH = Path(__file__).parent / "fresh"
DOC = Path(__file__).parents[2] / "docs" / "explain.md"
#: The score when first scored (2026-12-01): 21 of 32 recognised, 21 first.
FLOOR_RECOGNISED, FLOOR_FIRST = 21 / 32, 21 / 32


@dataclass(frozen=True)
class Case:
    file: str
    url: str
    query: int
    expected: str | None
    reasons: tuple[str, ...]


def cases() -> list[Case]:
    out = []
    for line in (FRESH / "manifest.jsonl").read_text().splitlines():
        row = json.loads(line)
        expl = classify_texts([(row["file"], (FRESH / row["file"]).read_text())])
        out.append(Case(row["file"], row["url"], row["query"], row["expected"],
                        tuple(f.reason for f in expl.findings)))
    return out


CASES = cases()
FAILURES = [c for c in CASES if c.expected is not None]
HEALTHY = [c for c in CASES if c.expected is None]


def score() -> tuple[float, float]:
    recognised = sum(c.expected in c.reasons for c in FAILURES) / len(FAILURES)
    first = sum(c.reasons[:1] == (c.expected,) for c in FAILURES) / len(FAILURES)
    return recognised, first


def test_no_fresh_thread_was_used_for_a_rule_or_the_first_corpus() -> None:
    used = {json.loads(line)["url"] for line in
            (FRESH.parent / "corpus" / "manifest.jsonl").read_text().splitlines()}
    used |= set(re.findall(r"https://github\.com/\S+?(?=\")",
                           (FRESH.parent / "test_shapes.py").read_text()))
    used |= {line.strip() for line in (FRESH / "excluded.txt").read_text().splitlines()
             if line.startswith("https://")}
    urls = [c.url for c in CASES]
    assert len(set(urls)) == len(urls)
    assert not set(urls) & used
    for c in CASES:
        assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+", c.url)
        assert 1 <= c.query <= 16


def test_every_manifest_file_exists_and_every_file_is_listed() -> None:
    assert sorted(p.name for p in FRESH.glob("*.log")) == sorted(c.file for c in CASES)


def test_the_score_does_not_drop_below_its_first_measure() -> None:
    recognised, first = score()
    assert recognised >= FLOOR_RECOGNISED - 1e-9
    assert first >= FLOOR_FIRST - 1e-9


def test_no_healthy_log_is_flagged() -> None:
    assert [c.file for c in HEALTHY if c.reasons] == []
    assert len(HEALTHY) >= 4


@pytest.mark.xfail(strict=True, reason="the fresh corpus misses the targets: docs/explain.md "
                                       "lists its misses by shape")
def test_the_targets_are_met() -> None:
    recognised, first = score()
    assert recognised >= 0.95 and first >= 0.90


def test_the_docs_give_the_score_the_corpus_gives() -> None:
    recognised, first = score()
    text = DOC.read_text()
    assert (f"fresh corpus: {len(FAILURES)} failure logs, {recognised:.0%} recognised, "
            f"{first:.0%} right cause first; {len(HEALTHY)} healthy, "
            f"{sum(bool(c.reasons) for c in HEALTHY)} flagged") in text
