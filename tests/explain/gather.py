"""The fresh corpora's gathering tools: the exclusion checks the gatherers run, the merge of
their shares, and the one score of a merged corpus (each freshN/RULE.md says when each is used).

    python -m tests.explain.gather addr URL ...             # criterion (a): used before?
    python -m tests.explain.gather lines FILE [--also DIR]  # three lines the same as a log here?
    python -m tests.explain.gather merge SHARES_DIR OUT part1 part2 ...
    python -m tests.explain.gather score tests/explain/freshN

``addr`` looks for a thread (its ``/issues/N`` and ``/pull/N`` forms alike) in every
manifest.jsonl, skipped.jsonl, rejected.jsonl, SEEN.md and excluded.txt under tests/explain and
in test_shapes.py. ``lines`` looks for three consecutive non-blank lines of FILE, the same, in
any .log under tests/explain (and under each ``--also`` folder). ``merge`` takes the shares in
call order and compares addresses and lines only: a thread taken in two shares, a third take
from one repository, three consecutive non-blank lines (one of them in fewer than three earlier
logs) taken in two shares, a log past the stop at 40 failure logs or the sixth healthy one, is
moved to the rejected rows as (a) for the later call; a set-aside row whose thread the merged
manifest holds is dropped (so is the moved row of a thread kept from its earlier call), and a
thread set aside twice keeps its earlier call's row.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).parent
LISTS = ("manifest.jsonl", "skipped.jsonl", "rejected.jsonl", "SEEN.md", "excluded.txt")
THREAD = re.compile(r"github\.com/([\w.-]+)/([\w.-]+)/(?:issues|pull)/(\d+)", re.I)
REPO = re.compile(r"github\.com/([\w.-]+/[\w.-]+)/", re.I)
MAX_FAILURES = 40
MAX_HEALTHY = 6
PER_REPOSITORY = 2

Row = dict[str, object]


def rows(path: Path) -> list[Row]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def nonblank(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def windows(lines: list[str]) -> set[tuple[str, str, str]]:
    return {(lines[i], lines[i + 1], lines[i + 2]) for i in range(len(lines) - 2)}


def used_in(url: str, root: Path = HERE) -> list[str]:
    """The files under ``root`` that already name the thread (empty: not used)."""
    m = THREAD.search(url)
    if not m:
        raise ValueError(f"not an issue or pull request address: {url}")
    owner, repo, number = m.groups()
    pattern = re.compile(rf"github\.com/{re.escape(owner)}/{re.escape(repo)}/(?:issues|pull)/"
                         rf"{number}(?!\d)", re.I)
    files = sorted({p for p in root.rglob("*") if p.name in LISTS and p.is_file()}
                   | {root / "test_shapes.py"})
    return [str(p.relative_to(root)) for p in files
            if p.exists() and pattern.search(p.read_text(errors="replace"))]


def shared_lines(file: Path, roots: list[Path]) -> dict[tuple[str, str, str], list[str]]:
    """Each three-line window of ``file`` that a .log under ``roots`` also holds."""
    mine = windows(nonblank(file.read_text(errors="replace")))
    hits: dict[tuple[str, str, str], list[str]] = {}
    for root in roots:
        for log in root.rglob("*.log"):
            if log.resolve() != file.resolve():
                for w in mine & windows(nonblank(log.read_text(errors="replace"))):
                    hits.setdefault(w, []).append(str(log))
    return hits


@dataclass
class Merged:
    kept: list[tuple[Row, Path]] = field(default_factory=list)
    moved: list[Row] = field(default_factory=list)
    rejected: list[Row] = field(default_factory=list)
    skipped: list[Row] = field(default_factory=list)
    dropped_taken: list[str] = field(default_factory=list)
    dropped_twice: list[str] = field(default_factory=list)


def _key(url: object) -> str:
    return str(url).rstrip("/").lower()


def merge(shares: list[Path], earlier: Path = HERE) -> Merged:
    """The shares' rows in call order, by the rule's caps (the module's docstring)."""
    counts: dict[str, int] = {}
    for log in earlier.rglob("*.log"):
        for line in set(nonblank(log.read_text(errors="replace"))):
            counts[line] = counts.get(line, 0) + 1
    takes = sorted(((int(str(r["query"])), order, i, r, d) for order, d in enumerate(shares)
                    for i, r in enumerate(rows(d / "manifest.jsonl"))), key=lambda t: t[:3])
    out = Merged()
    urls: set[str] = set()
    repos: dict[str, int] = {}
    kept_windows: list[tuple[set[tuple[str, str, str]], str]] = []
    failures = healthy = 0
    for query, _, _, r, d in takes:
        url = _key(r["url"])
        m = REPO.search(url)
        repo = m.group(1) if m else url
        text = (d / str(r["file"])).read_text(errors="replace")
        rare = {w for w in windows(nonblank(text)) if any(counts.get(x, 0) < 3 for x in w)}
        why = ""
        if url in urls:
            why = "taken in an earlier call of another share (merge)"
        elif repos.get(repo, 0) >= PER_REPOSITORY:
            why = f"a third take from {repo}: the per-repository limit of 2 (merge)"
        else:
            for other, name in kept_windows:
                if rare & other:
                    why = (f"three consecutive lines the same as {name}, taken in an earlier "
                           "call (merge)")
                    break
        if not why and r["expected"] is None and healthy >= MAX_HEALTHY:
            why = "beyond the sixth healthy log (merge)"
        if not why and r["expected"] is not None and failures >= MAX_FAILURES:
            why = "beyond the stop at 40 failure logs (merge)"
        if why:
            out.moved.append({"url": r["url"], "query": query, "criterion": "a",
                              "why": f"{why}. Had it been kept: {r['expected']}, file "
                                     f"{r['file']}."})
            continue
        out.kept.append((r, d))
        urls.add(url)
        repos[repo] = repos.get(repo, 0) + 1
        kept_windows.append((rare, str(r["file"])))
        healthy += r["expected"] is None
        failures += r["expected"] is not None
    aside = sorted(((int(str(r["query"])), order, i, name, r) for order, d in enumerate(shares)
                    for name in ("rejected.jsonl", "skipped.jsonl")
                    for i, r in enumerate(rows(d / name))), key=lambda t: t[:3])
    seen: set[str] = set()
    for _, _, _, name, r in aside:
        url = _key(r["url"])
        if url in urls:
            out.dropped_taken.append(str(r["url"]))
        elif url in seen:
            out.dropped_twice.append(str(r["url"]))
        else:
            seen.add(url)
            (out.rejected if name == "rejected.jsonl" else out.skipped).append(r)
    for m in out.moved:  # a thread kept from its earlier call is not listed as set aside
        if _key(m["url"]) in urls:
            out.dropped_taken.append(str(m["url"]))
        elif _key(m["url"]) not in seen:
            seen.add(_key(m["url"]))
            out.rejected.append(m)
    return out


def write(merged: Merged, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    names = [str(r["file"]) for r, _ in merged.kept]
    if len(set(names)) != len(names):
        raise ValueError("two takes with one file name")
    with open(out / "manifest.jsonl", "w") as f:
        for r, d in merged.kept:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
            shutil.copy(d / str(r["file"]), out / str(r["file"]))
    for name, listed in (("rejected.jsonl", merged.rejected), ("skipped.jsonl", merged.skipped)):
        with open(out / name, "w") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in listed)


def score(folder: Path) -> str:
    from preflight.explain import classify_texts

    lines = []
    n = named = first = healthy = flagged = 0
    for r in rows(folder / "manifest.jsonl"):
        name = str(r["file"])
        got = [f.reason for f in classify_texts([(name, (folder / name).read_text())]).findings]
        if r["expected"] is None:
            healthy += 1
            flagged += bool(got)
            mark = "FLAGGED" if got else "clean"
        else:
            n += 1
            named += r["expected"] in got
            first += got[:1] == [r["expected"]]
            mark = ("first" if got[:1] == [r["expected"]]
                    else "found" if r["expected"] in got else "MISS")
        lines.append(f"{mark:7} q{r['query']!s:<3} {name:40} expected={r['expected']} got={got}")
    lines.append(f"{n} failure logs, {named}/{n} recognised, {first}/{n} first; "
                 f"{healthy} healthy, {flagged} flagged")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "addr":
        for url in argv[1:]:
            met = used_in(url)
            print(f"MET {url}: {', '.join(met)}" if met else f"not met {url}")
        return 0
    if len(argv) >= 2 and argv[0] == "lines":
        also = [Path(a) for a in argv[3:]] if argv[2:3] == ["--also"] else []
        hits = shared_lines(Path(argv[1]), [HERE, *also])
        for w, where in hits.items():
            print("MET window:\n" + "".join(f"    {line[:200]}\n" for line in w)
                  + "  in: " + ", ".join(sorted(set(where))))
        print("no window met" if not hits else f"{len(hits)} window(s) met")
        return 1 if hits else 0
    if len(argv) >= 4 and argv[0] == "merge":
        merged = merge([Path(argv[1]) / p for p in argv[3:]])
        write(merged, Path(argv[2]))
        print(f"kept {len(merged.kept)}; moved {len(merged.moved)}: "
              + "; ".join(f"q{m['query']} {m['url']}: {m['why']}" for m in merged.moved))
        print(f"set-aside rows dropped, thread taken: {merged.dropped_taken}; "
              f"repeats of an earlier call's row: {merged.dropped_twice}")
        print(f"skipped {len(merged.skipped)}, rejected {len(merged.rejected)}")
        return 0
    if len(argv) == 2 and argv[0] == "score":
        print(score(Path(argv[1])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
