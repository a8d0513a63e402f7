"""``preflight explain`` on the fresh corpora: logs gathered by a rule written before any of their
threads was read, from threads used for no rule, each scored once on the rules of its time.

* ``fresh/`` (fresh/RULE.md): gathered after the first rules were frozen. Its score then guided
  a second round of rules, so it is a development set now: its floor is its first measure.
* ``fresh2/`` (fresh2/RULE.md): gathered by someone who did not change the rules while the
  second round was written, read only once that round was committed; its score then guided
  the third round, so it is a development set now too.
* ``fresh3/`` (fresh3/RULE.md): gathered the same way while the third round was written;
  a development set since its score guided the fourth.
* ``fresh4/`` (fresh4/RULE.md): gathered the same way while the fourth round was written; a
  development set since its score guided the fifth.
* ``fresh5/`` (fresh5/RULE.md): gathered the same way while the fifth round was written; a
  development set since its score guided the sixth.
* ``fresh6/`` (fresh6/RULE.md): asked in Chinese, gathered the same way while the sixth round was
  written; a development set since its score guided the seventh.
* ``fresh7/`` (fresh7/RULE.md): asked in Chinese again, gathered while the seventh round was
  written; a development set since its score guided the eighth.
* ``fresh8/`` (fresh8/RULE.md): asked in Chinese by project, gathered while the eighth round was
  written; never tuned on: it measures the rules as committed.
* ``fresh10/`` (fresh10/RULE.md): files of public repositories (FAQs, notes, kept logs), not
  their issue threads; scored once on the rules the eighth measured, a development set since its
  score guided the ninth round. (The ninth attempt, forums and blogs, found no log.)
* ``fresh11/`` (fresh11/RULE.md): files of public repositories again, gathered while the ninth
  round was written; a development set since its score guided the tenth.
* ``fresh12/`` (fresh12/RULE.md): the same source, gathered while the tenth round was written;
  a development set since its score guided the eleventh.
* ``fresh13/`` (fresh13/RULE.md): the same source, gathered while the eleventh round was
  written; a development set since its miss guided the twelfth.
* ``fresh14/`` (fresh14/RULE.md): the same source, mostly with text only a running program
  prints, gathered while the twelfth round was written; a development set since its misses
  guided the thirteenth.
* ``fresh15/`` (fresh15/RULE.md): the same source and kind of strings, gathered while the
  thirteenth round was written; a development set since its misses guided the fourteenth.
* ``fresh16/`` (fresh16/RULE.md): the same source and kind of strings, gathered while the
  fourteenth round was written; a development set since its misses guided the fifteenth.
* ``fresh17/`` (fresh17/RULE.md): the same source and kind of strings, gathered while the
  fifteenth round was written; a development set since its misses guided the sixteenth.
* ``fresh18/`` (fresh18/RULE.md): GitHub issue threads again, asked by situation, gathered (by
  two gatherers, each a share of the calls) while the sixteenth round was written; a development
  set since its miss guided the seventeenth.
* ``fresh19/`` (fresh19/RULE.md): files of public repositories, gathered at the same time as
  the eighteenth while the sixteenth round was written, read only once the seventeenth was
  committed; a development set since its misses guided the eighteenth.
* ``fresh20/`` (fresh20/RULE.md): issue threads asked by situation, 48 queries in four shares,
  gathered while the eighteenth round was written; a development set since its misses guided
  the nineteenth.
* ``fresh21/`` (fresh21/RULE.md): issue threads asked by situation, 48 other queries in four
  shares, gathered when the nineteenth round was committed and no rule was being changed; a
  development set since its misses guided the twentieth.
* ``fresh22/`` (fresh22/RULE.md): issue threads asked by situation, 48 other queries in four
  shares, gathered while the twentieth round was written; a development set since its misses
  guided the twenty-first.
* ``fresh23/`` (fresh23/RULE.md): issue threads asked by situation, 48 other queries in four
  shares, gathered while the twenty-first round was written; a development set since its
  misses guided the twenty-second.
* ``fresh24/`` (fresh24/RULE.md): issue threads asked by situation, 48 other queries in four
  shares, gathered while the twenty-second round was written; a development set since its
  misses guided the twenty-third.
* ``fresh25/`` (fresh25/RULE.md): issue threads asked by situation, 48 other queries in four
  shares, gathered while the twenty-third round was written; a development set since its
  misses guided the twenty-fourth.
* ``fresh26/`` (fresh26/RULE.md): issue threads asked by situation, 48 other queries in four
  shares, gathered while the twenty-fourth round was written; a development set since its
  misses guided the twenty-fifth.
* ``fresh27/`` (fresh27/RULE.md): issue threads asked by situation, 48 other queries in four
  shares, gathered while the twenty-fifth round was written; a development set since its
  misses guided the twenty-sixth.
* ``fresh28/`` (fresh28/RULE.md): issue threads asked by situation, 48 other queries in four
  shares, gathered while the twenty-sixth round was written; a development set since its
  misses guided the twenty-seventh.
* ``fresh29/`` (fresh29/RULE.md): issue threads asked by situation, 48 other queries in four
  shares, gathered once the twenty-seventh round was committed; a development set since its
  misses guided the twenty-eighth.
* ``fresh30/`` (fresh30/RULE.md): issue threads asked by situation, 48 other queries in four
  shares, gathered while the twenty-eighth round was written; a development set since its
  misses guided the twenty-ninth.
* ``fresh31/`` (fresh31/RULE.md): issue threads asked by situation, 48 other queries in four
  shares, gathered while the twenty-ninth round was written; a development set since its
  misses guided the thirtieth.
* ``fresh32/`` (fresh32/RULE.md): issue threads asked by situation, 48 other queries in four
  shares, gathered while the thirtieth round was written; a development set since its
  misses guided the thirty-first.
* ``fresh33/`` (fresh33/RULE.md): issue threads asked by situation, 48 other queries in four
  shares, gathered while the thirty-first round was written; a development set since its
  misses guided the thirty-second.
* ``fresh34/`` (fresh34/RULE.md): issue threads asked by situation, 48 other queries in four
  shares, gathered while the thirty-second round was written; never tuned on: it measures the
  rules as committed.

The figures are those of docs/explain.md. A floor is the score the corpus gave when it was first
scored, so that a change that loses ground shows; the targets (95 % recognised, 90 % right cause
first) are not met on either, and the strict xfail says so until they are (then it fails, and
the docs move with it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from preflight.explain import classify_texts

HERE = Path(__file__).parent
DOC = HERE.parents[1] / "docs" / "explain.md"


@dataclass(frozen=True)
class Corpus:
    name: str
    queries: int
    #: the score when first scored (2026-12-01 or -02): recognised, right cause first
    floor: tuple[float, float]
    healthy: int
    #: the line docs/explain.md gives its score in starts with this
    label: str


CORPORA = (
    Corpus("fresh", 16, (21 / 32, 21 / 32), 4, "fresh corpus"),
    Corpus("fresh2", 40, (25 / 36, 25 / 36), 3, "second fresh corpus"),
    Corpus("fresh3", 30, (16 / 24, 16 / 24), 1, "third fresh corpus"),
    Corpus("fresh4", 26, (5 / 15, 5 / 15), 0, "fourth fresh corpus"),
    Corpus("fresh5", 26, (4 / 10, 4 / 10), 0, "fifth fresh corpus"),
    Corpus("fresh6", 26, (11 / 18, 11 / 18), 0, "sixth fresh corpus"),
    Corpus("fresh7", 26, (3 / 8, 3 / 8), 0, "seventh fresh corpus"),
    Corpus("fresh8", 26, (5 / 10, 5 / 10), 2, "eighth fresh corpus"),
    Corpus("fresh10", 30, (10 / 19, 10 / 19), 2, "tenth fresh corpus"),
    Corpus("fresh11", 30, (10 / 18, 10 / 18), 4, "eleventh fresh corpus"),
    Corpus("fresh12", 30, (14 / 17, 14 / 17), 2, "twelfth fresh corpus"),
    Corpus("fresh13", 30, (7 / 8, 7 / 8), 2, "thirteenth fresh corpus"),
    Corpus("fresh14", 34, (20 / 31, 18 / 31), 1, "fourteenth fresh corpus"),
    Corpus("fresh15", 34, (10 / 16, 10 / 16), 0, "fifteenth fresh corpus"),
    Corpus("fresh16", 32, (5 / 10, 5 / 10), 1, "sixteenth fresh corpus"),
    Corpus("fresh17", 32, (5 / 7, 5 / 7), 3, "seventeenth fresh corpus"),
    Corpus("fresh18", 34, (9 / 11, 9 / 11), 0, "eighteenth fresh corpus"),
    Corpus("fresh19", 34, (5 / 8, 5 / 8), 0, "nineteenth fresh corpus"),
    Corpus("fresh20", 48, (13 / 22, 13 / 22), 3, "twentieth fresh corpus"),
    Corpus("fresh21", 48, (8 / 15, 8 / 15), 3, "twenty-first fresh corpus"),
    Corpus("fresh22", 48, (7 / 14, 7 / 14), 1, "twenty-second fresh corpus"),
    Corpus("fresh23", 48, (7 / 11, 7 / 11), 0, "twenty-third fresh corpus"),
    Corpus("fresh24", 48, (5 / 14, 5 / 14), 0, "twenty-fourth fresh corpus"),
    Corpus("fresh25", 48, (7 / 13, 7 / 13), 0, "twenty-fifth fresh corpus"),
    Corpus("fresh26", 48, (4 / 5, 4 / 5), 0, "twenty-sixth fresh corpus"),
    Corpus("fresh27", 48, (5 / 13, 5 / 13), 0, "twenty-seventh fresh corpus"),
    Corpus("fresh28", 48, (7 / 14, 7 / 14), 0, "twenty-eighth fresh corpus"),
    Corpus("fresh29", 48, (1 / 5, 1 / 5), 0, "twenty-ninth fresh corpus"),
    Corpus("fresh30", 48, (4 / 8, 4 / 8), 1, "thirtieth fresh corpus"),
    Corpus("fresh31", 48, (4 / 7, 4 / 7), 1, "thirty-first fresh corpus"),
    Corpus("fresh32", 48, (0 / 5, 0 / 5), 2, "thirty-second fresh corpus"),
    Corpus("fresh33", 48, (0 / 5, 0 / 5), 5, "thirty-third fresh corpus"),
    Corpus("fresh34", 48, (2 / 3, 2 / 3), 1, "thirty-fourth fresh corpus"),
)
#: Where a log came from: a GitHub issue thread, or (from the tenth corpus on) a file of a
#: public repository, by its path or by the id the stored index gives a file it does not name.
ADDRESS = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+"
                     r"|https://github\.com/[\w.-]+/[\w.-]+/blob/[\w.-]+/\S+|store:\d{1,15}")


@dataclass(frozen=True)
class Case:
    file: str
    url: str
    query: int
    expected: str | None
    reasons: tuple[str, ...]


def rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cases(corpus: Corpus) -> list[Case]:
    out = []
    for row in rows(HERE / corpus.name / "manifest.jsonl"):
        name = str(row["file"])
        expl = classify_texts([(name, (HERE / corpus.name / name).read_text())])
        expected = row["expected"]
        out.append(Case(name, str(row["url"]), int(str(row["query"])),
                        None if expected is None else str(expected),
                        tuple(f.reason for f in expl.findings)))
    return out


CASES = {c.name: cases(c) for c in CORPORA}


def failures(corpus: Corpus) -> list[Case]:
    return [c for c in CASES[corpus.name] if c.expected is not None]


def healthy(corpus: Corpus) -> list[Case]:
    return [c for c in CASES[corpus.name] if c.expected is None]


def score(corpus: Corpus) -> tuple[float, float]:
    failed = failures(corpus)
    recognised = sum(c.expected in c.reasons for c in failed) / len(failed)
    first = sum(c.reasons[:1] == (c.expected,) for c in failed) / len(failed)
    return recognised, first


def used_before(corpus: Corpus) -> set[str]:
    """Every thread of the corpora before it (the report corpus, then the fresh ones in order),
    the shape tests, and the threads its rule's author had seen (SEEN.md, its own and earlier)."""
    used: set[str] = set()
    earlier = ["corpus"] + [c.name for c in CORPORA[:CORPORA.index(corpus)]]
    for name in [*earlier, corpus.name]:
        seen = HERE / name / "SEEN.md"
        if seen.exists():
            used |= set(re.findall(r"https://github\.com/[^\s)]+", seen.read_text()))
    for name in earlier:
        for listed in ("manifest.jsonl", "skipped.jsonl", "rejected.jsonl"):
            if (HERE / name / listed).exists():
                used |= {str(r["url"]) for r in rows(HERE / name / listed)}
        excluded = HERE / name / "excluded.txt"
        if excluded.exists():
            used |= {line.strip() for line in excluded.read_text().splitlines()
                     if line.startswith("https://")}
    used |= set(re.findall(r"https://github\.com/\S+?(?=\")",
                           (HERE / "test_shapes.py").read_text()))
    return {u.rstrip("/").lower() for u in used}


