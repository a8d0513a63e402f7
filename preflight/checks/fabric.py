"""``fabric``: every InfiniBand / RoCE port NCCL may use is up, at full rate, and error-free.

Verifies, from ``<root>/sys/class/infiniband/*/ports/*/`` (Documentation/ABI/stable/
sysfs-class-infiniband):

* state ACTIVE and physical state LinkUp; the ports ``NCCL_IB_HCA`` selects (parsed exactly as
  NCCL does, :func:`preflight.jobenv.netvars.select_ib`) are among the active ones. Without
  ``NCCL_IB_HCA`` NCCL uses every active port: a port down is a WARN, no port up a FAIL. A port
  whose physical state is Disabled was switched off on purpose and is only listed.
* the rate each active port trained at against ``fabric_expected_rate_gbps`` (default: the highest
  rate among the node's active ports of the same link layer): one port at half rate makes every
  multi-node collective run at its pace.
* error counters read twice, ``fabric_counter_interval_s`` apart: ``link_downed`` /
  ``link_error_recovery`` growing means the link flaps now (FAIL); symbol, receive and discard
  errors growing mean a bad cable or transceiver (WARN).
* with ``NCCL_IB_GID_INDEX`` set: the GID at that index exists on the selected RoCE ports (NCCL's
  ``ibv_modify_qp`` fails on an empty one) and its RoCE version matches
  ``NCCL_IB_ROCE_VERSION_NUM`` when that is set (NCCL docs, Environment Variables).

No RDMA port at all is a SKIP, never a failure: most nodes train over TCP or have no IB; so is
``NCCL_IB_DISABLE=1`` (NCCL will not use the ports).
Knobs: ``fabric_expected_rate_gbps`` (None), ``fabric_counter_interval_s`` (1.0 s).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from preflight.core.context import Context, activity
from preflight.core.result import Finding, Result, Scope, Status, fold
from preflight.jobenv.netvars import nccl_flag, select_ib
from preflight.probes.ib import IbPort, PortInfo
from preflight.probes.ibparse import LINK_COUNTERS, gid_is_empty, parse_rate, roce_version

NAME = "fabric"
NCCL_ENV_DOC = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
_CABLE = ("Look at the port with `ibstat` / `ibv_devinfo -v` and `mlxlink -d <device> -m`; reseat "
          "or replace the cable or transceiver, and check the switch port (docs/checks.md#fabric).")


def _usable(p: PortInfo) -> bool:
    return p.state == "ACTIVE" and p.phys_state == "LinkUp"


def _describe(p: PortInfo) -> str:
    return f"{p.label} ({p.state or '?'}, {p.phys_state or '?'})"


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    return int(raw) if raw.isdigit() else None


def expected_rates(ports: Sequence[PortInfo], configured_gbps: float | None) -> dict[str, float]:
    """Expected Gb/s by link layer: the configured rate, else the best active port's."""
    best: dict[str, float] = {}
    for p in ports:
        rate = parse_rate(p.rate)
        if _usable(p) and rate is not None:
            best[p.link_layer] = max(best.get(p.link_layer, 0.0), rate.gbps)
    if configured_gbps is not None:
        return {layer: configured_gbps for layer in {p.link_layer for p in ports}}
    return best


