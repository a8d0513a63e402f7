"""The public-log corpus of ``preflight explain`` (tests/explain/corpus, docs/explain.md).

Each log is an excerpt of a failure (or a healthy / irrelevant run) that someone posted in a
public issue thread; ``manifest.jsonl`` names its source URL, the torch / NCCL versions when the
thread stated them, the reason a person would name first (``expected``, null for a log that
must give no finding) and its ``split``. The split is a function of the URL alone (``split_of``),
fixed before the classifier was tuned: only the ``dev`` part was looked at while tuning, the
``report`` part gives the figures in docs/explain.md.

``python -m tests.explain.corpus`` prints those figures as the markdown table of docs/explain.md.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from preflight.explain import classify_texts

CORPUS = Path(__file__).parent / "corpus"
SPLITS = ("dev", "report")


def split_of(url: str) -> str:
    """``report`` when the first 32 bits of sha256(url) are even, else ``dev``."""
    return "report" if int(hashlib.sha256(url.encode()).hexdigest()[:8], 16) % 2 == 0 else "dev"


@dataclass(frozen=True)
class Entry:
    file: str
    url: str
    expected: str | None
    split: str
    torch: str | None
    nccl: str | None


@dataclass(frozen=True)
class Outcome:
    entry: Entry
    reasons: tuple[str, ...]
    crashed: str | None

    @property
    def recognised(self) -> bool:
        return self.entry.expected is not None and self.entry.expected in self.reasons

    @property
    def first_right(self) -> bool:
        return bool(self.reasons) and self.reasons[0] == self.entry.expected

    @property
    def flagged(self) -> bool:
        return self.entry.expected is None and bool(self.reasons)


def entries() -> list[Entry]:
    rows = (json.loads(line) for line in (CORPUS / "manifest.jsonl").read_text().splitlines())
    return [Entry(r["file"], r["url"], r["expected"], r["split"], r["torch"], r["nccl"])
            for r in rows]


def run(entry: Entry) -> Outcome:
    path = CORPUS / entry.file
    try:
        expl = classify_texts([(entry.file, path.read_text(encoding="utf-8"))])
    except Exception as exc:
        return Outcome(entry, (), f"{type(exc).__name__}: {exc}")
    return Outcome(entry, tuple(f.reason for f in expl.findings), None)


def pct(n: int, d: int) -> str:
    return f"{100 * n / d:.0f}%" if d else "-"


def table(outcomes: list[Outcome]) -> str:
    """Markdown: per expected class, report and dev figures side by side."""
    def figures(split: str, cls: str | None) -> tuple[int, int, int]:
        part = [o for o in outcomes if o.entry.split == split and o.entry.expected is not None
                and (cls is None or o.entry.expected == cls)]
        return len(part), sum(o.recognised for o in part), sum(o.first_right for o in part)

    classes = sorted({o.entry.expected for o in outcomes if o.entry.expected is not None})
    lines = ["| class | report: logs | recognised | right cause first | dev: logs | recognised"
             " | right cause first |", "|---|---:|---:|---:|---:|---:|---:|"]
    for cls in [*classes, None]:
        rn, rr, rf = figures("report", cls)
        dn, dr, df = figures("dev", cls)
        name = f"`{cls}`" if cls else "**all failure logs**"
        lines.append(f"| {name} | {rn} | {pct(rr, rn)} | {pct(rf, rn)} | {dn} | {pct(dr, dn)} "
                     f"| {pct(df, dn)} |")
    for split in SPLITS:
        healthy = [o for o in outcomes if o.entry.split == split and o.entry.expected is None]
        crashes = [o for o in outcomes if o.entry.split == split and o.crashed]
        lines.append(f"\n{split}: {len(healthy)} healthy/irrelevant logs, "
                     f"{sum(o.flagged for o in healthy)} flagged; {len(crashes)} crashes")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    outcomes = [run(e) for e in entries()]
    print(table(outcomes))
    if "-v" in argv:
        split = "dev" if "--dev" in argv else None
        for o in outcomes:
            if split and o.entry.split != split:
                continue
            if not o.first_right and not (o.entry.expected is None and not o.reasons):
                print(f"{o.entry.split:6} {o.entry.file:40} want {o.entry.expected} got "
                      f"{list(o.reasons)} {o.crashed or ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
