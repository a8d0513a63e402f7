"""A real one-node Slurm on 127.0.0.1 for the preflight hooks: munged + slurmctld + slurmd.

Everything lives in a temporary directory: its own munge key and socket (``AuthInfo=socket=``), its
own slurm.conf on free ports, state, spool, pid and log files, so the test neither needs nor
disturbs a system Slurm or munged (Debian's packages install but, under policy-rc.d, do not start
them). The daemons run in the foreground (``-D`` / ``-F``) as children of pytest, each in its own
session; teardown stops them, waits for them, and verifies that no process carrying this
cluster's SLURM_CONF is left and that nothing listens on its ports.

The Prolog, Epilog and HealthCheckProgram are wrapper scripts (slurmd gives its hooks no PATH,
ecosystem.md section 1) that run ``python -m preflight prolog`` / ``epilog`` / ``prolog --resume``
on the NVML fixture at ``SlurmCluster.nvml_fixture``: a test writes the GPU node it wants there
before it submits a job. A second node, ``ghost1``, never starts a slurmd: it is the rest of the
fleet for the fleet guard.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "scancel")
#: Deadline of every wait: slurmd registers in ~1 s and a job settles in ~3 s on a 2-core VM;
#: 30 s is generous and keeps a failing test inside pytest-timeout's 120 s, with the logs shown.
WAIT_TIMEOUT_S = 30.0
#: A daemon that ignores SIGTERM for this long is killed.
STOP_TIMEOUT_S = 15.0
#: Every Slurm client call gets this deadline (MessageTimeout is 10 s).
CLIENT_TIMEOUT_S = 20.0
#: Checks the prolog skips: they look at the job's network, which a prolog does not have yet.
PROLOG_SKIP = "network,master_port,versions"
#: Seconds between slurmd's HealthCheckProgram runs (its smallest useful setting).
HEALTH_CHECK_INTERVAL_S = 2
#: The node without a slurmd (see write_conf).
GHOST = "ghost1"


def which(name: str) -> str | None:
    """``name`` on PATH or in the sbin directories (a user's PATH may lack them)."""
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")


def missing_requirements() -> str | None:
    """Why this machine cannot run a real Slurm, or None."""
    if os.geteuid() != 0:
        return "a real slurmctld/slurmd/munged needs root (CI runs as root)"
    missing = [d for d in DAEMONS if which(d) is None]
    if missing:
        return (f"{', '.join(missing)} not installed (scripts/test.sh installs slurmctld slurmd "
                "slurm-client munge)")
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening_ports() -> set[int]:
    """TCP ports in LISTEN state on this host (IPv4 and IPv6), from the kernel's tables."""
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":  # 0A: TCP_LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def processes_with_env(marker: bytes) -> list[int]:
    """PIDs whose environment holds ``marker`` (every daemon, slurmstepd and job we started)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:  # exited meanwhile, or a kernel thread
            continue
        if marker in env.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"({path}: {exc})"
    return "\n".join(text[-lines:])


def parse_fields(text: str) -> dict[str, str]:
    """``Key=Value`` pairs of ``scontrol show node|job`` output (values may hold spaces only in
    Reason=, which scontrol prints last on its line)."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("Reason="):
            out["Reason"] = line[len("Reason="):]
            continue
        for key, value in re.findall(r"(\w+)=(\S*)", line):
            out.setdefault(key, value)
    return out


@dataclass
class SlurmCluster:
    """The running one-node cluster: where its files are and how to ask it things."""

    root: Path
    conf: Path
    node: str
    nvml_fixture: Path
    ports: tuple[int, int]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """A clean environment for Slurm clients: no job variables of the caller leak in."""
        keep = {k: v for k, v in os.environ.items()
                if not k.startswith(("SLURM_", "NCCL_", "PREFLIGHT_", "CUDA_"))}
        return {**keep, "SLURM_CONF": str(self.conf)}

    def logs(self) -> str:
        """The daemons' and the hooks' last log lines, for a failing assertion's message;
        ``*.out`` (stderr before a daemon opens its log: fatal config errors) when not empty."""
        files = [self.root / f"{n}.log" for n in ("slurmctld", "slurmd", *HOOKS)]
        files += [self.root / f"{n}.err" for n in HOOKS]
        files += [f for f in sorted(self.root.glob("*.out"))
                  if f.stat().st_size and not f.name.startswith("job-")]
        return "\n".join(f"--- {f.name} (last lines) ---\n{tail(f)}" for f in files)

    def run(self, *argv: str, check: bool = True) -> str:
        """A Slurm client command; a failure is an AssertionError with the daemons' logs."""
        proc = subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=CLIENT_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"{shlex.join(argv)} exit {proc.returncode}: "
                                 f"{proc.stderr.strip()}\n{self.logs()}")
        return proc.stdout

    def show_node(self) -> dict[str, str]:
        return parse_fields(self.run("scontrol", "show", "node", self.node))

    def show_job(self, job_id: str) -> dict[str, str]:
        return parse_fields(self.run("scontrol", "show", "job", job_id))

    def sbatch(self, *argv: str) -> str:
        out = self.run("sbatch", "--parsable", f"--chdir={self.root}",
                       f"--output={self.root}/job-%j.out", *argv)
        return out.strip().split(";")[0]

    def wait_for(self, what: str, probe: Callable[[], T], done: Callable[[T], bool], *,
                 timeout_s: float = WAIT_TIMEOUT_S) -> T:
        """Poll ``probe`` until ``done(value)``; on the deadline fail with the value and logs."""
        deadline = time.monotonic() + timeout_s
        value = probe()
        while not done(value):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}; "
                                     f"last seen: {value!r}\n{self.logs()}")
            time.sleep(0.2)
            value = probe()
        return value

    def prolog_runs(self, hook: str = "prolog") -> dict[str, tuple[int, float]]:
        """``{job id: (exit code, seconds)}`` of a hook's runs, from its wrapper's log."""
        return {job: (rc, took) for job, rc, took in self.hook_runs(hook)}

    def hook_runs(self, hook: str) -> list[tuple[str, int, float]]:
        """Every run of a hook: (job id, exit code, seconds), oldest first."""
        pattern = r"job (\S*) node \S* exit (\d+) start ([\d.]+) end ([\d.]+)"
        return [(job, int(rc), float(t1) - float(t0)) for job, rc, t0, t1 in
                re.findall(pattern, tail(self.root / f"{hook}.log", 10000))]

    def hook_stderr(self, hook: str) -> str:
        """Everything the hook wrote to stderr so far (its wrapper keeps a copy)."""
        path = self.root / f"{hook}.err"
        return path.read_text() if path.exists() else ""

    def set_hook_args(self, hook: str, *args: str) -> None:
        """Extra options for the hook's next runs (none: remove them)."""
        path = self.root / f"{hook}.args"
        if args:
            path.write_text("".join(f"{a}\n" for a in args))
        else:
            path.unlink(missing_ok=True)

    def set_hooks_env(self, **env: str) -> None:
        """``PREFLIGHT_*`` settings for every hook's next runs (none: remove them)."""
        path = self.root / "hooks.env"
        if env:
            path.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
        else:
            path.unlink(missing_ok=True)

    def health_checks(self, on: bool) -> None:
        """Let slurmd's periodic HealthCheckProgram run ``preflight prolog --resume`` (or not)."""
        flag = self.root / "healthcheck.on"
        if on:
            flag.touch()
        else:
            flag.unlink(missing_ok=True)

    def reasons(self) -> list[str]:
        """``sinfo -R`` for this node: ``reason|state`` lines (empty: no reason)."""
        out = self.run("sinfo", "--list-reasons", "--noheader", f"--nodes={self.node}",
                       "--format=%E|%T")
        return out.splitlines()

    def node_state(self) -> str:
        return self.show_node().get("State", "")

    def wait_idle(self, timeout_s: float = WAIT_TIMEOUT_S) -> None:
        # State=IDLE exactly: IDLE+DRAIN or IDLE+NOT_RESPONDING are not ready.
        self.wait_for(f"node {self.node} IDLE", self.node_state, lambda s: s == "IDLE",
                      timeout_s=timeout_s)


