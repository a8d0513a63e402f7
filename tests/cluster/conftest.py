"""Several "nodes" on one machine: a network namespace each, joined by veth pairs to a bridge.

The bridge lives in a hub namespace of its own, so nothing touches the host's network; each node
namespace holds ``eth0`` (10.77.0.<rank+1>/24) and ``lo``. Agents run as
``ip netns exec NODE unshare --uts python -c <sethostname + exec python -m ...>``: a UTS
namespace each, so every node has its own hostname. Names carry the pid and a counter,
so concurrent runs never meet; every namespace is deleted, every agent killed at teardown.
"""

from __future__ import annotations

import codecs
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SUBNET = "10.77.0"
PORT = 29500
_ids = count()

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None,
    reason="network namespaces need root, iproute2 and util-linux (CI runs as root)")

#: Sets the hostname inside the new UTS namespace, then becomes ``python -m preflight``.
LAUNCH = ("import os, socket, sys; socket.sethostname(sys.argv[1]); "
          "os.execv(sys.executable, [sys.executable, '-m', *sys.argv[2:]])")


def ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, timeout=10, capture_output=True)


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """No job variables of the developer's shell leak into an agent."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NCCL_", "TORCH_", "SLURM_", "PREFLIGHT_", "CUDA_", "GLOO_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                         "MASTER_PORT", "GROUP_RANK", "NNODES", "NODE_RANK")}
    # Short check deadlines: the node-checks phase waits for at least check_timeout_s + 5 s.
    env.update({"PYTHONPATH": str(REPO), "PREFLIGHT_EXPECT_GPUS": "0",
                "PREFLIGHT_CHECK_TIMEOUT_S": "3", "PREFLIGHT_NVML_FIXTURE": "", **(extra or {})})
    return env


@dataclass
class Agent:
    rank: int
    proc: subprocess.Popen[str]
    err: list[str] = field(default_factory=list)
    #: How much of ``err`` (joined) earlier waits have consumed: a wait sees later lines only.
    _seen: int = 0
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace"))

    def wait_stderr(self, text: str, timeout_s: float = 30.0) -> None:
        """Read the agent's stderr until a line contains ``text`` (the --verbose phases).

        Reads the pipe's descriptor itself: a buffered readline can pull several lines into
        its buffer at once, and a select on the descriptor then never wakes for the ones it
        holds (a wait for the second of two lines printed together missed it)."""
        assert self.proc.stderr is not None
        fd = self.proc.stderr.fileno()
        deadline = time.monotonic() + timeout_s
        while True:
            got = "".join(self.err)
            end = got.rfind("\n") + 1
            at = got.find(text, self._seen, end)
            if at >= 0:
                self._seen = got.index("\n", at) + 1
                return
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([fd], [], [], min(0.2, left))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                self.err.append(self._decoder.decode(chunk))
        raise AssertionError(f"node {self.rank} never printed {text!r}: {''.join(self.err)}")

    def finish(self, timeout_s: float) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout_s)
        return self.proc.returncode, out, "".join(self.err) + err


@dataclass
class Cluster:
    """``n`` node namespaces on one bridge; :meth:`start` runs an agent in one of them."""

    n: int
    tag: str
    agents: list[Agent] = field(default_factory=list)

    @property
    def hub(self) -> str:
        return f"pfc{self.tag}-hub"

    def ns(self, rank: int) -> str:
        return f"pfc{self.tag}-n{rank}"

    def addr(self, rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    def build(self) -> None:
        ip("netns", "add", self.hub)
        ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        ip("-n", self.hub, "link", "set", "br0", "up")
        for r in range(self.n):
            ns = self.ns(r)
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", self.hub, "link", "add", f"v{r}", "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            ip("-n", self.hub, "link", "set", f"v{r}", "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{self.addr(r)}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")

    def slow(self, rank: int, rate: str = "20mbit") -> None:
        """A real token-bucket qdisc on the node's link (netem is not in the CI kernel), both
        ways: on the node's eth0 (what it sends) and on its bridge port (what it receives)."""
        for ns, dev in ((self.ns(rank), "eth0"), (self.hub, f"v{rank}")):
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev,
                            "root", "tbf", "rate", rate, "burst", "128kb", "latency", "200ms"],
                           check=True, timeout=10, capture_output=True)

    def cap(self, rate: str) -> None:
        """Every node's link at ``rate``: on a 2-core machine an uncapped veth measures how the
        CPU is shared between the pairs, not a network; capped, the network is the limit, as on
        a real fabric."""
        for r in range(self.n):
            self.slow(r, rate)

    def start(self, rank: int, *args: str, nnodes: int | None = None, node_rank: int | None = None,
              env: Mapping[str, str] | None = None, timeout_s: float = 6, json: bool = True,
              master: str | None = None, hostname: str | None = None) -> Agent:
        return self.run(rank, ["preflight", "cluster",
                               "--nnodes", str(self.n if nnodes is None else nnodes),
                               "--node-rank", str(rank if node_rank is None else node_rank),
                               "--master-addr", master or self.addr(0),
                               "--master-port", str(PORT), "--timeout", f"{timeout_s:g}",
                               *(["--json"] if json else []), "--verbose", *args], env,
                        hostname=hostname)

    def run(self, rank: int, module_args: Sequence[str], env: Mapping[str, str] | None = None,
            *, hostname: str | None = None) -> Agent:
        """``python -m MODULE ARGS`` in node ``rank``'s namespaces, hostname ``node<rank>``."""
        argv = ["ip", "netns", "exec", self.ns(rank), "unshare", "--uts", "--",
                sys.executable, "-c", LAUNCH, hostname or f"node{rank}", *module_args]
        proc = subprocess.Popen(argv, env=clean_env(env), cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        agent = Agent(rank, proc)
        self.agents.append(agent)
        return agent

    def hosts(self, rank: int, text: str) -> None:
        """Node ``rank``'s /etc/hosts (``ip netns exec`` bind-mounts /etc/netns/NS/hosts over
        it): written in place, so a running agent's next lookup sees the new text."""
        path = Path("/etc/netns") / self.ns(rank) / "hosts"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as f:  # the same inode: the bind mount keeps showing it
            f.write(text)

    def pids(self, rank: int) -> list[str]:
        out = subprocess.run(["ip", "netns", "pids", self.ns(rank)], capture_output=True,
                             text=True, timeout=10, check=False).stdout
        return out.split()

    def port_bound(self, rank: int, port: int = PORT) -> bool:
        out = subprocess.run(["ip", "netns", "exec", self.ns(rank), "ss", "-Htln",
                              f"sport = :{port}"], capture_output=True, text=True, timeout=10,
                             check=False).stdout
        return bool(out.strip())

    def teardown(self) -> None:
        for a in self.agents:
            if a.proc.poll() is None:
                os.kill(a.proc.pid, signal.SIGCONT)
                a.proc.kill()
                a.proc.wait(timeout=10)
        for r in range(self.n):
            for pid in self.pids(r):
                # Only processes inside this run's own namespaces: ours by construction.
                os.kill(int(pid), signal.SIGKILL)
        for name in [*(self.ns(r) for r in range(self.n)), self.hub]:
            subprocess.run(["ip", "netns", "del", name], timeout=10, capture_output=True,
                           check=False)
            shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)


@pytest.fixture
def cluster() -> Iterator[object]:
    made: list[Cluster] = []

    def make(n: int) -> Cluster:
        c = Cluster(n, f"{os.getpid()}x{next(_ids)}")
        made.append(c)
        c.build()
        return c

    try:
        yield make
    finally:
        for c in made:
            c.teardown()


def finish_all(agents: Sequence[Agent], timeout_s: float) -> list[tuple[int, str, str]]:
    return [a.finish(timeout_s) for a in agents]
