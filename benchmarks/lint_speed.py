"""Speed of ``preflight lint`` over a whole tree: files per second, per ``--jobs`` setting.

    python benchmarks/lint_speed.py TREE [TREE...] [--jobs 1,2] [--repeat 5]
    python benchmarks/lint_speed.py --corpus 20     # the lint corpus copied 20 times
    python benchmarks/lint_speed.py --corpus 20 --corpus-batch 1   # its batch 1 (31 files)

A TREE is a checked-out repository (no network needed: docs/benchmarks.md names the trees and
commits measured). ``--corpus N`` lints the real-script corpus of the tests, which is not in
the repository: fetch it first (``python -m tests.lint.corpus fetch``, from
raw.githubusercontent.com into tests/lint/corpus/cache or ``$PREFLIGHT_LINT_CORPUS``). For each
tree it prints, as Markdown rows: the files and lines, how many files some rule's words sent to
the parser, and for ``ast.parse`` alone (every file, one process; the floor of any linter that
parses every file) and for ``preflight lint`` at each ``--jobs``: the best wall time of
``--repeat`` runs, the CPU seconds of that run (this process and its workers) and files per
second by wall and by CPU second. The load average is printed before and after: on a shared
machine the wall figures depend on it, the CPU figures much less.
The issue's target: >= 500 files per second on the 2-core machine for a whole repository.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import resource
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import describe
from preflight.lint import iter_python_files, lint_paths, may_have_findings
from preflight.lint.jobs import usable_cpus
from tests.lint.corpus import cache_dir, entries, missing


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def best_of(repeat: int, run: Callable[[], object]) -> tuple[float, float]:
    """(wall, CPU) of the fastest of ``repeat`` runs (CPU counts reaped workers too)."""
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), _cpu()
        run()
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
        best = min(best, (wall, cpu))
    return best


def parse_all(files: list[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for path in files:
            with contextlib.suppress(SyntaxError, ValueError):
                ast.parse(Path(path).read_bytes())


def rows(tree: str, label: str, jobs: list[int], repeat: int) -> list[str]:
    files = [p for p, problem in iter_python_files([tree]) if problem is None]
    data = [Path(p).read_bytes() for p in files]
    lines = sum(d.count(b"\n") for d in data)
    parsed = sum(may_have_findings(d) for d in data)
    head = f"| {label} | {len(files):,} | {lines:,} | {parsed:,} "
    out = []
    wall, cpu = best_of(repeat, lambda: parse_all(files))
    out.append(head + f"| `ast.parse` of every file, 1 process | {wall:.2f} | {cpu:.2f} | "
               f"{len(files) / wall:,.0f} | {len(files) / cpu:,.0f} |")
    for n in jobs:
        summary = lint_paths([tree], jobs=n)
        wall, cpu = best_of(repeat, lambda n=n: lint_paths([tree], jobs=n))  # type: ignore[misc]
        out.append(head + f"| lint --jobs {n} ({summary.findings} findings) | {wall:.2f} | "
                   f"{cpu:.2f} | {summary.files / wall:,.0f} | {summary.files / cpu:,.0f} |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="*", metavar="TREE", help="directories to lint")
    ap.add_argument("--corpus", type=int, default=0, metavar="N",
                    help="also lint the lint corpus copied N times (large training scripts): "
                         "the fetched files (python -m tests.lint.corpus fetch)")
    ap.add_argument("--corpus-batch", type=int, action="append", metavar="B",
                    help="only the corpus entries of batch B (repeatable; default: all)")
    ap.add_argument("--jobs", default=f"1,{usable_cpus()}",
                    help="comma-separated --jobs values (default: 1 and the usable CPUs)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per figure; the best is kept")
    args = ap.parse_args()
    jobs = sorted({max(1, int(j)) for j in args.jobs.split(",") if j.strip()})
    if not args.trees and not args.corpus:
        ap.error("give a TREE or --corpus N")
    corpus = [e for e in entries() if not args.corpus_batch or e.batch in args.corpus_batch]
    if args.corpus:
        if not corpus:
            ap.error(f"no corpus entry of batch {', '.join(map(str, args.corpus_batch))}")
        absent = missing(corpus)
        if absent:
            ap.error(f"{len(absent)} of {len(corpus)} corpus files not in {cache_dir()}: "
                     "run python -m tests.lint.corpus fetch first")
    print(f"machine: {describe()}; usable CPUs {usable_cpus()}; load average before "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("| tree | files | lines | parsed | what | wall s | CPU s | files/s (wall) | "
          "files/CPU-s |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for tree in args.trees:
        for row in rows(tree, Path(tree).resolve().name, jobs, args.repeat):
            print(row, flush=True)
    if args.corpus:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.corpus):
                folder = Path(tmp, f"copy{i:03d}")
                folder.mkdir()
                for e in corpus:
                    (folder / e.file.removesuffix(".txt")).write_bytes(e.read() or b"")
            label = f"lint corpus ({len(corpus)} files) x {args.corpus}"
            for row in rows(tmp, label, jobs, args.repeat):
                print(row, flush=True)
    print(f"load average after {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