def write_conf(root: Path, node: str, ports: tuple[int, int], hooks: dict[str, Path]) -> Path:
    """slurm.conf + cgroup.conf for one node on 127.0.0.1; nothing outside ``root``."""
    conf = root / "slurm.conf"
    lines = [
        "ClusterName=preflighttest",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root / 'munge' / 'munge.sock'}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'slurmd.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # No cgroups: the test machine (a container or a VM without systemd) need not have them.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "MailProg=/bin/true",
        f"Prolog={hooks['prolog']}",
        f"Epilog={hooks['epilog']}",
        f"HealthCheckProgram={hooks['healthcheck']}",
        f"HealthCheckInterval={HEALTH_CHECK_INTERVAL_S}",
        # 22.05 waits forever for a prolog by default (ecosystem.md section 1); a hung prolog
        # must drain the node, not hang the test.
        "PrologEpilogTimeout=30",
        # A node that was DOWN (not DRAINed) comes back when its slurmd registers.
        "ReturnToService=2",
        "InactiveLimit=0",
        "KillWait=5",
        "MinJobAge=300",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} RealMemory=500 "
        "State=UNKNOWN",
        # A second node that never starts a slurmd, in a partition of its own (no job goes
        # there): the fleet guard's test drains it "by preflight" to have a fleet to count.
        f"NodeName={GHOST} NodeAddr=127.0.0.2 CPUs=1 RealMemory=100 State=UNKNOWN",
        f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP",
        f"PartitionName=spare Nodes={GHOST} Default=NO MaxTime=INFINITE State=UP",
    ]
    conf.write_text("\n".join(lines) + "\n")
    (root / "cgroup.conf").write_text("CgroupPlugin=autodetect\nIgnoreSystemd=yes\n")
    return conf


