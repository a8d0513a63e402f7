"""The real-script corpus of ``preflight lint`` (tests/lint/corpus, docs/lint.md).

``python -m tests.lint.corpus`` prints the per-rule table of docs/lint.md for the holdout split
(``--split tune`` or ``all`` for the others). The scripts themselves are not in the repository
(third-party code stays out of it), only their manifest: ``python -m tests.lint.corpus fetch``
downloads them at their pinned commits into ``tests/lint/corpus/cache/`` (or
``$PREFLIGHT_LINT_CORPUS``) and keeps a file only if its sha256 is the manifest's; the table
says how many entries were missing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from preflight.lint import RULES, lint_source

CORPUS = Path(__file__).parent / "corpus"
RAW = "https://raw.githubusercontent.com"


def cache_dir() -> Path:
    return Path(os.environ.get("PREFLIGHT_LINT_CORPUS") or CORPUS / "cache")


@dataclass(frozen=True)
class Entry:
    file: str
    split: str
    expected: frozenset[str]
    url: str
    repo: str
    path: str
    commit: str
    sha256: str
    batch: int = 1
    stored: str = "cache"
    split_override: str | None = None

    @property
    def location(self) -> Path:
        return cache_dir() / self.file

    def read(self) -> bytes | None:
        """The file's bytes, or None when it has not been fetched (or does not match its
        sha256)."""
        try:
            data = self.location.read_bytes()
        except OSError:
            return None
        return data if hashlib.sha256(data).hexdigest() == self.sha256 else None


@dataclass(frozen=True)
class Outcome:
    entry: Entry
    found: frozenset[str]
    sure: frozenset[str]


def entries() -> list[Entry]:
    out = []
    for line in (CORPUS / "manifest.jsonl").read_text().splitlines():
        raw = json.loads(line)
        out.append(Entry(raw["file"], raw["split"], frozenset(raw["expected"]), raw["url"],
                         raw["repo"], raw["path"], raw["commit"], raw["sha256"],
                         raw.get("batch", 1), raw.get("stored", "cache"),
                         raw.get("split_override")))
    return out


def recomputed_splits(items: list[Entry]) -> dict[str, str]:
    """The split by the recipe of corpus/README.md, batch by batch: units (repo:path) grouped
    by their first expected rule, sorted by sha256, alternately holdout / tune."""
    out: dict[str, str] = {}
    for batch in sorted({e.batch for e in items}):
        out.update(_recipe([e for e in items if e.batch == batch]))
    return out


def _recipe(items: list[Entry]) -> dict[str, str]:
    units: dict[str, list[Entry]] = {}
    for e in items:
        units.setdefault(f"{e.repo}:{e.path}", []).append(e)
    groups: dict[str, list[str]] = {}
    for unit, members in units.items():
        # The first rule each member was labelled with when the split was made (manifest
        # order keeps it first).
        first = next((sorted(m.expected)[0] for m in members if m.expected), "clean")
        groups.setdefault(first, []).append(unit)
    split: dict[str, str] = {}
    for group in groups.values():
        group.sort(key=lambda u: hashlib.sha256(u.encode()).hexdigest())
        for i, unit in enumerate(group):
            split[unit] = "holdout" if i % 2 == 0 else "tune"
    return {e.file: split[f"{e.repo}:{e.path}"] for e in items}


def run(split: str = "holdout", *, batches: frozenset[int] | None = None) -> list[Outcome]:
    """Lint every entry of the split (and of ``batches``, all by default) whose file is here."""
    out = []
    for e in entries():
        if (split != "all" and e.split != split) or (batches and e.batch not in batches):
            continue
        data = e.read()
        if data is None:
            continue
        findings = lint_source(data, e.file)
        out.append(Outcome(e, frozenset(f.rule for f in findings),
                           frozenset(f.rule for f in findings if f.sure)))
    return out


def missing(items: list[Entry] | None = None) -> list[Entry]:
    return [e for e in (entries() if items is None else items) if e.read() is None]


def skip_unless_fetched(items: list[Entry] | None = None) -> None:
    """Skip the calling test unless every entry (of ``items``, all by default) is here."""
    import pytest  # only the tests call this; ``python -m tests.lint.corpus`` does not need it

    items = entries() if items is None else items
    absent = missing(items)
    if absent:
        pytest.skip(f"{len(absent)} of {len(items)} corpus files not fetched into "
                    f"{cache_dir()} (python -m tests.lint.corpus fetch; it needs "
                    "raw.githubusercontent.com)")


def fetch(base: str = RAW, *, items: list[Entry] | None = None, timeout: float = 30.0) \
        -> list[str]:
    """Download every missing entry (``base/repo/commit/path``), keep those whose sha256
    matches; the problems, one line each."""
    problems = []
    target = cache_dir()
    target.mkdir(parents=True, exist_ok=True)
    for e in missing(items):
        url = f"{base.rstrip('/')}/{e.repo}/{e.commit}/{e.path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as answer:
                data = answer.read(8 * 1024 * 1024)
        except OSError as exc:
            problems.append(f"{e.file}: {url}: {exc}")
            continue
        if hashlib.sha256(data).hexdigest() != e.sha256:
            problems.append(f"{e.file}: {url}: sha256 differs from the manifest")
            continue
        (target / e.file).write_bytes(data)
    return problems


def table(outcomes: list[Outcome]) -> str:
    clean = [o for o in outcomes if not o.entry.expected]
    rows = ["| rule | mistakes in the split | found | found sure | clean scripts flagged |",
            "|---|---:|---:|---:|---:|"]
    total = found_total = 0
    for rule in RULES:
        mistakes = [o for o in outcomes if rule.id in o.entry.expected]
        found = sum(rule.id in o.found for o in mistakes)
        sure = sum(rule.id in o.sure for o in mistakes)
        flagged = sum(rule.id in o.found for o in clean)
        total += len(mistakes)
        found_total += found
        rows.append(f"| {rule.id} | {len(mistakes)} | {found} | {sure} | {flagged} of "
                    f"{len(clean)} |")
    any_flagged = sum(bool(o.found) for o in clean)
    rows.append(f"| all | {total} | {found_total} | | {any_flagged} of {len(clean)} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", nargs="?", choices=("table", "fetch"), default="table")
    ap.add_argument("--split", default="holdout", choices=("holdout", "tune", "all"))
    ap.add_argument("--base", default=RAW, help="where fetch downloads from (repo/commit/path)")
    args = ap.parse_args()
    if args.command == "fetch":
        problems = fetch(args.base)
        for line in problems:
            print(line, file=sys.stderr)
        return 1 if problems else 0
    print(table(run(args.split)))
    absent = missing()
    if absent:
        print(f"\n{len(absent)} entries not here (python -m tests.lint.corpus fetch): "
              + ", ".join(e.file for e in absent), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
