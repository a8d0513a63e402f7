"""Speed of ``preflight lint`` over a whole tree: files per second, in one process.

Lints ``--tree DIR`` (a checked-out repository), or, by default, the real-script corpus
(tests/lint/corpus) copied ``--copies`` times into a temporary directory as ``.py`` files. Prints
the files, the lines, the findings, wall and CPU seconds and files per second. Issue target:
>= 500 files per second on the 2-core machine.

    python benchmarks/lint_speed.py --tree /path/to/torchtitan
    python benchmarks/lint_speed.py --copies 40
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import describe
from preflight.lint import iter_python_files, lint_paths

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "lint" / "corpus"


def measure(tree: str) -> tuple[int, int, int, int, float, float]:
    files = [p for p, problem in iter_python_files([tree]) if problem is None]
    lines = sum(Path(p).read_bytes().count(b"\n") for p in files)
    t0, c0 = time.perf_counter(), time.process_time()
    summary = lint_paths([tree])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return summary.files, lines, summary.findings, len(summary.skipped), wall, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", help="a directory to lint (default: the corpus, multiplied)")
    ap.add_argument("--copies", type=int, default=40, help="corpus copies (default 40)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tree = args.tree
        if tree is None:
            tree = tmp
            for i in range(args.copies):
                folder = Path(tmp, f"copy{i:03d}")
                folder.mkdir()
                for src in CORPUS.glob("*.py.txt"):
                    shutil.copyfile(src, folder / src.name.removesuffix(".txt"))
        files, lines, findings, skipped, wall, cpu = measure(tree)
    print(f"machine: {describe()}; load average {os.getloadavg()[0]:.1f}")
    print("| tree | files | lines | findings | skipped | wall s | CPU s | files/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.tree or f'corpus x {args.copies}'} | {files:,} | {lines:,} | {findings} | "
          f"{skipped} | {wall:.2f} | {cpu:.2f} | {files / wall:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
