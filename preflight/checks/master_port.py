"""``master_port``: MASTER_ADDR resolves, and rank 0's node can listen on MASTER_PORT right now.

What: MASTER_ADDR must resolve (getaddrinfo, 2 s deadline). On the node that hosts rank 0 (RANK=0,
or MASTER_ADDR is one of this node's addresses) MASTER_PORT is bound and listened on exactly as
torch's TCPStore does (wildcard address, SO_REUSEADDR), then released at once; when that fails the
result names the holder (pid, name, user, through psutil when visible) and a port free now. On the
other nodes the check SKIPs, unless ``--probe-master`` asks for a TCP connect to
MASTER_ADDR:MASTER_PORT (2 s deadline; "refused" only means rank 0 is not up yet).

Why: "Address already in use" is one of the most common start-up errors of torchrun jobs;
MASTER_PORT is rank 0's rendezvous port, and two jobs on one node with the default 29500
collide -- the second one dies. All nodes must use the same port and reach it, or they wait until
"Initialization timed out".

Scope: a port in use, a privileged port, a malformed or unresolvable MASTER_ADDR are the job's own
settings (scope job: reported to the job, never a drain); an unreachable rank 0 is the node's. This
check owns MASTER_ADDR and MASTER_PORT: ``network`` and ``launcher_env`` leave them to it.

Knobs: ``probe_master`` (``--probe-master``, default False).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from typing import Any

from preflight.core.context import Context, activity
from preflight.core.result import Result, Scope, Status
from preflight.jobenv.launcher import env_int
from preflight.jobenv.netvars import ParseError, parse_master_addr, parse_master_port

NAME = "master_port"
#: Deadline of the --probe-master TCP connect, seconds.
CONNECT_TIMEOUT_S = 2.0


def _holders_text(port: int) -> tuple[str, list[Any], set[int]]:
    from preflight.probes.net import port_holders

    with activity(f"finding the process on port {port} (psutil)"):
        holders = port_holders(port)
    if not holders:
        return ("the holder is not visible to this user (run as root, or: ss -ltnp "
                f"'sport = :{port}')"), [], set()
    parts = []
    for h in holders:
        who = f"pid {h.pid}" if h.pid is not None else "a process not visible to this user"
        extra = ", ".join(x for x in (h.name, f"user {h.user}" if h.user else None) if x)
        parts.append(f"{who}{f' ({extra})' if extra else ''} {h.status} on {h.local}")
    pids = {h.pid for h in holders if h.pid is not None}
    return "held by " + "; ".join(parts), [
        {"pid": h.pid, "name": h.name, "user": h.user, "status": h.status, "local": h.local}
        for h in holders], pids


def _check_bind(ctx: Context, port: int, details: dict[str, Any], why: str) -> Result:
    from preflight.probes.net import ancestor_pids, free_port_near, try_listen

    with activity(f"binding port {port}"):
        err = try_listen(port)
    if err is None:
        return Result(NAME, Status.PASS, "MasterPortFree",
                      f"MASTER_PORT {port} is free on this node ({why}): listened on and "
                      "released.", details=details)
    if err.errno == errno.EACCES:
        return Result(NAME, Status.FAIL, "MasterPortPrivileged",
                      f"MASTER_PORT {port} needs privileges to listen on (ports below 1024); "
                      "rank 0 will fail with 'Permission denied'.",
                      "export MASTER_PORT=29500 (or any free port from 1024 up)", details=details,
                      scope=Scope.JOB)
    if err.errno != errno.EADDRINUSE:
        raise err
    text, holders, pids = _holders_text(port)
    details["holders"] = holders
    ours = pids & ancestor_pids()
    if ours and pids <= ours:
        return Result(NAME, Status.PASS, "MasterPortHeldByLauncher",
                      f"MASTER_PORT {port} is in use by this job's own launcher ({text}).",
                      details=details)
    with activity("looking for a free port"):
        free = free_port_near(port)
    details["suggested_port"] = free
    stop = (f"; or stop the leftover process if it is a dead job's (kill {min(pids)})"
            if pids else "")
    return Result(NAME, Status.FAIL, "MasterPortInUse",
                  f"MASTER_PORT {port} is in use on this node ({why}): {text}; rank 0 will fail "
                  "with 'Address already in use'.",
                  (f"export MASTER_PORT={free} (free now)" if free else
                   "export MASTER_PORT=$((RANDOM + 20000))") + stop,
                  details=details, scope=Scope.JOB)


def run(ctx: Context) -> Result:
    raw_addr = ctx.env.get("MASTER_ADDR")
    raw_port = ctx.env.get("MASTER_PORT")
    if raw_addr is None and raw_port is None:
        return Result(NAME, Status.SKIP, "MasterUnset",
                      "MASTER_ADDR and MASTER_PORT are not set (not a torchrun / env:// job); "
                      "nothing to check.")
    details: dict[str, Any] = {"master_addr": raw_addr, "master_port": raw_port}
    try:
        port = parse_master_port(raw_port)
    except ParseError as exc:
        return Result(NAME, Status.FAIL, "MasterPortInvalid", f"{exc}.",
                      "export MASTER_PORT=29500 (the same value on every node)", details=details,
                      scope=Scope.JOB)
    details["port"] = port
    port_note = "" if raw_port is not None else " (MASTER_PORT unset: torchrun's default)"
    rank = env_int(ctx.env, "RANK")

    if raw_addr is None:
        # torchrun's default --master-addr is 127.0.0.1: a single-node job on this node.
        if rank not in (None, 0):
            return Result(NAME, Status.SKIP, "NotMasterNode",
                          f"RANK={rank} and MASTER_ADDR unset: rank 0's node checks the port.",
                          details=details)
        return _check_bind(ctx, port, details, "MASTER_ADDR unset: torchrun uses 127.0.0.1")

    try:
        master = parse_master_addr(raw_addr)
    except ParseError as exc:
        return Result(NAME, Status.FAIL, "MasterAddrInvalid", f"{exc}.",
                      "export MASTER_ADDR=<rank 0's hostname or IP, as every node resolves it>",
                      details=details, scope=Scope.JOB)
    try:
        addrs = ctx.resolve_host(master.host)
    except socket.gaierror as exc:
        return Result(NAME, Status.FAIL, "MasterAddrUnresolved",
                      f"MASTER_ADDR={raw_addr!r} does not resolve on this node "
                      f"({exc.strerror or exc}); every rank connects to it.",
                      "Use an IP, or add rank 0's name to DNS / /etc/hosts on every node: "
                      "export MASTER_ADDR=<rank 0's IP>", details=details, scope=Scope.JOB)
    if not addrs:
        return Result(NAME, Status.FAIL, "MasterAddrUnresolved",
                      f"MASTER_ADDR={raw_addr!r} resolves to no IPv4/IPv6 address.",
                      "export MASTER_ADDR=<rank 0's IP>", details=details, scope=Scope.JOB)
    details["resolved"] = [a for _, a in addrs]
    local = {a for i in ctx.interfaces().interfaces for _, a, _ in i.addresses}
    mine = [a for _, a in addrs if a in local or ipaddress.ip_address(a).is_loopback]
    if rank == 0 or mine:
        why = f"RANK={rank}" if rank == 0 else f"MASTER_ADDR {mine[0]} is this node's address"
        result = _check_bind(ctx, port, details, why + port_note)
        return result
    shown = ", ".join(a for _, a in addrs)
    shown = "" if shown == raw_addr else f" ({shown})"
    why = (f"RANK={rank}; " if rank is not None else "") + \
        f"MASTER_ADDR {raw_addr}{shown} is not one of this node's addresses"
    if not ctx.config.probe_master:
        return Result(NAME, Status.SKIP, "NotMasterNode",
                      f"Not rank 0's node ({why}); the port is checked on rank 0's node. "
                      "--probe-master tries a TCP connect to it.", details=details)
    from preflight.probes.net import tcp_connect

    family, target = addrs[0]
    timeout = min(CONNECT_TIMEOUT_S, ctx.config.check_timeout_s / 3)
    with activity(f"TCP connect to {target}:{port}"):
        outcome = tcp_connect(family, target, port, timeout_s=timeout)
    details["probe"] = outcome
    dest = f"{target}:{port}" if family == socket.AF_INET else f"[{target}]:{port}"
    if outcome == "connected":
        return Result(NAME, Status.PASS, "MasterReachable",
                      f"{dest} accepted a TCP connection (rank 0's store is up, or another "
                      "process listens there).", details=details)
    if outcome == "refused":
        return Result(NAME, Status.PASS, "MasterReachableNotListening",
                      f"{dest} answered but nothing listens yet (connection refused): the host is "
                      "reachable; rank 0 has not started.", details=details)
    if outcome == "timeout":
        return Result(NAME, Status.FAIL, "MasterUnreachable",
                      f"{dest} did not answer within {timeout:g} s: a firewall drops the "
                      "packets or the route is wrong; ranks will wait until 'Initialization "
                      "timed out'.",
                      f"Open TCP port {port} on rank 0's node (e.g. firewall-cmd --add-port="
                      f"{port}/tcp, or the security group) and check: nc -vz {target} {port}",
                      details=details)
    return Result(NAME, Status.FAIL, "MasterUnreachable",
                  f"cannot connect to {dest}: {outcome}.",
                  f"Check the route (ip route get {target}) and that rank 0's node is up.",
                  details=details)