#: Hooks installed in slurm.conf: name -> the preflight subcommand it runs.
HOOKS = {"prolog": ["prolog", "--skip", PROLOG_SKIP], "epilog": ["epilog"],
         "healthcheck": ["prolog", "--resume", "--skip", PROLOG_SKIP]}


def write_hook(root: Path, name: str, fixture: Path) -> Path:
    """A hook script as a site writes one: sets the PATH and environment slurmd does not give,
    then runs preflight. ``<name>.args`` (one argument per line, if present) adds options, so a
    test can switch ``--report-only`` on; ``<name>.log`` records each run's exit and times and
    ``<name>.err`` its stderr (which also goes to slurmd, as a site's wrapper would pass it). The
    health check runs only while ``healthcheck.on`` exists (slurmd starts it every
    HealthCheckInterval, whatever the test)."""
    scontrol = which("scontrol") or "/usr/bin/scontrol"
    sinfo = which("sinfo") or "/usr/bin/sinfo"
    conf = root / "slurm.conf"
    argv = [sys.executable, "-m", "preflight", *HOOKS[name], "--scontrol", scontrol,
            "--sinfo", sinfo, "--prom-file", str(root / f"{name}.prom")]
    q = {k: shlex.quote(str(v)) for k, v in {
        "log": root / f"{name}.log", "err": root / f"{name}.err", "args": root / f"{name}.args",
        "out": root / f"{name}.stderr", "on": root / "healthcheck.on",
        "env": root / "hooks.env"}.items()}
    gate = f"[ -f {q['on']} ] || exit 0\n" if name == "healthcheck" else ""
    script = root / f"{name}.sh"
    script.write_text(
        "#!/bin/sh\n"
        "# slurmd runs its hooks as root with no PATH; it discards stdout and logs stderr\n"
        "# on failure (\"prolog failed: rc:1 output:...\").\n"
        f"{gate}"
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        f"export PYTHONPATH={shlex.quote(str(REPO))}\n"
        f"export SLURM_CONF={shlex.quote(str(conf))}\n"
        f"export PREFLIGHT_NVML_FIXTURE={shlex.quote(str(fixture))}\n"
        f"export PREFLIGHT_STATE_DIR={shlex.quote(str(root / 'preflight-state'))}\n"
        f"if [ -f {q['env']} ]; then . {q['env']}; fi\n"
        "set --\n"
        f"if [ -f {q['args']} ]; then while IFS= read -r a; do set -- \"$@\" \"$a\"; done "
        f"< {q['args']}; fi\n"
        "start=$(date +%s.%N)\n"
        f"{shlex.join(argv)} \"$@\" 2> {q['out']}\n"
        "rc=$?\n"
        f"cat {q['out']} >&2; cat {q['out']} >> {q['err']}\n"
        f'echo "job $SLURM_JOB_ID node $SLURMD_NODENAME exit $rc start $start end '
        f'$(date +%s.%N)" >> {q["log"]}\n'
        "exit $rc\n")
    script.chmod(0o755)
    return script