@pytest.mark.parametrize("corpus", CORPORA, ids=lambda c: c.name)
def test_no_thread_was_used_for_a_rule_or_an_earlier_corpus(corpus: Corpus) -> None:
    urls = [c.url for c in CASES[corpus.name]]
    assert len(set(urls)) == len(urls)
    assert not {u.lower() for u in urls} & used_before(corpus)
    for c in CASES[corpus.name]:
        assert ADDRESS.fullmatch(c.url)
        assert c.url.startswith("https://github.com/") or corpus.name in (
            "fresh10", "fresh11", "fresh12", "fresh13", "fresh14", "fresh15", "fresh16",
            "fresh17", "fresh19")
        assert 1 <= c.query <= corpus.queries


@pytest.mark.parametrize("name", [c.name for c in CORPORA
                                  if (HERE / c.name / "rejected.jsonl").exists()])
def test_a_corpus_took_no_thread_it_had_set_aside(name: str) -> None:
    """A thread skipped (its excerpt lacks the cause) or rejected is not in the manifest."""
    folder = HERE / name
    aside = {str(r["url"]).lower() for listed in ("skipped.jsonl", "rejected.jsonl")
             for r in rows(folder / listed)}
    assert len(aside) > 100
    assert not {c.url.lower() for c in CASES[name]} & aside
    assert all("lacks" in r for r in rows(folder / "skipped.jsonl"))


