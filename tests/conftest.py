from __future__ import annotations

import stat
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from preflight.core.config import Config
from preflight.core.context import Context
from preflight.probes.gpu import FixtureGpuProbe, GpuSnapshot
from preflight.probes.net import LiveNetProbe, NetProbe
from tests import topologies

# Fixtures of the real-venv helpers, for the versions tests in checks/, commands/ and probes/.
from tests.venvs import make_venv, node_python, nvml_fixture  # noqa: F401

MakeCtx = Callable[..., Context]


@pytest.fixture
def make_ctx(tmp_path: Path) -> MakeCtx:
    """Build a Context: fixture GPUs (default 8x H100), an explicit env, a config; the live
    network unless ``net`` gives a fixture probe."""

    def make(*, env: Mapping[str, str] | None = None, snapshot: GpuSnapshot | None = None,
             config: Config | None = None, root: Path | str = "/", net: NetProbe | None = None,
             **config_changes: object) -> Context:
        cfg = config or Config()
        if config_changes:
            cfg = cfg.replace(**config_changes)
        return Context(config=cfg, env=dict(env or {}), root=Path(root),
                       gpu_probe=FixtureGpuProbe(snapshot or topologies.healthy_8x_h100()),
                       net_probe=net or LiveNetProbe())

    return make


#: The end-to-end suites: real bandwidth and speed workers, torch, network namespaces, a real Slurm,
#: the image build, the Helm engine, multi-node agents, the daemon process, the hostile-input and
#: CLI fuzzing runs. Marked slow here, so `bash scripts/test.sh --fast` (pytest -m "not slow")
#: leaves them out of the edit loop; CI runs them.
SLOW_SUITES = ("tests/bench/", "tests/net/", "tests/slurm/", "tests/image/", "tests/fuzz/",
               "tests/hardening/", "tests/k8s/", "tests/cluster/test_netns.py",
               "tests/cluster/test_bad_input.py", "tests/serve/test_serve_process.py",
               "tests/gpuspeed/test_workers.py", "tests/explain/test_real_torch.py",
               "tests/ddp/test_runs.py", "tests/ddp/test_command.py",
               "tests/ddp/test_world.py")
_REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        rel = Path(item.fspath).resolve().relative_to(_REPO).as_posix()
        if rel.startswith(SLOW_SUITES):
            item.add_marker(pytest.mark.slow)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite the golden files under tests/golden/ from the current output")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture
def scontrol(tmp_path: Path) -> tuple[Path, Path]:
    """A recording stand-in for scontrol: (its path, the file its argv goes to, one per line,
    each call ended by ``---``)."""
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "scontrol"
    fake.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done >> {calls}\n'
                    f'echo --- >> {calls}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake, calls
