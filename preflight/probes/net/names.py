"""Name resolution and routes as torch's TCPStore client meets them, each within a deadline."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def with_deadline(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """Run a blocking call (getaddrinfo has no timeout of its own) on a daemon thread.

    Raises:
        TimeoutError: the call did not return within ``timeout_s``; the thread is abandoned (it
            holds no socket of ours and ends when the resolver gives up).
    """
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=target, name=f"deadline-{what}", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise TimeoutError(f"{what} did not answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def resolve_host(host: str, *, timeout_s: float) -> tuple[tuple[int, str], ...]:
    """getaddrinfo(host) as torch's TCPStore client calls it: (family, address) in its order.

    Raises:
        socket.gaierror: the name does not resolve.
        TimeoutError: the resolver did not answer in time.
    """
    def lookup() -> tuple[tuple[int, str], ...]:
        try:
            infos = socket.getaddrinfo(host, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
        except UnicodeError as exc:  # the IDNA codec refuses the name before any lookup
            raise socket.gaierror(socket.EAI_NONAME, f"not a valid host name ({exc})") from None
        out: list[tuple[int, str]] = []
        for family, _, _, _, sockaddr in infos:
            item = (int(family), str(sockaddr[0]).split("%", 1)[0])
            if family in (socket.AF_INET, socket.AF_INET6) and item not in out:
                out.append(item)
        return tuple(out)

    return with_deadline(lookup, timeout_s, f"resolving {host}")


def route_source(family: int, address: str) -> str:
    """The source address the kernel picks to reach ``address`` (a UDP connect sends nothing).

    Raises:
        OSError: no route (ENETUNREACH / EHOSTUNREACH).
    """
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect((address, 9))
        return str(sock.getsockname()[0]).split("%", 1)[0]
