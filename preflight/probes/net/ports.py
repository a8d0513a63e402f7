"""Who holds a TCP port, whether it can be listened on as torch's TCPStore would, and a connect
test: what ``master_port`` asks of rank 0's port."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from dataclasses import dataclass

import psutil

from preflight.core.boundedio import read_small_text


@dataclass(frozen=True)
class PortHolder:
    """A process with a socket on the port. pid/name/user are None when not visible to us."""

    pid: int | None
    name: str | None
    user: str | None
    status: str
    local: str


def port_holders(port: int) -> tuple[PortHolder, ...]:
    """Sockets bound to TCP ``port`` (listeners first) and their processes, via psutil."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return ()
    out: list[PortHolder] = []
    for c in conns:
        if not c.laddr or c.laddr.port != port:
            continue
        if c.status not in (psutil.CONN_LISTEN, psutil.CONN_NONE) and c.raddr:
            continue  # an outbound connection that happens to use the port number
        name = user = None
        if c.pid is not None:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(c.pid)
                name = proc.name()
                user = proc.username()
        out.append(PortHolder(c.pid, name, user, str(c.status), f"{c.laddr.ip}:{c.laddr.port}"))
    out.sort(key=lambda h: (h.status != psutil.CONN_LISTEN, h.pid or 0))
    unique: list[PortHolder] = []
    for h in out:
        if all(h.pid != u.pid or h.pid is None for u in unique):
            unique.append(h)
    return tuple(unique)


def ancestor_pids() -> frozenset[int]:
    """This process and its parents (a torchrun agent that already holds the port is ours)."""
    pids = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in psutil.Process().parents())
    return frozenset(pids)


def try_listen(port: int) -> OSError | None:
    """Bind and listen on ``port`` on every address as torch's TCPStore server does, then close.

    TCPStore listens on the wildcard address (dual-stack ``::`` when IPv6 exists) with
    SO_REUSEADDR, so TIME_WAIT leftovers do not count but any listener does. The socket is closed
    before returning: a listener with no connections leaves nothing behind.

    Returns:
        None when the port is free, else the error (EADDRINUSE, EACCES...).
    """
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 in this namespace: fall back to IPv4
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((host, port))
            sock.listen(1)
        except OSError as exc:
            if family == socket.AF_INET6 and exc.errno == errno.EADDRNOTAVAIL:
                continue  # IPv6 disabled on this node
            return exc
        finally:
            sock.close()
        return None
    return OSError(errno.EAFNOSUPPORT, "no IPv4 or IPv6 socket could be created")


def free_port_near(port: int, *, tries: int = 64) -> int | None:
    """A port after ``port`` that can be listened on now, outside the ephemeral range."""
    low, high = 32768, 60999
    with contextlib.suppress(OSError, ValueError):
        low, high = (int(x) for x in
                     read_small_text("/proc/sys/net/ipv4/ip_local_port_range").split())
    candidate = port
    for _ in range(tries):
        candidate += 1
        if candidate > 65535:
            candidate = 20000
        if low <= candidate <= high:
            candidate = high + 1 if high < 65535 else 20000
        if try_listen(candidate) is None:
            return candidate
    return None


def tcp_connect(family: int, address: str, port: int, *, timeout_s: float) -> str:
    """Try a TCP connect and close at once: ``"connected"``, ``"refused"``, ``"timeout"``, or
    the error text (``"No route to host"``)."""
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect((address, port))
        except ConnectionRefusedError:
            return "refused"
        except TimeoutError:
            return "timeout"
        except OSError as exc:
            return exc.strerror or str(exc)
        return "connected"
