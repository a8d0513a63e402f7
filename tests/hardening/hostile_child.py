"""A check child that abuses the daemon's trust: ``python hostile_child.py MODE [PIDFILE]``.

* ``flood``: writes 1.5 GB to stdout, then a valid report.
* ``flood-stderr``: writes 256 MiB to stderr, then a valid report.
* ``fingerprint-str`` / ``bandwidth-list`` / ``details-list`` / ``nan-duration`` /
  ``bad-check-name``: a report with one field of the wrong type.
* ``setsid-holder``: starts a grandchild that calls ``setsid`` and keeps stdout open (its pid in
  PIDFILE), prints a valid report and exits.
* ``setpgid-hide``: starts a grandchild that leaves the process group (``setpgid``) and closes
  its pipes, prints a valid report and exits.
* ``ok``: a valid report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any


def report(**changes: Any) -> bytes:
    data: dict[str, Any] = {
        "schema_version": 1, "mode": "check", "host": "node-a", "timestamp_s": time.time(),
        "version": "0", "status": "pass",
        "results": [{"check": "alpha", "status": "pass", "scope": "node", "reason": "AlphaOk",
                     "message": "alpha is fine", "remedy": "", "details": {},
                     "duration_s": 0.01}],
        "fingerprint": None, "bandwidth": None}
    result_changes = changes.pop("result", {})
    data.update(changes)
    data["results"][0].update(result_changes)
    return json.dumps(data).encode()


SLEEPER = "import os, sys, time; {prelude}; open(sys.argv[1], 'w').write(str(os.getpid())); " \
          "time.sleep(600)"


def grandchild(prelude: str, pid_file: str, **popen: Any) -> None:
    subprocess.Popen([sys.executable, "-c", SLEEPER.format(prelude=prelude), pid_file], **popen)
    deadline = time.monotonic() + 10
    while not os.path.exists(pid_file) and time.monotonic() < deadline:
        time.sleep(0.01)


def main(mode: str, pid_file: str = "") -> int:
    sys.stdin.read()  # the daemon's config
    out = sys.stdout.buffer
    if mode == "flood":
        block = b"x" * (1 << 20)
        for _ in range(1536):
            out.write(block)
    elif mode == "flood-stderr":
        block = b"e" * (1 << 20)
        for _ in range(256):
            sys.stderr.buffer.write(block)
        sys.stderr.flush()
    elif mode == "setsid-holder":
        grandchild("os.setsid()", pid_file)  # inherits stdout and stderr
    elif mode == "setpgid-hide":
        grandchild("os.setpgid(0, 0)", pid_file, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    bad: dict[str, dict[str, Any]] = {
        "fingerprint-str": {"fingerprint": "sha256:abc"},
        "bandwidth-list": {"bandwidth": [1, 2, 3]},
        "details-list": {"result": {"details": [1]}},
        "nan-duration": {"result": {"duration_s": float("nan")}},
        "bad-check-name": {"result": {"check": "alpha\x1b[2J"}},
    }
    out.write(report(**bad.get(mode, {})))
    out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
