"""Fuzzing what the node hands preflight besides the command line: the daemon's check child
(its report and its output streams), the ``/proc`` texts the holder scan parses, the files of a
``--root`` tree, and the exposition text the textfile writer filters. In process where the code
is pure, real processes and files where it reads them.

Asserted: nothing raises but the documented error, nothing printed carries a control character,
every check of a hostile tree answers within its deadline. ``PREFLIGHT_FUZZ_PROFILE`` scales the
examples as for the CLI fuzzer (docs/fuzzing.md).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preflight.checks import CHECKS
from preflight.core.config import Config
from preflight.core.context import Context
from preflight.core.result import Report, Status
from preflight.core.runner import run_checks
from preflight.daemon import ChildRunner, RunKind
from preflight.daemon.child import ReportInvalid, parse_report
from preflight.outputs.prom import MetricsSnapshot, render
from preflight.outputs.textfile import essential_lines
from preflight.probes.gpu import FixtureGpuProbe
from preflight.probes.holders import (
    command_text,
    job_of_cgroup,
    job_of_cgroups,
    parse_cgroup,
    parse_maps,
    parse_passwd,
    parse_stat,
)
from preflight.probes.net import LiveNetProbe
from tests import topologies
from tests.fuzz.test_cli_fuzz import SCALE

RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")

_json: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=4),
    max_leaves=12)


def _valid_report() -> dict[str, Any]:
    return {"schema_version": 1, "mode": "check", "host": "node-a", "timestamp_s": 1.0,
            "version": "0", "status": "pass",
            "results": [{"check": "shm", "status": "pass", "scope": "node", "reason": "ShmOk",
                         "message": "ok", "remedy": "", "details": {"size_bytes": 1},
                         "duration_s": 0.0},
                        {"check": "gpu_speed", "status": "pass", "scope": "node",
                         "reason": "GpuSpeedOk", "message": "ok", "remedy": "",
                         "details": {"gpu_speed": {"gpus": [{"index": 0, "figures": {}}]}},
                         "duration_s": 0.0}],
            "fingerprint": {"sha256": "ab", "packages": {"torch": "2.4.0"}, "meta": {}},
            "bandwidth": {"busbw_gbps": 1.0}}


_PATHS = [("fingerprint",), ("bandwidth",), ("host",), ("timestamp_s",), ("results",),
          ("fingerprint", "packages"), ("fingerprint", "meta"), ("fingerprint", "sha256"),
          ("results", 0), ("results", 0, "details"), ("results", 0, "details", "size_bytes"),
          ("results", 0, "status"), ("results", 0, "reason"), ("results", 0, "duration_s"),
          ("results", 1, "details", "gpu_speed"), ("results", 1, "details", "gpu_speed", "gpus"),
          ("bandwidth", "busbw_gbps")]


@st.composite
def mutated_reports(draw: st.DrawFn) -> dict[str, Any]:
    """A valid report with up to three fields replaced by any JSON value."""
    data = _valid_report()
    for path in draw(st.lists(st.sampled_from(_PATHS), max_size=3)):
        node: Any = data
        try:
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = draw(_json)
        except (KeyError, IndexError, TypeError):
            continue
    return data


@settings(max_examples=300 * SCALE, deadline=None)
@given(st.one_of(mutated_reports().map(lambda d: json.dumps(d).encode()),
                 _json.map(lambda d: json.dumps(d).encode()), st.binary(max_size=200)))
def test_a_child_report_is_served_or_refused_never_a_broken_endpoint(raw: bytes) -> None:
    try:
        report = parse_report(raw, known_checks=["shm", "gpu_speed"])
    except ReportInvalid as exc:
        assert not RAW_CONTROL.search(str(exc)), exc
        return
    # What /report and /metrics do with it, many times over.
    json.dumps(report.to_json())
    render(MetricsSnapshot(report, ["shm", "gpu_speed"]))


@settings(max_examples=300 * SCALE, deadline=None)
@given(st.binary(max_size=400), st.text(max_size=200))
def test_proc_parsers_take_any_bytes(data: bytes, text: str) -> None:
    parse_maps(data)
    parse_stat(data)
    parse_passwd(data)
    cgroup, job = job_of_cgroups(parse_cgroup(data))
    for shown in (command_text(data, data), job_of_cgroup(text) or "", job or ""):
        assert not RAW_CONTROL.search(shown), shown
    assert isinstance(cgroup, str)


@settings(max_examples=200 * SCALE, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=60), st.sampled_from([
    b"# HELP preflight_node_healthy x", b"# TYPE preflight_node_healthy gauge",
    b"preflight_node_healthy 1", b'preflight_node_healthy{a="b"} 1', b"#", b"# HELP",
    b"preflight_node_healthy_other 2"])), max_size=12))
def test_essential_lines_keep_only_whole_lines_of_the_named_families(lines: list[bytes]) -> None:
    text = b"\n".join(lines) + b"\n"
    kept = essential_lines(text)
    assert set(kept.splitlines()) <= set(text.splitlines())
    assert all(b"preflight_node_healthy" in line for line in kept.splitlines())


_KINDS = ("text", "bytes", "fifo", "sparse", "dir", "loop", "missing")


def _plant(path: Path, kind: str, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "text":
        path.write_bytes(data[:64])
    elif kind == "bytes":
        path.write_bytes(data)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "sparse":
        with path.open("wb") as f:
            f.truncate(1 << 30)
    elif kind == "dir":
        path.mkdir()
    elif kind == "loop":
        os.symlink(path.name, path)


_ATTRS = ["state", "phys_state", "rate", "link_layer", "counters/symbol_error",
          "counters/link_downed", "gids/0", "gid_attrs/types/0"]


@settings(max_examples=8 * SCALE, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_ATTRS), st.sampled_from(_KINDS),
                          st.binary(max_size=80)), max_size=8),
       st.sampled_from(_KINDS), st.sampled_from(_KINDS), st.binary(max_size=120))
def test_a_hostile_root_tree_is_judged_within_the_deadline(
        tmp_path_factory: Any, attrs: list[tuple[str, str, bytes]], kmsg: str, uptime: str,
        data: bytes) -> None:
    root = tmp_path_factory.mktemp("root")
    port = root / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    for name, kind, payload in attrs:
        target = port / name
        if not target.exists() and not target.is_symlink():
            _plant(target, kind, payload)
    _plant(root / "dev" / "kmsg", kmsg, data)
    _plant(root / "proc" / "uptime", uptime, data)
    (root / "dev" / "shm").mkdir(parents=True, exist_ok=True)
    checks = [c for c in CHECKS if c.name in ("fabric", "xid", "memlock", "nccl_env", "shm")]
    ctx = Context(config=Config(check_timeout_s=5, expect_gpus=0), env={}, root=root,
                  gpu_probe=FixtureGpuProbe(topologies.healthy_8x_h100()),
                  net_probe=LiveNetProbe())
    started = time.monotonic()
    report = run_checks(ctx, checks)
    assert time.monotonic() - started < 20
    for r in report.results:
        assert r.reason not in ("CheckTimeout", "CheckCrashed"), (r.reason, r.message)
        json.dumps(r.to_json())


_CHILD = ("import sys\nsys.stdin.read()\nsys.stdout.buffer.write(bytes.fromhex(sys.argv[1]))\n"
          "sys.stderr.buffer.write(bytes.fromhex(sys.argv[2]))\nsys.exit(int(sys.argv[3]))\n")


@settings(max_examples=4 * SCALE, deadline=None)
@given(st.one_of(st.binary(max_size=300), mutated_reports().map(lambda d: json.dumps(d).encode())),
       st.binary(max_size=300), st.integers(0, 3))
def test_any_child_output_gives_a_report_with_printable_messages(out: bytes, err: bytes,
                                                                 code: int) -> None:
    runner = ChildRunner(argv_for=lambda kind, config: [sys.executable, "-c", _CHILD, out.hex(),
                                                        err.hex(), str(code)],
                         env=dict(os.environ), drain_s=1.0)
    report = runner(RunKind.NODE, Config(check_timeout_s=5), ["shm"])
    assert isinstance(report, Report)
    for r in report.results:
        if r.status is Status.ERROR:
            assert r.reason == "RunFailed"
            assert not RAW_CONTROL.search(r.message), r.message
