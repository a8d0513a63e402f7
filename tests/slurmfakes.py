"""A stand-in for scontrol and sinfo that keeps a little cluster in a JSON file: ``update
state=drain|resume`` changes a node, ``show node`` and ``sinfo`` print it the way Slurm 22.05
does (tests/slurm checks the real ones). Every call's argv is recorded. And a process that
looks like NVIDIA's persistence daemon."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCRIPT = r'''#!{python} -S
import json, sys
path = {state!r}
with open(path) as f:
    cluster = json.load(f)
cluster["calls"].append(sys.argv[1:])
args = sys.argv[1:]
prog = {prog!r}
out = ""
code = 0
if prog == "sinfo":
    for name, node in cluster["nodes"].items():
        state = node["state"].lower()
        word = "drained" if "DRAIN" in node["state"] else state
        out += f"{{name}}|{{word}}|{{node['reason'] or 'none'}}\n"
elif args[:2] == ["show", "node"]:
    node = cluster["nodes"].get(args[2])
    if node is None:
        out, code = "", 1
    else:
        out = (f"NodeName={{args[2]}} Arch=x86_64 CoresPerSocket=1\n"
               f"   State={{node['state']}} ThreadsPerCore=1 TmpDisk=0 Weight=1\n")
        if node["reason"]:
            out += f"   Reason={{node['reason']}} [root@2026-12-01T10:00:00]\n"
elif args[:1] == ["update"]:
    fields = dict(a.split("=", 1) for a in args[1:] if "=" in a)
    node = cluster["nodes"][fields["nodename"]]
    if fields.get("state") == "drain":
        node["state"] = "IDLE+DRAIN"
        node["reason"] = fields.get("reason", "")
    elif fields.get("state") == "resume":
        node["state"] = "IDLE"
        node["reason"] = ""
with open(path, "w") as f:
    json.dump(cluster, f)
sys.stdout.write(out)
sys.exit(code)
'''


@dataclass
class FakeSlurm:
    """The fake's files: ``scontrol`` and ``sinfo`` to pass to the CLI, ``state`` the cluster."""

    scontrol: Path
    sinfo: Path
    state: Path

    def cluster(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.state.read_text())
        return data

    def node(self, name: str) -> dict[str, str]:
        node: dict[str, str] = self.cluster()["nodes"][name]
        return node

    def set_node(self, name: str, state: str, reason: str = "") -> None:
        data = self.cluster()
        data["nodes"][name] = {"state": state, "reason": reason}
        self.state.write_text(json.dumps(data))

    def calls(self) -> list[list[str]]:
        calls: list[list[str]] = self.cluster()["calls"]
        return calls

    def updates(self) -> list[list[str]]:
        return [c for c in self.calls() if c[:1] == ["update"]]

    def args(self) -> list[str]:
        return ["--scontrol", str(self.scontrol), "--sinfo", str(self.sinfo)]


def fake_slurm(directory: Path, nodes: dict[str, tuple[str, str]]) -> FakeSlurm:
    """A fake cluster of ``nodes`` (name -> (state, reason)) under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    state = directory / "cluster.json"
    state.write_text(json.dumps({"calls": [], "nodes": {
        n: {"state": s, "reason": r} for n, (s, r) in nodes.items()}}))
    paths = []
    for prog in ("scontrol", "sinfo"):
        script = directory / prog
        script.write_text(_SCRIPT.format(python=sys.executable, state=str(state), prog=prog))
        script.chmod(0o755)
        paths.append(script)
    return FakeSlurm(paths[0], paths[1], state)


@contextlib.contextmanager
def persistence_daemon(directory: Path) -> Iterator[int]:
    """A real process named like NVIDIA's persistence daemon (a copy of sleep): what tells the
    GPU probe that the driver is initialised, so a silent NVML is a hung one
    (preflight/probes/driverstate.py). Yields its pid; killed on exit."""
    exe = directory / "nvidia-persistenced"
    shutil.copy("/bin/sleep", exe)
    proc = subprocess.Popen([str(exe), "300"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