def judge(ports: Sequence[PortInfo], *, env: Mapping[str, str],
          expected_rate_gbps: float | None = None,
          growth: Mapping[str, Mapping[str, int]] | None = None,
          interval_s: float = 0.0) -> Result:
    """The verdict over the ports (pure): ``growth`` is each port's counter increase between the
    two reads ``interval_s`` apart."""
    findings: list[Finding] = []

    def add(status: Status, reason: str, message: str, remedy: str,
            scope: Scope = Scope.NODE) -> None:
        findings.append(Finding(status, reason, message, remedy, scope))

    growth = growth or {}
    hca = env.get("NCCL_IB_HCA", "")
    by_label = {p.label: p for p in ports}
    sel = select_ib([IbPort(p.device, p.port, p.state, p.link_layer, p.rate) for p in ports],
                    hca or None)
    selected = [by_label[p.label] for p in (*sel.active, *sel.inactive)]
    usable = [p for p in ports if _usable(p)]
    expected = expected_rates(ports, expected_rate_gbps)
    details: dict[str, Any] = {
        "ports": [{"port": p.label, "state": p.state, "phys_state": p.phys_state,
                   "rate": p.rate, "rate_gbps": (r.gbps if (r := parse_rate(p.rate)) else None),
                   "expected_rate_gbps": expected.get(p.link_layer),
                   "link_layer": p.link_layer, "selected": p in selected,
                   "counters_growth": dict(growth.get(p.label, {}))} for p in ports],
        "nccl_ib_hca": hca or None,
    }
    fix_state = ("Bring the port up: check the cable (phys_state Polling = no link partner), the "
                 "subnet manager for InfiniBand (state INIT/ARMED = link up but no SM: "
                 "`sminfo`), and `ibstat`; or leave it out of NCCL_IB_HCA.")

    if hca:
        down = [by_label[p.label] for p in sel.inactive]
        if down:
            add(Status.FAIL, "IbSelectedPortDown",
                  f"NCCL_IB_HCA={hca!r} selects {', '.join(map(_describe, down))}: not ACTIVE; "
                  "NCCL skips it and the job runs on fewer rails (or on TCP).", fix_state)
        if not sel.active:
            add(Status.FAIL, "IbNoSelectedPort",
                  f"NCCL_IB_HCA={hca!r} selects no ACTIVE port (ports: "
                  f"{', '.join(map(_describe, ports))}); NCCL falls back to TCP sockets, about "
                  "10x slower across nodes.",
                  f"Set NCCL_IB_HCA to ACTIVE ports (`ibstat`), or fix the ports. {NCCL_ENV_DOC}",
                  # Naming no port that exists is the job's setting; naming only dead ports is not.
                  Scope.NODE if sel.inactive else Scope.JOB)
    else:
        down = [p for p in ports if not _usable(p) and p.phys_state != "Disabled"]
        if not usable and down:
            add(Status.FAIL, "IbNoActivePort",
                  f"no RDMA port is ACTIVE and LinkUp ({', '.join(map(_describe, down))}); "
                  "multi-node NCCL falls back to TCP sockets, about 10x slower.", fix_state)
        elif down:
            add(Status.WARN, "IbPortDown",
                  f"{len(down)} RDMA port(s) not up: {', '.join(map(_describe, down))}; NCCL "
                  "uses only the ACTIVE ones, so a rail is missing if these carry training "
                  "traffic.", fix_state)
    for p in selected:
        if p.state == "ACTIVE" and p.phys_state != "LinkUp":
            add(Status.FAIL, "IbLinkNotUp",
                  f"{p.label} is ACTIVE but its physical state is {p.phys_state or 'unknown'}, "
                  "expected LinkUp (the link is retraining).", _CABLE)

    for p in selected:
        if not _usable(p):
            continue
        rate = parse_rate(p.rate)
        want = expected.get(p.link_layer)
        if rate is None:
            add(Status.WARN, "IbRateUnknown",
                  f"{p.label} rate {p.rate!r} is not in the kernel's 'N Gb/sec (WX SPEED)' form.",
                  "Report this rate text to the preflight maintainers.")
        elif want is not None and rate.gbps < want:
            add(Status.FAIL, "IbRateLow",
                  f"{p.label} ({p.link_layer}) trained at {rate.gbps:g} Gb/s ({p.rate}), expected "
                  f"{want:g} Gb/s" + ("" if expected_rate_gbps is not None else
                                      " (the best port of this node)") + ".",
                  _CABLE + " A port at a lower width (1X/2X instead of 4X) has a bad lane.")

    for p in selected:
        grown = growth.get(p.label, {})
        link = {k: v for k, v in grown.items() if k in LINK_COUNTERS}
        other = {k: v for k, v in grown.items() if k not in LINK_COUNTERS}
        if link:
            add(Status.FAIL, "IbLinkFlapping",
                  f"{p.label}: " + ", ".join(f"{k} +{v}" for k, v in link.items()) +
                  f" within {interval_s:g} s; expected 0 (the link goes down or retrains now).",
                  _CABLE)
        if other:
            add(Status.WARN, "IbErrorsGrowing",
                  f"{p.label}: " + ", ".join(f"{k} +{v}" for k, v in other.items()) +
                  f" within {interval_s:g} s; expected 0.", _CABLE)

    gid_index = _int_env(env, "NCCL_IB_GID_INDEX")
    want_roce = _int_env(env, "NCCL_IB_ROCE_VERSION_NUM")
    if gid_index is not None:
        roce = [p for p in selected if _usable(p) and p.link_layer == "Ethernet"]
        details["gid_index"] = gid_index
        details["roce"] = {p.label: {"gid": p.gid, "type": p.gid_type} for p in roce}
        for p in roce:
            if p.gid is None or gid_is_empty(p.gid):
                add(Status.FAIL, "IbGidMissing",
                      f"NCCL_IB_GID_INDEX={gid_index}: {p.label} has no GID at index "
                      f"{gid_index} ({p.gid or 'missing'}); NCCL's ibv_modify_qp fails.",
                      f"Pick an index that holds the port's IP (`show_gids`, or ls "
                      f"/sys/class/infiniband/{p.device}/ports/{p.port}/gids), or unset it to let "
                      f"NCCL choose. {NCCL_ENV_DOC}", Scope.JOB)
            elif want_roce is not None and roce_version(p.gid_type or "") != want_roce:
                add(Status.FAIL, "IbRoceVersionMismatch",
                      f"NCCL_IB_GID_INDEX={gid_index} on {p.label} is {p.gid_type or 'unknown'}, "
                      f"but NCCL_IB_ROCE_VERSION_NUM={want_roce}.",
                      "Use the GID index of the RoCE version the fabric runs (`show_gids`).",
                      Scope.JOB)

    active = [p for p in selected if _usable(p)]
    rates = sorted({f"{r.gbps:g} Gb/s {p.link_layer}" for p in active
                    if (r := parse_rate(p.rate)) is not None})
    scope = f"NCCL_IB_HCA={hca!r} selects" if hca else "NCCL may use"
    summary = (f"{scope} {len(active)} active port(s) of {len(ports)} "
               f"({', '.join(p.label for p in active) or 'none'}; {', '.join(rates) or 'no rate'})"
               + (f"; counters steady over {interval_s:g} s" if interval_s > 0 and not growth
                  else "") + ".")
    return fold(NAME, findings, ok_reason="FabricOk", summary=summary, details=details)


