"""``network``: the NICs NCCL and gloo will use, and whether they reach rank 0.

What: predicts, exactly as NCCL does (NCCL docs, "Environment Variables"), which interfaces
``NCCL_SOCKET_IFNAME``
selects (or NCCL's own choice when it is unset), the bootstrap interface (the first), the RDMA
ports ``NCCL_IB_HCA`` selects, and the interfaces ``GLOO_SOCKET_IFNAME`` names. For a multi-node
job it asks the kernel which interface reaches MASTER_ADDR and compares.

Why: "NCCL may pick the wrong NIC" -- a management NIC instead of the
data NIC makes training slow, an interface that cannot reach rank 0 makes it hang in
"Initialization timed out"; ``NCCL_SOCKET_IFNAME="eth0, eth1"`` silently drops eth1 because NCCL
does not trim blanks; ``NCCL_IB_HCA=mlx5_1`` also takes mlx5_10..mlx5_19. Every node must reach
rank 0's bootstrap interface, whose address goes into the unique id.

Verdicts: FAIL when NCCL would find no interface, when a multi-node job would bootstrap over
loopback or docker*, when MASTER_ADDR is invalid/unresolvable/loopback, when no route leads to it,
when the bootstrap interface cannot reach it, or when a GLOO_SOCKET_IFNAME entry has no address.
WARN when it works over another interface than the route's (management instead of data NIC),
on blanks or a one-character value, NCCL_COMM_ID, an ignored NCCL_SOCKET_FAMILY, an NCCL_IB_HCA
that matches no ACTIVE port or is an ambiguous prefix, and (``NcclSocketFallback``) a multi-node
job whose NCCL will fall back to TCP sockets because no RDMA port is ACTIVE: the ports themselves
are the ``fabric`` check's (``IbNoActivePort``), so one cause is one node fault. Reachability of
a non-route interface means: MASTER_ADDR lies on its subnet, or it carries a default route (policy
routing is not modelled).

Knobs: ``multi_node`` (``--multi-node``, default False) judges the route even when WORLD_SIZE,
LOCAL_WORLD_SIZE and SLURM_JOB_NUM_NODES do not say the job spans nodes.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from preflight.core.context import Context
from preflight.core.result import Finding, Result, Scope, Status, fold
from preflight.jobenv.launcher import env_int
from preflight.jobenv.netvars import (
    IbSelection,
    ParseError,
    Selection,
    is_multi_node,
    nccl_flag,
    nccl_socket_selection,
    parse_comm_id,
    parse_gloo_ifnames,
    parse_if_list,
    parse_master_addr,
    select_ib,
    socket_family,
)
from preflight.probes.net import IbSnapshot, NetSnapshot

NAME = "network"


def multi_node(ctx: Context) -> tuple[bool, str]:
    return is_multi_node(world_size=env_int(ctx.env, "WORLD_SIZE"),
                         local_world_size=env_int(ctx.env, "LOCAL_WORLD_SIZE"),
                         slurm_nodes=env_int(ctx.env, "SLURM_JOB_NUM_NODES"),
                         forced=ctx.config.multi_node)


def _describe(sel: Selection) -> str:
    if sel.mode == "user":
        how = f"NCCL_SOCKET_IFNAME={sel.rule!r}"
    else:
        rule = {"ib": "ib* first", "subnet": "the interface on NCCL_COMM_ID's subnet",
                "^docker,lo,virbr": "anything but docker*/lo*/virbr*",
                "docker": "docker* (nothing else is up)", "lo": "lo* (nothing else is up)",
                "virbr": "virbr* (nothing else is up)"}.get(sel.rule, "nothing")
        how = f"NCCL_SOCKET_IFNAME unset: NCCL's auto-selection picks {rule}"
    return how


def _bad_for_multi_node(name: str, snap: NetSnapshot) -> str | None:
    iface = snap.get(name)
    if name.startswith("lo") or (iface is not None and iface.loopback):
        return "loopback"
    if name.startswith("docker"):
        return "a docker bridge"
    return None


def _can_reach(snap: NetSnapshot, name: str, family: int, target: str) -> bool:
    """Whether traffic from ``name`` plausibly reaches ``target``: same subnet or default route."""
    iface = snap.get(name)
    if iface is None:
        return False
    try:
        want = ipaddress.ip_address(target)
    except ValueError:
        return False
    from preflight.jobenv.netvars import in_subnet

    if any(fam == family and in_subnet(a, m, want) for fam, a, m in iface.addresses):
        return True
    return name in snap.default_gateway_ifs.get(family, ())


def _ifname_syntax(ctx: Context, f: list[Finding]) -> None:
    raw = ctx.env.get("NCCL_SOCKET_IFNAME")
    if raw is None:
        return
    if len(raw) <= 1:
        f.append(Finding(
            Status.WARN, "IfnameIgnored",
            f"NCCL_SOCKET_IFNAME={raw!r} has {len(raw)} character(s); NCCL ignores a value that "
            "short and auto-selects instead.",
            "Set the full interface name (export NCCL_SOCKET_IFNAME=eth1) or unset it.",
            scope=Scope.JOB))
        return
    spec = parse_if_list(raw)
    if spec.whitespace_tokens:
        fixed = ",".join(t.name.strip() for t in spec.tokens)
        prefix = ("^" if spec.exclude else "") + ("=" if spec.exact else "")
        f.append(Finding(
            Status.WARN, "IfnameWhitespace",
            f"NCCL_SOCKET_IFNAME={raw!r} has blanks in "
            f"{', '.join(repr(t) for t in spec.whitespace_tokens)}; NCCL does not trim them, so "
            "those entries never match.",
            f"export NCCL_SOCKET_IFNAME={prefix}{fixed}", scope=Scope.JOB))
    if spec.dropped:
        f.append(Finding(
            Status.WARN, "IfnameTooLong",
            f"NCCL_SOCKET_IFNAME lists {len(spec.tokens) + spec.dropped} entries; NCCL reads "
            f"only the first 16 and ignores {spec.dropped}.", "List at most 16 entries.",
            scope=Scope.JOB))


def _ib(ctx: Context, ib: IbSnapshot, multi: bool, f: list[Finding],
        details: dict[str, Any]) -> None:
    raw = ctx.env.get("NCCL_IB_HCA")
    disabled = nccl_flag(ctx.env.get("NCCL_IB_DISABLE"))
    details["ib_present"] = ib.present
    details["ib_ports"] = [f"{p.label} {p.state}" for p in ib.ports]
    if raw is None or raw == "":
        sel = select_ib(ib.ports, None)
        details["ib_selected"] = [p.label for p in sel.active]
        if ib.present and ib.ports and not sel.active and multi and not disabled:
            # What NCCL will select is this check's; the ports themselves are fabric's
            # (IbNoActivePort there), so one cause has one reason.
            f.append(Finding(
                Status.WARN, "NcclSocketFallback",
                f"NCCL will run between nodes over TCP sockets (roughly 10x slower): none of "
                f"the {len(ib.ports)} RDMA port(s) in {ib.path} is ACTIVE "
                f"({', '.join(details['ib_ports'])}); the fabric check judges the ports.",
                "See the fabric check's verdict for the ports (preflight check --only fabric); "
                "ibstat shows State: Active when a port is usable."))
        return
    if not ib.present:
        f.append(Finding(
            Status.WARN, "IbMissing",
            f"NCCL_IB_HCA={raw!r} is set but {ib.path} does not exist (no RDMA driver, or the "
            "host's /sys is not mounted); NCCL will use TCP sockets.",
            "Load the RDMA driver (mlx5_ib) or, in a container, pass the host's /sys with "
            "--root; otherwise unset NCCL_IB_HCA."))
        details["ib_selected"] = []
        return
    chosen: IbSelection = select_ib(ib.ports, raw)
    details["ib_selected"] = [p.label for p in chosen.active]
    _ib_verdicts(raw, ib, chosen, f, details)


def _ib_verdicts(raw: str, ib: IbSnapshot, sel: IbSelection, f: list[Finding],
                 details: dict[str, Any]) -> None:
    if sel.ambiguous:
        pairs = "; ".join(f"{tok!r} also matches {', '.join(others)}"
                          for tok, others in sel.ambiguous)
        exact = "=" + ",".join(t.name + (f":{t.port}" if t.port != -1 else "")
                               for t in parse_if_list(raw.lstrip("^")).tokens)
        f.append(Finding(
            Status.WARN, "IbHcaAmbiguousPrefix",
            f"NCCL_IB_HCA={raw!r}: entries are prefixes, and {pairs}.",
            f"export NCCL_IB_HCA='{'^' if raw.startswith('^') else ''}{exact}'", scope=Scope.JOB))
    if not sel.active:
        active = [p.label for p in ib.ports if p.active]
        skipped = ", ".join(f"{p.label} {p.state}" for p in sel.inactive)
        down = f" (matched but not ACTIVE: {skipped})" if sel.inactive else ""
        f.append(Finding(
            Status.WARN, "IbHcaNoActivePort",
            f"NCCL_IB_HCA={raw!r} selects no ACTIVE RDMA port{down}; ACTIVE ports: "
            f"{', '.join(active) or 'none'}. NCCL falls back to TCP sockets.",
            f"export NCCL_IB_HCA='={','.join(sorted({p.device for p in ib.ports if p.active}))}'"
            if active else "Bring the ports up (ibstat) or unset NCCL_IB_HCA."))
    elif sel.inactive:
        details["ib_skipped"] = [f"{p.label} {p.state}" for p in sel.inactive]


def _gloo(ctx: Context, snap: NetSnapshot, multi: bool, f: list[Finding],
          details: dict[str, Any]) -> None:
    raw = ctx.env.get("GLOO_SOCKET_IFNAME")
    if raw is None:
        return
    names = parse_gloo_ifnames(raw)
    details["gloo_interfaces"] = list(names)
    for name in names:
        iface = snap.get(name)
        if iface is None or not iface.addresses:
            what = "does not exist" if iface is None else "has no IPv4/IPv6 address"
            f.append(Finding(
                Status.FAIL, "GlooIfnameMissing",
                f"GLOO_SOCKET_IFNAME={raw!r}: interface {name!r} {what}; torch's gloo backend "
                "fails at init_process_group (entries are exact names, comma separated, no "
                "blanks).",
                f"export GLOO_SOCKET_IFNAME={_suggest(snap) or '<interface>'}", scope=Scope.JOB))
        elif not iface.running:
            f.append(Finding(
                Status.WARN, "GlooIfnameDown",
                f"GLOO_SOCKET_IFNAME names {name}, which is not RUNNING (down or no carrier).",
                f"ip link set {name} up, and check the cable; or name another interface."))
        elif multi and _bad_for_multi_node(name, snap):
            f.append(Finding(
                Status.FAIL, "GlooLoopbackForMultiNode",
                f"GLOO_SOCKET_IFNAME names {name} ({_bad_for_multi_node(name, snap)}) for a "
                "multi-node job; other nodes cannot reach it.",
                f"export GLOO_SOCKET_IFNAME={_suggest(snap) or '<data NIC>'}", scope=Scope.JOB))


def _suggest(snap: NetSnapshot, prefer: str | None = None) -> str | None:
    """An interface to recommend: the route's, else the first running non-lo/docker one."""
    if prefer and _bad_for_multi_node(prefer, snap) is None:
        return prefer
    for i in snap.interfaces:
        if i.running and i.addresses and _bad_for_multi_node(i.name, snap) is None \
                and not i.name.startswith("virbr"):
            return i.name
    return None