@pytest.mark.parametrize("corpus", CORPORA, ids=lambda c: c.name)
def test_every_manifest_file_exists_and_every_file_is_listed(corpus: Corpus) -> None:
    assert (sorted(p.name for p in (HERE / corpus.name).glob("*.log"))
            == sorted(c.file for c in CASES[corpus.name]))


@pytest.mark.parametrize("corpus", CORPORA, ids=lambda c: c.name)
def test_the_score_does_not_drop_below_its_first_measure(corpus: Corpus) -> None:
    recognised, first = score(corpus)
    assert recognised >= corpus.floor[0] - 1e-9
    assert first >= corpus.floor[1] - 1e-9


@pytest.mark.parametrize("corpus", CORPORA, ids=lambda c: c.name)
def test_no_healthy_log_is_flagged(corpus: Corpus) -> None:
    assert [c.file for c in healthy(corpus) if c.reasons] == []
    assert len(healthy(corpus)) >= corpus.healthy


#: The corpora whose score guided no rule yet: the targets are measured on these only (on a
#: development set meeting them says nothing).
MEASURING = tuple(c for c in CORPORA if c.name in ("fresh8", "fresh34"))


@pytest.mark.xfail(strict=True, reason="the fresh corpus misses the targets: docs/explain.md "
                                       "lists its misses by shape")