def run(ctx: Context) -> Result:
    from preflight.probes.ib import read_ports, reread_counters

    path = ctx.host_path("/sys/class/infiniband")
    gid_index = _int_env(ctx.env, "NCCL_IB_GID_INDEX")
    with activity(f"reading {path}"):
        ports = read_ports(path, gid_index=gid_index)
    if not ports:
        return Result(NAME, Status.SKIP, "NoRdmaPorts",
                      f"no InfiniBand / RoCE port under {path} (no RDMA driver or no HCA); NCCL "
                      "uses TCP sockets across nodes, nothing to check.",
                      details={"path": str(path)})
    if nccl_flag(ctx.env.get("NCCL_IB_DISABLE")):
        return Result(NAME, Status.SKIP, "NcclIbDisabled",
                      f"NCCL_IB_DISABLE=1: NCCL will not use the {len(ports)} RDMA port(s) "
                      f"({', '.join(f'{p.label} {p.state}' for p in ports)}); not judged "
                      "(nccl_env says whether that is wise).",
                      details={"ports": [{"port": p.label, "state": p.state,
                                          "phys_state": p.phys_state} for p in ports]})
    interval = ctx.config.fabric_counter_interval_s
    growth: dict[str, dict[str, int]] = {}
    if interval > 0:
        with activity(f"waiting {interval:g} s between two reads of the port counters"):
            time.sleep(interval)
            after = reread_counters(path, ports)
        for p in ports:
            grown = {k: v - p.counters[k] for k, v in after.get(p.label, {}).items()
                     if k in p.counters and v > p.counters[k]}
            if grown:
                growth[p.label] = grown
    return judge(ports, env=ctx.env, expected_rate_gbps=ctx.config.fabric_expected_rate_gbps,
                 growth=growth, interval_s=interval)