def _route(ctx: Context, snap: NetSnapshot, sel: Selection, *, bootstrap: tuple[str, str] | None,
           f: list[Finding], details: dict[str, Any]) -> str:
    """Judge the route to rank 0 for a multi-node job; returns a sentence for the summary."""
    raw = ctx.env.get("MASTER_ADDR")
    if raw is None:
        f.append(Finding(
            Status.WARN, "MasterAddrUnset",
            "MASTER_ADDR is not set, so the route to rank 0 was not checked.",
            "Run the check with the job's MASTER_ADDR (export MASTER_ADDR=<rank 0's host>).",
            scope=Scope.JOB))
        return ""
    # A MASTER_ADDR that is malformed or does not resolve is master_port's to report (one fault,
    # one owner); here it only means the route cannot be judged.
    try:
        addrs = ctx.resolve_host(parse_master_addr(raw).host)
    except (ParseError, socket.gaierror):
        addrs = ()
    if not addrs:
        return f"route to MASTER_ADDR={raw!r} not judged (master_port reports the address)"
    family, target = addrs[0]
    details["master_address"] = target
    if ipaddress.ip_address(target).is_loopback:
        f.append(Finding(
            Status.FAIL, "MasterAddrLoopback",
            f"MASTER_ADDR={raw!r} is {target}, a loopback address, in a multi-node job: the "
            "other nodes would connect to themselves.",
            "export MASTER_ADDR=<rank 0's routable IP, e.g. its data NIC's address>",
            scope=Scope.JOB))
        return ""
    try:
        src = ctx.route_source(family, target)
    except OSError as exc:
        f.append(Finding(
            Status.FAIL, "NoRouteToMaster",
            f"no route from this node to MASTER_ADDR {target} "
            f"({exc.strerror or exc}); NCCL bootstrap and the TCPStore cannot connect.",
            "Fix the routing (ip route get " + target + ") or use rank 0's address on a "
            "network this node is on."))
        return ""
    owner = snap.owner(src)
    route_if = owner.name if owner else None
    details["route_interface"] = route_if
    details["route_source"] = src
    details["route_mtu"] = owner.mtu if owner else None
    local = target == src
    where = (f"MASTER_ADDR {target} is this node's own address on {route_if}" if local else
             f"the kernel routes to MASTER_ADDR {target} via {route_if} (source {src})")
    if bootstrap is None:
        return where
    b_name = bootstrap[0]
    fix = _suggest(snap, route_if)
    remedy = f"export NCCL_SOCKET_IFNAME={fix}" if fix else \
        "Give this node a NIC on rank 0's network and name it in NCCL_SOCKET_IFNAME."
    bad = _bad_for_multi_node(b_name, snap)
    if owner is not None and not owner.running:
        f.append(Finding(
            Status.FAIL, "RouteNicDown",
            f"{where}, but {route_if} is not RUNNING (down or no carrier).",
            f"ip link set {route_if} up, and check the cable / switch port"))
    elif bad:
        f.append(Finding(
            Status.FAIL, "LoopbackForMultiNode" if bad == "loopback" else "DockerForMultiNode",
            f"NCCL bootstraps over {b_name} ({bad}) but this is a multi-node job; other nodes "
            f"cannot reach {bootstrap[1]}.", remedy, scope=Scope.JOB))
    elif route_if is not None and b_name != route_if:
        if _can_reach(snap, b_name, family, target):
            f.append(Finding(
                Status.WARN, "BootstrapNotOnRouteNic",
                f"NCCL bootstraps over {b_name} but {where}: it will work through {b_name} "
                "(often the management NIC) instead of the data NIC.", remedy))
        else:
            others = [n for n in sel.names if _can_reach(snap, n, family, target)
                      or n == route_if]
            tail = (f"; of the interfaces NCCL selects only {', '.join(others)} can"
                    if others else "; none of the interfaces NCCL selects can")
            f.append(Finding(
                Status.FAIL, "BootstrapCannotReachMaster",
                f"NCCL bootstraps over {b_name}, which has no route to MASTER_ADDR {target} "
                f"({where}){tail}; the job will hang in 'Initialization timed out'.", remedy))
    return where


