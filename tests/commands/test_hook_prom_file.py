"""``preflight prolog|epilog --prom-file`` follows ``check --prom-file``'s rules (they share
``preflight.outputs.textfile``): a device or a FIFO at the path is refused and left as it is, a
full disk leaves the error gauge and the verdict series instead of an older verdict, and the exit
code never depends on the file. The fake scontrol/sinfo stand in for Slurm."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from preflight.outputs.textfile import ERROR_METRIC
from tests import topologies
from tests.commands.test_prolog import NODE, SKIP, assert_promtool_ok
from tests.helpers import REPO, run_cli, write_fixture
from tests.slurmfakes import FakeSlurm, fake_slurm

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
needs_unshare = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                   reason="needs root and unshare for a private tmpfs mount")


@pytest.fixture
def cluster(tmp_path: Path) -> FakeSlurm:
    return fake_slurm(tmp_path / "slurm", {f"gpu{i:03d}": ("IDLE", "") for i in range(10, 20)})


def _env(tmp_path: Path) -> dict[str, str]:
    return {"SLURMD_NODENAME": NODE, "PREFLIGHT_STATE_DIR": str(tmp_path / "state"),
            "PREFLIGHT_PROLOG_BUDGET_S": "30"}


def _hook(tmp_path: Path, slurm: FakeSlurm, hook: str, prom: Path
          ) -> subprocess.CompletedProcess[str]:
    fixture = write_fixture(tmp_path / "nvml.json", topologies.lost_gpu(3))
    extra = ["--skip", SKIP] if hook == "prolog" else []
    proc = run_cli([hook, *slurm.args(), *extra, "--report-only", "--prom-file", str(prom)],
                   fixture=fixture, env=_env(tmp_path))
    assert "Traceback" not in proc.stderr
    return proc


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_a_fifo_is_refused_without_blocking(tmp_path: Path, cluster: FakeSlurm,
                                            hook: str) -> None:
    fifo = tmp_path / f"{hook}.prom"
    os.mkfifo(fifo)  # nobody reads it: opening it for writing would block until the timeout
    proc = _hook(tmp_path, cluster, hook, fifo)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert f"cannot write the metrics to --prom-file {fifo}" in proc.stderr
    assert "is a FIFO" in proc.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@needs_root
def test_a_character_device_is_refused_and_stays_a_device(tmp_path: Path,
                                                           cluster: FakeSlurm) -> None:
    dev = tmp_path / "null"
    subprocess.run(["mknod", str(dev), "c", "1", "3"], check=True)
    proc = _hook(tmp_path, cluster, "prolog", dev)
    assert proc.returncode == 0, proc.stderr  # --report-only: the exit is 0 even for GpuLost
    assert "report-only: would drain gpu017" in proc.stderr
    st = os.lstat(dev)
    assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
    assert "is a device" in proc.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_full_write_carries_the_error_gauge_labelled_by_hook(tmp_path: Path,
                                                               cluster: FakeSlurm) -> None:
    prolog, epilog = tmp_path / "prolog.prom", tmp_path / "epilog.prom"
    assert _hook(tmp_path, cluster, "prolog", prolog).returncode == 0
    assert _hook(tmp_path, cluster, "epilog", epilog).returncode == 0
    assert f'{ERROR_METRIC}{{hook="prolog"}} 0' in prolog.read_text()
    assert f'{ERROR_METRIC}{{hook="epilog"}} 0' in epilog.read_text()
    assert_promtool_ok(prolog)
    assert_promtool_ok(epilog)
    # One textfile directory holds both: node_exporter refuses a series found in two files, or
    # a family whose HELP differs between them.
    series: list[set[tuple[str, frozenset[tuple[str, str]]]]] = []
    helps: list[dict[str, str]] = []
    for path in (prolog, epilog):
        families = list(text_string_to_metric_families(path.read_text()))
        series.append({(s.name, frozenset(s.labels.items())) for f in families for s in f.samples})
        helps.append({f.name: f.documentation for f in families})
    assert not series[0] & series[1]
    assert all(helps[0][name] == helps[1][name] for name in helps[0].keys() & helps[1].keys())
    assert ERROR_METRIC in helps[0].keys() & helps[1].keys()


@needs_unshare
def test_a_full_disk_leaves_the_error_gauge_not_an_older_verdict(tmp_path: Path,
                                                                  cluster: FakeSlurm) -> None:
    """The prolog on a 64 KiB tmpfs filled to the last block (a private mount namespace), over
    a stale file that said the node was fine."""
    full, after = tmp_path / "full", tmp_path / "after"
    full.mkdir()
    prom = full / "prolog.prom"
    fixture = write_fixture(tmp_path / "nvml.json", topologies.lost_gpu(3))
    stale = "# stale\npreflight_node_healthy 1\n" * 300
    script = (f'mount -t tmpfs -o size=64k tmpfs {full} && printf %s "$STALE" > {prom} && '
              f"(head -c 1048576 /dev/zero > {full}/ballast 2>/dev/null; true) && "
              f'"$@" 2> {tmp_path}/err.txt; echo $? > {tmp_path}/rc; cp -a {full} {after}')
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PREFLIGHT_", "SLURM"))},
           **_env(tmp_path), "PYTHONPATH": str(REPO), "PREFLIGHT_NVML_FIXTURE": str(fixture),
           "STALE": stale}
    subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
                    sys.executable, "-m", "preflight", "prolog", *cluster.args(), "--skip", SKIP,
                    "--report-only", "--prom-file", str(prom)],
                   check=True, timeout=60, env=env)
    err = (tmp_path / "err.txt").read_text()
    assert (tmp_path / "rc").read_text().strip() == "0", err
    assert "No space left on device" in err and "Traceback" not in err
    text = (after / "prolog.prom").read_text()
    assert "stale" not in text  # the old PASS is not served any more
    assert f'{ERROR_METRIC}{{hook="prolog"}} 1' in text
    assert "preflight_node_healthy 0.0" in text
    assert 'preflight_slurm_would_drain{hook="prolog"} 1.0' in text
    assert sorted(p.name for p in after.iterdir()) == ["ballast", "prolog.prom"]
