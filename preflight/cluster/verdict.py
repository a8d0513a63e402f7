"""The cluster verdict as text: node 0's full table, one line on the other nodes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _gbps(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g} GB/s"


def one_line(v: Mapping[str, Any]) -> str:
    f = v["findings"]
    head = f"cluster {v['status'].upper()}: {len(v['nodes'])}/{v['nnodes']} nodes"
    if v.get("slow_nodes"):
        head += f", slow: {', '.join(map(str, v['slow_nodes']))}"
    if v.get("missing_nodes"):
        head += f", missing: {', '.join(map(str, v['missing_nodes']))}"
    return head + (f" ({f[0]['reason']}: {f[0]['message']})" if f else "")


def render(v: Mapping[str, Any], *, full: bool, node_rank: int) -> str:
    if not full:
        return f"node {node_rank}: {one_line(v)}"
    lines = [one_line(v), "", f"{'node':>4}  {'host':<20} {'addr':<16} {'status':<6} fingerprint"]
    for n in v["nodes"]:
        lines.append(f"{n['node_rank']:>4}  {str(n['host'])[:20]:<20} {n['addr']!s:<16} "
                     f"{n['status']:<6} {str(n['fingerprint_sha256'])[:12]}")
    for r in v["missing_nodes"]:
        lines.append(f"{r:>4}  {'(did not arrive)':<20}")
    ar = v.get("allreduce")
    if ar:
        bw = ar.get("busbw_gbps")
        lines += ["", f"world all-reduce: {ar['status']}, busbw "
                  f"{'-' if bw is None else f'{bw:.4g} GB/s'}: {ar.get('message', '')}"]
    for rnd in v["localisation"]["rounds"]:
        groups = "; ".join(f"{g['nodes']} {g['status']} {_gbps(g['busbw_gbps'])}"
                           for g in rnd["groups"])
        lines.append(f"round {rnd['round']}: {groups}")
    for f in v["findings"]:
        lines += ["", f"{f['status'].upper()} {f['reason']}: {f['message']}"]
        if f["remedy"]:
            lines.append(f"  remedy: {f['remedy']}")
    lines.append(f"\nverdict in {v['elapsed_s']:.1f} s; store: {v['store'].get('ops', 0)} ops on "
                 "node 0")
    return "\n".join(lines)