@pytest.mark.parametrize("corpus", MEASURING, ids=lambda c: c.name)
def test_the_targets_are_met(corpus: Corpus) -> None:
    recognised, first = score(corpus)
    assert recognised >= 0.95 and first >= 0.90


@pytest.mark.parametrize("corpus", CORPORA, ids=lambda c: c.name)
def test_the_docs_give_the_score_the_corpus_gives(corpus: Corpus) -> None:
    recognised, first = score(corpus)
    flagged = sum(bool(c.reasons) for c in healthy(corpus))
    line = (f"{corpus.label}: {len(failures(corpus))} failure logs, {recognised:.0%} "
            f"recognised, {first:.0%} right cause first; {len(healthy(corpus))} healthy, "
            f"{flagged} flagged")
    assert re.search(rf"(?m)^{re.escape(line)}$", DOC.read_text())


#: The tenth corpus' rule, read literally, rejected logs whose only lines in common with earlier
#: logs were torchrun's fixed text: kept apart (fresh10/overlap/WHY.md) and scored apart.
OVERLAP = Corpus("fresh10/overlap", 30, (5 / 6, 5 / 6), 0,
                 "tenth fresh corpus, the logs its rule rejected for torchrun's fixed text")


def test_the_logs_set_apart_for_fixed_text_are_scored_apart() -> None:
    cases_apart = cases(OVERLAP)
    rejected = {str(r["url"]): r for r in rows(HERE / "fresh10" / "rejected.jsonl")}
    for c in cases_apart:  # each one the rule rejected as (a), for fixed text only
        assert rejected[c.url]["criterion"] == "a"
        assert "3 consecutive" in str(rejected[c.url]["why"])
        assert c.expected is not None
    assert sorted(p.name for p in (HERE / OVERLAP.name).glob("*.log")) == sorted(
        c.file for c in cases_apart)
    failed = [c for c in cases_apart if c.expected is not None]
    recognised = sum(c.expected in c.reasons for c in failed) / len(failed)
    first = sum(c.reasons[:1] == (c.expected,) for c in failed) / len(failed)
    assert recognised >= OVERLAP.floor[0] - 1e-9 and first >= OVERLAP.floor[1] - 1e-9
    line = (f"{OVERLAP.label}: {len(failed)} failure logs, {recognised:.0%} recognised, "
            f"{first:.0%} right cause first")
    assert re.search(rf"(?m)^{re.escape(line)}$", DOC.read_text())
