"""systemd's notify protocol: ``READY=1``, ``WATCHDOG=1``, ``STOPPING=1`` as one datagram on
``$NOTIFY_SOCKET`` (sd_notify(3)), abstract ``@`` sockets included; no dependency."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)

#: Variables a child must not inherit: only the daemon talks to systemd.
NOTIFY_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def sd_notify(message: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``message`` (``"READY=1"``) to systemd's ``$NOTIFY_SOCKET``; False when not under
    systemd or when the datagram could not be sent (never raises: systemd is optional).

    The protocol is one datagram on a unix socket (sd_notify(3)); a leading ``@`` names an
    abstract socket.
    """
    address = (env if env is not None else os.environ).get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(1.0)
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        log.warning("cannot notify systemd at %r: %s", address, exc)
        return False
    return True


def watchdog_interval_s(env: Mapping[str, str]) -> float | None:
    """Half of ``$WATCHDOG_USEC`` in seconds (sd_watchdog_enabled(3)), None when not asked for or
    meant for another process (``$WATCHDOG_PID``)."""
    usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and (not pid.isdigit() or int(pid) != os.getpid()):
        return None
    return int(usec) / 2e6
