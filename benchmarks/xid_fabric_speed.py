"""Time the ``xid`` and ``fabric`` checks: what they add to ``preflight check``.

Scenarios: ``xid`` on this machine's live kernel log (/dev/kmsg, else journalctl); ``xid`` on
synthetic ring buffers of 1, 8 and 32 MiB in /dev/kmsg's record format (one record in 100 an Xid,
the rest ordinary driver lines) under a temporary ``--root``; ``fabric`` on an 8-port fixture tree
with one counter read (``fabric_counter_interval_s`` 0: the default second read waits 1 s by
design). Each sample builds a fresh Context (nothing cached). Prints median / p95 / max in ms.

    python benchmarks/xid_fabric_speed.py [--samples 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from machine import describe  # benchmarks/machine.py (sys.path[0] is this folder)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from preflight.checks import fabric, xid
from preflight.core.config import Config
from preflight.core.context import Context
from preflight.core.result import Result
from preflight.probes.gpu import FixtureGpuProbe, GpuSnapshot


def ring_buffer(root: Path, size_bytes: int) -> None:
    (root / "dev").mkdir(parents=True)
    lines, total, seq = [], 0, 0
    while total < size_bytes:
        text = ("NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, Graphics SM Warp Exception"
                if seq % 100 == 0 else f"mlx5_core 0000:0c:00.0: port {seq % 8} link up, "
                                       "speed 400000 Mb/s, 4 lanes")
        line = f"6,{seq},{seq * 1000},-;{text}\n"
        lines.append(line)
        total += len(line)
        seq += 1
    (root / "dev" / "kmsg").write_text("".join(lines))


def ib_tree(root: Path, ports: int = 8) -> None:
    for i in range(ports):
        p = root / "sys/class/infiniband" / f"mlx5_{i}" / "ports" / "1"
        (p / "counters").mkdir(parents=True)
        for name, text in (("state", "4: ACTIVE"), ("phys_state", "5: LinkUp"),
                           ("rate", "400 Gb/sec (4X NDR)"), ("link_layer", "InfiniBand")):
            (p / name).write_text(text + "\n")
        for c in ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
                  "port_xmit_discards", "local_link_integrity_errors"):
            (p / "counters" / c).write_text("0\n")


def sample(run: Callable[[Context], Result], root: Path, samples: int,
           **config: object) -> list[float]:
    out = []
    for _ in range(samples):
        ctx = Context(config=Config().replace(**config), env={}, root=root,
                      gpu_probe=FixtureGpuProbe(GpuSnapshot(available=False, error="none")))
        t0 = time.perf_counter()
        run(ctx)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=20)
    args = ap.parse_args()
    rows: list[tuple[str, list[float]]] = []
    rows.append(("xid, live kernel log of this machine", sample(xid.run, Path("/"), args.samples)))
    with tempfile.TemporaryDirectory() as tmp:
        for mib in (1, 8, 32):
            root = Path(tmp) / f"k{mib}"
            ring_buffer(root, mib << 20)
            rows.append((f"xid, {mib} MiB ring buffer (1 % Xid lines)",
                         sample(xid.run, root, max(3, args.samples // (mib * 2)))))
        ib = Path(tmp) / "ib"
        ib_tree(ib)
        rows.append(("fabric, 8 ports, one counter read",
                     sample(fabric.run, ib, args.samples, fabric_counter_interval_s=0.0)))
    print(f"# {describe()}, {time.strftime('%Y-%m-%d')}")
    print("| scenario | median ms | p95 ms | max ms |")
    print("|---|---|---|---|")
    for name, ms in rows:
        ms.sort()
        p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
        print(f"| {name} | {statistics.median(ms):.2f} | {p95:.2f} | {ms[-1]:.2f} |")


if __name__ == "__main__":
    main()
