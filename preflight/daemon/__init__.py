"""``preflight serve``: a long-running daemon that keeps a fresh verdict and serves it as metrics.

Design (docs/daemon.md), one module per concern:

* :mod:`.child` -- checks run in a **child process** (``python -m preflight check --json
  --no-bandwidth``) with a deadline; when it passes, the child's whole process group is killed and
  every check of that run is reported as ERROR (``RunTimeout``). The daemon never imports torch.
* :mod:`.scheduler` -- the :class:`Daemon`: node runs every ``interval_s``, the bandwidth test every
  ``bandwidth_interval_s`` only while no job uses the GPUs, never two runs at once; the cached
  Report; config reload (a bad file keeps the old config, ``preflight_config_reload_success 0``).
* :mod:`.server` -- HTTP: ``/metrics``, ``/healthz``, ``/report``; a scrape never runs a check.
* :mod:`.systemd` -- ``READY=1``, ``WATCHDOG=1`` every half ``WATCHDOG_USEC`` while the loop is
  alive, ``STOPPING=1`` (a datagram to ``$NOTIFY_SOCKET``; no dependency).
* :mod:`.signals` -- clean exit on SIGTERM/SIGINT, reload on SIGHUP.
"""

from __future__ import annotations

from preflight.daemon.child import CHILD_GRACE_S, CHILD_NICE, ChildRunner, RunKind, Runner
from preflight.daemon.scheduler import Daemon, DaemonError, running
from preflight.daemon.server import METRICS_CONTENT_TYPE, Health, parse_listen
from preflight.daemon.systemd import sd_notify, watchdog_interval_s

__all__ = ["CHILD_GRACE_S", "CHILD_NICE", "METRICS_CONTENT_TYPE", "ChildRunner", "Daemon",
           "DaemonError", "Health", "RunKind", "Runner", "parse_listen", "running", "sd_notify",
           "watchdog_interval_s"]