def run(ctx: Context) -> Result:
    snap = ctx.interfaces()
    ib = ctx.ib()
    f: list[Finding] = []
    multi, why = multi_node(ctx)
    details: dict[str, Any] = {"multi_node": multi, "multi_node_why": why}

    family, family_ok = socket_family(ctx.env.get("NCCL_SOCKET_FAMILY"))
    if not family_ok:
        f.append(Finding(
            Status.WARN, "SocketFamilyIgnored",
            f"NCCL_SOCKET_FAMILY={ctx.env['NCCL_SOCKET_FAMILY']!r} is not AF_INET or AF_INET6; "
            "NCCL silently ignores it.",
            "export NCCL_SOCKET_FAMILY=AF_INET (or AF_INET6), or unset it.", scope=Scope.JOB))

    comm_host = None
    comm_id = ctx.env.get("NCCL_COMM_ID")
    if comm_id:
        try:
            comm_host = parse_comm_id(comm_id)[0]
        except ParseError as exc:
            f.append(Finding(
                Status.FAIL, "CommIdInvalid", f"{exc}; NCCL aborts at init.",
                "unset NCCL_COMM_ID (torch.distributed does not need it)", scope=Scope.JOB))
        else:
            f.append(Finding(
                Status.WARN, "CommIdSet",
                f"NCCL_COMM_ID={comm_id!r} is set: NCCL bootstrap uses it and ignores "
                "NCCL_SOCKET_IFNAME, picking the interface on that address's subnet.",
                "unset NCCL_COMM_ID (torch.distributed does not need it)", scope=Scope.JOB))

    _ifname_syntax(ctx, f)
    raw = ctx.env.get("NCCL_SOCKET_IFNAME")
    sel = nccl_socket_selection(snap.entries, raw, family=family, comm_id_host=comm_host)
    bootstrap = sel.bootstrap
    if comm_host:
        from preflight.jobenv.netvars import subnet_match

        bootstrap = subnet_match(snap.entries, comm_host) or bootstrap
    details.update({
        "nccl_socket_ifname": raw, "selection_mode": sel.mode, "selection_rule": sel.rule,
        "nccl_interfaces": [f"{n} {a}" for n, a in sel.interfaces],
        "bootstrap_interface": bootstrap[0] if bootstrap else None,
        "bootstrap_address": bootstrap[1] if bootstrap else None,
        "not_running": list(sel.not_running),
        "interfaces": [f"{i.name} {'RUNNING' if i.running else 'UP' if i.up else 'DOWN'} "
                       f"mtu={i.mtu}" for i in snap.interfaces],
    })
    how = _describe(sel)
    if not sel.interfaces:
        down = (f" ({', '.join(sel.not_running)} match but are not RUNNING: down or no carrier)"
                if sel.not_running else "")
        fam = f" with an {'IPv4' if family == socket.AF_INET else 'IPv6'} address" \
            if family is not None else ""
        usable = [i.name for i in snap.interfaces if i.running and i.addresses]
        fix = _suggest(snap)
        f.append(Finding(
            Status.FAIL, "NoNcclInterface",
            f"{how} matches no running interface{fam}{down}; NCCL fails with 'Bootstrap : no "
            f"socket interface found'. Running interfaces with addresses: "
            f"{', '.join(usable) or 'none'}.",
            f"export NCCL_SOCKET_IFNAME={fix}" if fix else
            "Bring up the data NIC (ip link set <nic> up) and give it an address.",
            # A name that matches nothing is the job's; a matching NIC that is down, the node's.
            scope=Scope.JOB if sel.mode == "user" and not sel.not_running else Scope.NODE))
    elif sel.not_running and sel.mode == "user":
        f.append(Finding(
            Status.WARN, "IfnameMatchesDownInterface",
            f"{', '.join(sel.not_running)} match(es) NCCL_SOCKET_IFNAME={raw!r} but is not "
            "RUNNING (down or no carrier); NCCL skips it.",
            f"ip link set {sel.not_running[0]} up, and check the cable / switch port"))

    summary_parts = []
    if bootstrap:
        b_if = snap.get(bootstrap[0])
        mtu = b_if.mtu if b_if else None
        details["bootstrap_mtu"] = mtu
        summary_parts.append(
            f"NCCL will use {', '.join(sel.names)} ({how}); bootstrap {bootstrap[0]} "
            f"{bootstrap[1]}, MTU {mtu if mtu is not None else 'unknown'} bytes.")

    if multi:
        before = len(f)
        where = _route(ctx, snap, sel, bootstrap=bootstrap, f=f, details=details)
        # A route finding already says where the route goes; do not say it twice.
        said = any(where and where in m for m in (x.message for x in f[before:]))
        summary_parts.append(f"Multi-node ({why})" + (f": {where}." if where and not said
                                                       else "."))
    else:
        summary_parts.append(f"Single-node job ({why}): route to rank 0 not needed.")

    _ib(ctx, ib, multi, f, details)
    if details.get("ib_selected"):
        summary_parts.append(f"IB: {', '.join(details['ib_selected'])}.")  # type: ignore[arg-type]
    _gloo(ctx, snap, multi, f, details)
    return fold(NAME, f, ok_reason="NetworkOk", summary=" ".join(summary_parts),
                details=details, summary_up_to=Status.FAIL)
