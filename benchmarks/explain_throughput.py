"""Throughput of ``preflight explain``'s streaming classifier on a large synthetic torchrun log.

Writes a log (1 GB by default, ``--size``) into a temporary directory: 8 ranks with torchrun's
``[defaultN]:[rankN]:`` prefixes printing training progress, NCCL INFO start-up lines, a few
warnings, and at the end a /dev/shm failure on rank 5 followed by watchdog timeouts on the
others. Then it classifies the file the way ``preflight explain`` does and prints MB/s, the
peak RSS of the process (VmHWM) and the findings. Target: >= 50 MB/s, bounded memory.
The candidate lines are found in one RE2 pass where google-re2 is installed (the ``re2``
extra), and a candidate line's pattern literals by one RE2 set search; else by one
``bytes.find`` pass per anchor and one ``in`` test per literal; ``--no-re2`` measures the latter.
On a machine shared with other work the wall-clock MB/s drops with the load; the MB per CPU
second of the process is printed beside it (with the load average) for that case.

``--ranks N`` spreads the lines over N distinct ranks (rank tracking must stay linear: the same
MB/s at 8,192 ranks as at 8); ``--kind info`` writes only NCCL INFO lines (no progress, the worst
case for per-rank progress tracking); ``--kind warnings`` writes only lines that hold an anchor
(``WARN``, ``error``) and match no rule, each one read and run through the rules (the worst case
for the classifier: a job that prints a warning no rule knows on every line); ``--compare``
prints one row each for 8 and 8,192 ranks of the training and info kinds.

    python benchmarks/explain_throughput.py --size 1G
    python benchmarks/explain_throughput.py --size 64M --compare
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from preflight.explain import explain_streams

RANKS = 8


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def peak_rss_bytes() -> int:
    """VmHWM of this process (Linux), else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _nccl_template(ranks: int, kind: str) -> str:
    """NCCL lines of every rank: INFO channel lines, or WARN lines no rule knows."""
    lines = []
    for i in range(max(4000, ranks)):
        r = i % ranks
        prefix = f"[default{r}]:node{r // 8:04d}:{4100 + r % 8}:{4190 + r % 8} [{r % 8}] "
        if kind == "warnings":
            lines.append(f"{prefix}NCCL WARN NET/Plugin: unknown option {{it}} ignored, "
                         f"relative error {i % 97}.{i % 13} on channel {i % 24:02d}\n")
        else:
            lines.append(f"{prefix}NCCL INFO Channel {i % 24:02d}/0 : {r}[{r % 8}] -> "
                         f"{(r + 1) % ranks}[{(r + 1) % 8}] via P2P/CUMEM/read {{it}}\n")
    return "".join(lines)


def write_log(path: Path, size: int, ranks: int = RANKS, kind: str = "training") -> int:
    """Write about ``size`` bytes of log; returns the bytes written."""
    head = "".join(
        f"[default{r}]:node01:{4100 + r}:{4100 + r} [{r}] NCCL INFO ncclCommInitRank comm "
        f"0x55{r:06x} rank {r} nranks {ranks} cudaDev {r} nvmlDev {r} busId {r}a000 "
        f"commId 0x9f1c3e2ab4d7c1e5 - Init START\n" for r in range(min(ranks, 64)))
    block_lines = []
    for i in range(max(4000, ranks)):
        r = i % ranks
        block_lines.append(
            f"[default{r}]:[rank{r}]: iteration {{it}}/ 500000 | consumed samples: {{s}} | "
            f"elapsed time per iteration (ms): 41{i % 10}.3 | learning rate: 3.000E-04 | "
            f"lm loss: 2.{i % 997:04d}E+00 | grad norm: 1.{i % 89:03d} |\n")
        if i % 500 == 0:
            block_lines.append(f"[default{r}]:node01:{4100 + r}:{4190 + r} [{r}] NCCL INFO "
                               f"Channel {i % 24:02d}/0 : {r}[{r}] -> {(r + 1) % ranks}"
                               f"[{(r + 1) % ranks}] via P2P/CUMEM/read\n")
        if i % 1999 == 0:
            block_lines.append(f"[default{r}]:/usr/lib/python3/dist-packages/torch/utils/data/"
                               "dataloader.py:617: UserWarning: This DataLoader will create 8 "
                               "worker processes in total.\n")
    template = "".join(block_lines) if kind == "training" else _nccl_template(ranks, kind)
    tail = (
        "[default5]:node01:4105:4195 [5] include/shm.h:28 NCCL WARN Error while creating shared "
        "memory segment /dev/shm/nccl-7xQm2L (size 9637888)\n" + "".join(
            f"[default{r}]:[rank{r}]:[E1129 10:41:17.118263522 ProcessGroupNCCL.cpp:632] "
            f"[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=90211, "
            f"OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600046 "
            f"milliseconds before timing out.\n" for r in range(min(ranks, 64)) if r != 5))
    written = 0
    it = 0
    with path.open("w", encoding="utf-8") as f:
        f.write(head)
        written += len(head)
        while written < size:
            chunk = template.replace("{it}", str(it)).replace("{s}", str(it * 512))
            f.write(chunk)
            written += len(chunk)
            it += 1
        f.write(tail)
        written += len(tail)
    return written


