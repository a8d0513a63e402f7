"""``preflight serve``: the node daemon (systemd / DaemonSet) serving /metrics, /healthz, /report.

Default listen address: ``127.0.0.1:9857`` (loopback only, so nothing is exposed by accident;
9857 is outside the usual exporter ports 9100 node_exporter, 9400 dcgm-exporter). A DaemonSet with
hostNetwork passes ``--listen 0.0.0.0:9857`` or the node's address. See docs/daemon.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from preflight.cli import Formatter, add_config_options
from preflight.core.textsafe import escape

if TYPE_CHECKING:
    from preflight.core.config import Config


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve", formatter_class=Formatter,
        help="run the checks on a schedule and serve Prometheus metrics (systemd, DaemonSet)",
        description="Run the node checks every --interval seconds in a child process, keep the "
                    "last report, and serve it over HTTP: /metrics (Prometheus), /healthz (the "
                    "daemon's own liveness), /report (JSON as `preflight check --json`). The "
                    "bandwidth test runs every --bandwidth-interval seconds, only while no "
                    "process uses the GPUs. SIGHUP reloads the config; SIGTERM stops.",
        epilog="exit codes: 0 stopped by SIGTERM/SIGINT, 2 usage or configuration error "
               "(bad config, address in use). Details: preflight docs daemon")
    p.add_argument("--listen", metavar="HOST:PORT",
                   help="address to serve on, exactly as given ([::1]:9857 for IPv6, port 0 = "
                        "any free port) (config key listen; default 127.0.0.1:9857)")
    p.add_argument("--interval", type=float, metavar="S", dest="interval_s",
                   help="seconds between node-check runs (config key interval_s; default 60)")
    p.add_argument("--bandwidth-interval", type=float, metavar="S", dest="bandwidth_interval_s",
                   help="seconds between bandwidth tests, run only when no compute process "
                        "uses the GPUs (config key bandwidth_interval_s; default 3600)")
    add_config_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from preflight.core.config import load
    from preflight.core.result import ExitCode
    from preflight.daemon import Daemon, DaemonError
    from preflight.probes.xid_events import node_watcher

    overrides = {"listen": args.listen, "interval_s": args.interval_s,
                 "bandwidth_interval_s": args.bandwidth_interval_s}

    def load_config() -> Config:
        # Same precedence at start and on SIGHUP: defaults < file < PREFLIGHT_* < command line.
        return load(path=args.config, env=os.environ, overrides=overrides)

    daemon = Daemon(load_config(), load_config=load_config, root=args.root,
                    xid_watcher=node_watcher(args.root))
    try:
        daemon.serve_forever()
    except DaemonError as exc:
        print(f"preflight serve: {escape(str(exc), 600)}", file=sys.stderr)
        return int(ExitCode.USAGE)
    return int(ExitCode.OK)
