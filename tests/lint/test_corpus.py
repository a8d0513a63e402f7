"""The real-script corpus: the split is the one recorded before the rules were tuned, and the
rules meet their targets on the held-out half (docs/lint.md).

The manifest is checked always. The scripts are not in the repository: the tests that measure
them skip, saying so, until ``python -m tests.lint.corpus fetch`` has downloaded them (it needs
raw.githubusercontent.com)."""

from __future__ import annotations

import hashlib
import http.server
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lint.corpus import (
    CORPUS,
    Entry,
    entries,
    fetch,
    missing,
    recomputed_splits,
    run,
    skip_unless_fetched,
)

#: Per rule on the holdout split: (mistakes there, at least this many found). DDP101's miss is
#: HRNet/DEKR, whose sampler is built in another module: out of a one-file linter's sight.
#: Batch 1 alone, and all batches.
HOLDOUT_FOUND_BATCH_1 = {"DDP101": (4, 3), "DDP103": (3, 3), "DDP106": (1, 1)}
HOLDOUT_FOUND_ALL = {"DDP101": (5, 4), "DDP103": (4, 4), "DDP106": (1, 1), "DDP107": (1, 1)}


def test_every_manifest_entry_has_its_url_commit_and_hash() -> None:
    items = entries()
    assert len(items) >= 45 and len({e.file for e in items}) == len(items)
    for e in items:
        assert e.url == f"https://github.com/{e.repo}/blob/{e.commit}/{e.path}", e.file
        assert re.fullmatch(r"[0-9a-f]{40}", e.commit) and re.fullmatch(r"[0-9a-f]{64}", e.sha256)
        assert e.split in ("tune", "holdout") and e.stored == "cache", e.file
        assert re.fullmatch(r"[a-z0-9_-]+\.py\.txt", e.file.lower()), e.file
        if e.location.exists():
            assert e.read() is not None, f"{e.file}: fetched file does not match its sha256"
    # Third-party code stays out of the repository: no script beside the manifest.
    assert sorted(p.name for p in CORPUS.glob("*.py*")) == []


def test_split_is_the_recorded_recipe() -> None:
    """Each batch split by the recipe of corpus/README.md; a file that a rule was changed for
    after it was read moved to tune (never the other way), with the reason."""
    items = entries()
    recipe = recomputed_splits(items)
    for e in items:
        if e.split_override is None:
            assert e.split == recipe[e.file], e.file
        else:
            assert e.split_override == "tune" == e.split and recipe[e.file] == "holdout", e.file


def _check(outcomes: list, found_per_rule: dict[str, tuple[int, int]]) -> None:  # type: ignore[type-arg]
    mistakes = [(o, rule) for o in outcomes for rule in o.entry.expected]
    found = sum(rule in o.found for o, rule in mistakes)
    assert mistakes and found / len(mistakes) >= 0.8, (found, len(mistakes))
    assert {r for _o, r in mistakes} == set(found_per_rule)
    for rule, (count, least) in found_per_rule.items():
        hits = [o for o, r in mistakes if r == rule]
        assert len(hits) == count, rule
        assert sum(rule in o.found for o in hits) >= least, rule
    flagged = [o.entry.file for o in outcomes if not o.entry.expected and o.found]
    assert flagged == []


def test_holdout_targets_on_batch_1() -> None:
    skip_unless_fetched([e for e in entries() if e.batch == 1])
    _check(run("holdout", batches=frozenset({1})), HOLDOUT_FOUND_BATCH_1)


def test_holdout_targets_on_every_file() -> None:
    skip_unless_fetched()
    _check(run("holdout"), HOLDOUT_FOUND_ALL)


@pytest.mark.parametrize("split", ["tune", "holdout"])
def test_no_finding_beyond_the_label(split: str) -> None:
    """A mistake script gets no rule it was not labelled with (a wrong extra rule is a false
    positive too)."""
    skip_unless_fetched([e for e in entries() if e.split == split])
    extra = {o.entry.file: sorted(o.found - o.entry.expected) for o in run(split)
             if o.found - o.entry.expected}
    assert extra == {}


@pytest.fixture
def raw_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "raw"
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(root))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_keeps_only_files_matching_their_hash(raw_server: tuple[str, Path], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    base, root = raw_server
    cache = tmp_path / "cache"
    monkeypatch.setenv("PREFLIGHT_LINT_CORPUS", str(cache))
    good, bad = b"import os\n", b"tampered\n"
    items = []
    for name, served, expected in (("good.py.txt", good, good), ("bad.py.txt", bad, good),
                                   ("gone.py.txt", None, good)):
        commit = hashlib.sha1(name.encode()).hexdigest()
        if served is not None:
            (root / "o/r" / commit).mkdir(parents=True)
            (root / "o/r" / commit / "t.py").write_bytes(served)
        items.append(Entry(name, "tune", frozenset(), "", "o/r", "t.py", commit,
                           hashlib.sha256(expected).hexdigest(), 2, "cache"))
    problems = fetch(base, items=items, timeout=10)
    assert (cache / "good.py.txt").read_bytes() == good
    assert not (cache / "bad.py.txt").exists() and not (cache / "gone.py.txt").exists()
    assert len(problems) == 2 and "sha256 differs" in problems[0] and "404" in problems[1]
    assert missing(items) == items[1:]