def measure(size: int, ranks: int, kind: str, where: str | None) -> None:
    """Write the log, classify it, print one table row."""
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        path = Path(tmp) / "synthetic.log"
        t0 = time.perf_counter()
        written = write_log(path, size, ranks, kind)
        gen_s = time.perf_counter() - t0
        rss_before = peak_rss_bytes()
        t0, c0 = time.perf_counter(), time.process_time()
        with path.open("rb") as stream:
            expl = explain_streams([(str(path), stream)])
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        peak = peak_rss_bytes()
    mb = written / 1e6
    print(f"| {mb:,.0f} MB | {kind} | {ranks:,} | {expl.lines:,} | {dt:.2f} | {mb / dt:.0f} | "
          f"{cpu:.2f} | {mb / cpu:.0f} | {peak / 2**20:.0f} "
          f"| {', '.join(f.reason for f in expl.findings) or 'none'} |", flush=True)
    print(f"(generation {gen_s:.1f} s; peak RSS before classifying {rss_before / 2**20:.0f} MiB; "
          f"ranks seen {len(expl.ranks.seen):,}; notes {len(expl.notes)})", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1G", help="log size, e.g. 200M, 1G (default 1G)")
    ap.add_argument("--ranks", type=int, default=RANKS, help="distinct ranks (default 8)")
    ap.add_argument("--kind", choices=("training", "info", "warnings"), default="training",
                    help="progress lines of a training run, NCCL INFO lines only, or warnings "
                         "that each hold an anchor and match no rule (the slowest case)")
    ap.add_argument("--compare", action="store_true",
                    help="one row each for 8 and 8,192 ranks, both kinds")
    ap.add_argument("--dir", default=None, help="where to write the temporary log")
    ap.add_argument("--no-re2", action="store_true",
                    help="find the candidate lines with one bytes.find pass per anchor, and "
                         "a line's literals with one `in` test each, even where google-re2 is "
                         "installed (what a node without it gets)")
    args = ap.parse_args()
    from preflight.explain import blocks, classifier, matching
    if args.no_re2:
        classifier.SCAN = blocks.AnchorScan(classifier.SCAN.anchors, one_pass=False)
        matching._SET = None
    size = parse_size(args.size)
    load = os.getloadavg()[0]
    scan = ("one RE2 pass (google-re2), literals by one RE2 set" if classifier.SCAN.one_pass
            else "one bytes.find pass per anchor, literals by one `in` test each")
    print(f"cpu: {os.cpu_count()} cores, load average {load:.1f}; python {sys.version.split()[0]}; "
          f"anchor scan: {scan}")
    print("| log size | kind | ranks | lines | time (s) | MB/s | CPU s | MB per CPU s "
          "| peak RSS (MiB) | findings |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
    runs = ([(r, k) for k in ("info", "training") for r in (8, 8192)] if args.compare
            else [(args.ranks, args.kind)])
    for ranks, kind in runs:
        measure(size, ranks, kind, args.dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
