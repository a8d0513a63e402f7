"""The real-script corpus: the split is the one recorded before the rules existed, and the
rules meet their targets on the held-out half (docs/lint.md)."""

from __future__ import annotations

import pytest

from tests.lint.corpus import CORPUS, entries, recomputed_splits, run

#: Per rule on the holdout split: (mistakes there, at least this many found). DDP101's miss is
#: HRNet/DEKR, whose sampler is built in another module: out of a one-file linter's sight.
HOLDOUT_FOUND = {"DDP101": (4, 3), "DDP103": (3, 3), "DDP106": (1, 1)}


def test_every_manifest_entry_has_its_file_url_and_commit() -> None:
    items = entries()
    assert len(items) >= 30
    for e in items:
        assert (CORPUS / e.file).is_file(), e.file
        assert e.url.startswith(f"https://github.com/{e.repo}/blob/")
        commit = e.url.split("/blob/")[1].split("/")[0]
        assert len(commit) == 40, e.url
        assert e.split in ("tune", "holdout")


def test_split_is_the_recorded_recipe() -> None:
    items = entries()
    assert {e.file: e.split for e in items} == recomputed_splits(items)


def test_holdout_targets() -> None:
    outcomes = run("holdout")
    mistakes = [(o, rule) for o in outcomes for rule in o.entry.expected]
    found = sum(rule in o.found for o, rule in mistakes)
    assert mistakes and found / len(mistakes) >= 0.8, (found, len(mistakes))
    for rule, (count, least) in HOLDOUT_FOUND.items():
        hits = [o for o, r in mistakes if r == rule]
        assert len(hits) == count, rule
        assert sum(rule in o.found for o in hits) >= least, rule
    flagged = [o.entry.file for o in outcomes if not o.entry.expected and o.found]
    assert flagged == []


@pytest.mark.parametrize("split", ["tune", "holdout"])
def test_no_finding_beyond_the_label(split: str) -> None:
    """A mistake script gets no rule it was not labelled with (a wrong extra rule is a false
    positive too)."""
    extra = {o.entry.file: sorted(o.found - o.entry.expected) for o in run(split)
             if o.found - o.entry.expected}
    assert extra == {}