def start(name: str, argv: Sequence[str], root: Path, env: dict[str, str]
          ) -> subprocess.Popen[bytes]:
    out = (root / f"{name}.out").open("wb")
    try:
        # Own session: a signal to pytest's process group does not reach the daemons, and
        # teardown signals exactly what it started.
        return subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        out.close()


def stop(procs: dict[str, subprocess.Popen[bytes]]) -> list[str]:
    """SIGTERM each daemon (slurmd first, munged last), wait, SIGKILL the stubborn; what was
    killed is returned for the teardown message."""
    killed = []
    for name in ("slurmd", "slurmctld", "munged"):
        proc = procs.get(name)
        if proc is None or proc.poll() is not None:
            continue
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)
            killed.append(name)
    return killed


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """munged + slurmctld + slurmd on 127.0.0.1, up until the node is IDLE; torn down after."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("slurm")
    root.chmod(0o755)  # munged wants its socket's directories searchable by everyone
    for sub in ("state", "spool", "munge"):
        (root / sub).mkdir(mode=0o755)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(128))  # 1024-bit key, what mungekey makes by default
    key.chmod(0o600)

    node = socket.gethostname().split(".")[0]
    ports = (free_port(), free_port())
    fixture = root / "nvml.json"
    conf = write_conf(root, node, ports, {h: write_hook(root, h, fixture) for h in HOOKS})
    cluster = SlurmCluster(root=root, conf=conf, node=node, nvml_fixture=fixture, ports=ports)
    env = cluster.env
    munge_dir = root / "munge"
    try:
        cluster.procs["munged"] = start("munged", [
            str(which("munged")), "--foreground", "--force", f"--key-file={key}",
            f"--socket={munge_dir / 'munge.sock'}", f"--pid-file={munge_dir / 'munged.pid'}",
            f"--seed-file={munge_dir / 'munged.seed'}", f"--log-file={root / 'munged.log'}"],
            root, env)
        cluster.wait_for("munged socket", (munge_dir / "munge.sock").exists, bool,
                         timeout_s=10)
        cluster.procs["slurmctld"] = start("slurmctld", [str(which("slurmctld")), "-D"], root,
                                           env)
        cluster.procs["slurmd"] = start("slurmd", [str(which("slurmd")), "-D", "-N", node], root,
                                        env)
        cluster.wait_idle()
        yield cluster
    finally:
        # Jobs first (a requeued-held job must not start on the next cluster), then daemons.
        if cluster.procs.get("slurmctld") and cluster.procs["slurmctld"].poll() is None:
            cluster.run("scancel", "--partition=debug", check=False)
        killed = stop(cluster.procs)
        # Every process we started (and its children: slurmstepd, job shells) carries our
        # SLURM_CONF. A slurmstepd may take a moment to exit after slurmd; after 5 s, what is
        # left is killed, by pid, and the teardown fails.
        marker = f"SLURM_CONF={conf}".encode()
        deadline = time.monotonic() + 5.0
        while (left := processes_with_env(marker)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        bound = listening_ports() & set(ports)
        assert not killed, f"{killed} ignored SIGTERM for {STOP_TIMEOUT_S} s\n{cluster.logs()}"
        assert not left, f"processes left after teardown: {left}"
        assert not bound, f"ports still listening after teardown: {sorted(bound)}"
