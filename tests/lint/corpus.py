"""The real-script corpus of ``preflight lint`` (tests/lint/corpus, docs/lint.md).

``python -m tests.lint.corpus`` prints the per-rule table of docs/lint.md for the holdout split
(``--split tune`` or ``all`` for the others).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from preflight.lint import RULES, lint_source

CORPUS = Path(__file__).parent / "corpus"


@dataclass(frozen=True)
class Entry:
    file: str
    split: str
    expected: frozenset[str]
    url: str
    repo: str
    path: str


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
                         raw["repo"], raw["path"]))
    return out


def recomputed_splits(items: list[Entry]) -> dict[str, str]:
    """The split by the recipe of corpus/README.md: units (repo:path) grouped by their first
    expected rule, sorted by sha256, alternately holdout / tune."""
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


def run(split: str = "holdout") -> list[Outcome]:
    out = []
    for e in entries():
        if split != "all" and e.split != split:
            continue
        findings = lint_source((CORPUS / e.file).read_bytes(), e.file)
        out.append(Outcome(e, frozenset(f.rule for f in findings),
                           frozenset(f.rule for f in findings if f.sure)))
    return out


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--split", default="holdout", choices=("holdout", "tune", "all"))
    print(table(run(ap.parse_args().split)))


if __name__ == "__main__":
    main()
