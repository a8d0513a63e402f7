"""Fuzzing the real CLI (issue #11 point 8): hypothesis draws arguments for every subcommand and
values for every ``PREFLIGHT_*`` variable, runs ``python -m preflight`` in a subprocess, and
asserts what a user relies on: no traceback, an exit code from the documented set, an answer
within a deadline, and bounded memory (the children's peak RSS).

Profiles (``PREFLIGHT_FUZZ_PROFILE``): ``ci`` (default) keeps the whole file well under a minute
on 2 cores; ``thorough`` draws ten times more, ``long`` fifty (run them with ``-o timeout=0``:
one test takes longer than pytest-timeout's per-test limit). Figures: docs/fuzzing.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preflight.core.config import Config, ConfigError, load_file
from tests import topologies
from tests.helpers import PEAK_RSS_LAUNCHER, REPO

PROFILE = os.environ.get("PREFLIGHT_FUZZ_PROFILE", "ci")
SCALE = {"ci": 1, "thorough": 10, "long": 50}[PROFILE]
#: A run that takes longer than this is a hang for the fuzzer (checks have 10 s deadlines).
RUN_DEADLINE_S = 45.0
#: Peak RSS any one child may reach (a check run takes ~60 MB; the alias bomb took 1 GB).
MAX_RSS_BYTES = 400 << 20
#: Exit codes each command documents (its --help epilog).
EXITS = {"check": {0, 1, 2, 3}, "prolog": {0, 1}, "fingerprint": {0, 1, 2, 3},
         "diff": {0, 1, 2}, "explain": {0, 1, 2}, "bench": {0, 1, 2, 3}, "serve": {0, 2}}

FIXTURE_DIR = Path(os.environ.get("TMPDIR", "/tmp")) / f"preflight-fuzz-{os.getpid()}"

# ---------------------------------------------------------------------------------- strategies

_chars = st.characters(codec="utf-8", exclude_characters="\x00")
_text = st.text(_chars, max_size=40)
#: Values that broke something once, or sit on an edge.
_nasty = st.sampled_from([
    "inf", "-inf", "nan", "1e300", "-1", "0", "1", "8", "99999", "9" * 5000, "0x10", "1_000",
    "", " ", "\t", "\x1b[2J\n", "a..b", "/dev/zero", "/dev/null", "/proc/self/mem", "..",
    "%s%n", "${HOME}", "true", "off", "none", "null", "127.0.0.1:99999", "[::1]:0", ",,,",
    "é" * 60, "\u202e", "1" * 41,
])
_value = st.one_of(_nasty, _text, st.integers(-2**70, 2**70).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr))


def _opts(spec: Mapping[str, st.SearchStrategy[str] | None]) -> st.SearchStrategy[list[str]]:
    """A subset of ``spec``'s options, each with a drawn value (None: a flag)."""
    names = sorted(spec)

    @st.composite
    def draw(d: st.DrawFn) -> list[str]:
        out: list[str] = []
        for name in d(st.lists(st.sampled_from(names), max_size=4, unique=True)):
            value = spec[name]
            out += [name] if value is None else [name, d(value)]
        return out
    return draw()


_common = {"--config": _value, "--root": _value, "--log-level": _value}
SPECS: dict[str, dict[str, st.SearchStrategy[str] | None]] = {
    "check": {**_common, "--only": _value, "--skip": _value, "--expect-gpus": _value,
              "--timeout": _value, "--min-busbw": _value, "--golden": _value, "--json": None,
              "--strict": None, "--no-bandwidth": None, "--multi-node": None},
    "prolog": {**_common, "--expect-gpus": _value, "--golden": _value, "--skip": _value,
               "--fail-closed": None},
    "fingerprint": {"--json": None, "--log-level": _value},
    "bench": {**_common, "--nproc": _value, "--min-bytes": _value, "--max-bytes": _value,
              "--timeout": _value, "--min-busbw": _value, "--backend": _value, "--json": None},
    "serve": {**_common, "--interval": _value, "--bandwidth-interval": _value,
              "--listen": st.one_of(st.sampled_from(["127.0.0.1:0", "[::1]:0", "x:99999", ":",
                                                     "127.0.0.1:abc", "127.0.0.1"]), _text)},
}
CONFIG_KEYS = [f.upper() for f in Config.__dataclass_fields__]
_env = st.dictionaries(st.sampled_from([*(f"PREFLIGHT_{k}" for k in CONFIG_KEYS),
                                        "PREFLIGHT_LOG_LEVEL", "PREFLIGHT_CONFIG",
                                        "PREFLIGHT_NVML_FIXTURE", "PREFLIGHT_NO_SUCH_KEY",
                                        "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT",
                                        "WORLD_SIZE", "RANK", "NCCL_SOCKET_IFNAME"]),
                       _value, max_size=4)


# ---------------------------------------------------------------------------------- running

@pytest.fixture(autouse=True, scope="module")
def _remove_fixture_dir() -> Iterator[None]:
    """The fixtures (NVML snapshot, recording scontrol, drawn files) go when the module ends."""
    yield
    shutil.rmtree(FIXTURE_DIR, ignore_errors=True)


def _fixtures() -> tuple[Path, Path]:
    FIXTURE_DIR.mkdir(exist_ok=True)
    nvml = FIXTURE_DIR / "nvml.json"
    if not nvml.exists():
        nvml.write_text(json.dumps(topologies.healthy_8x_h100().to_json()))
    scontrol = FIXTURE_DIR / "scontrol"
    if not scontrol.exists():
        scontrol.write_text(f"#!/bin/sh\necho \"$@\" >> {FIXTURE_DIR}/drains\n")
        scontrol.chmod(scontrol.stat().st_mode | stat.S_IXUSR)
    return nvml, scontrol


def _clean_env(extra: Mapping[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("NCCL_", "TORCH_", "SLURM_", "PREFLIGHT_", "CUDA_", "GLOO_"))
            and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                          "MASTER_PORT")}
    nvml, _ = _fixtures()
    # The harness SIGKILLs each command's process group at the end (a daemon's bandwidth child
    # may be mid-run): what such a child leaves in TMPDIR goes with the fixture directory.
    tmp = FIXTURE_DIR / "tmp"
    tmp.mkdir(exist_ok=True)
    base.update({"PYTHONPATH": str(REPO), "PREFLIGHT_NVML_FIXTURE": str(nvml),
                 "SLURMD_NODENAME": "fuzz-node", "TMPDIR": str(tmp)})
    base.update(extra)
    return base




def _reap(proc: subprocess.Popen[bytes], deadline_s: float) -> int | None:
    """The exit code of ``proc``, or None when it is still running at the deadline."""
    try:
        return proc.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        return None


def _run(command: str, argv: Sequence[str], env: Mapping[str, str], *,
         stdin: bytes = b"") -> None:
    """Run the real CLI once and assert the contract."""
    full = [sys.executable, "-m", "preflight", command, *argv]
    started = time.monotonic()
    FIXTURE_DIR.mkdir(exist_ok=True)
    rss_file = FIXTURE_DIR / f"rss-{time.monotonic_ns()}"
    proc = subprocess.Popen([sys.executable, "-c", PEAK_RSS_LAUNCHER, str(rss_file), *full],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=_clean_env(env), start_new_session=True)
    assert proc.stdin is not None and proc.stderr is not None
    err = bytearray()
    reader = threading.Thread(target=lambda: err.extend(proc.stderr.read()),  # type: ignore[union-attr]
                              daemon=True)
    reader.start()
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.write(stdin)
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.close()
    try:
        if command == "serve":
            # A daemon that started runs until told to stop: give it 2.5 s, then SIGTERM.
            done = _reap(proc, 2.5)
            if done is None:
                proc.send_signal(signal.SIGTERM)
                done = _reap(proc, 10)
        else:
            done = _reap(proc, RUN_DEADLINE_S)
        if done is None:
            raise AssertionError(f"hang: {full!r} env={dict(env)!r} ran past "
                                 f"{RUN_DEADLINE_S} s")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # nothing it started may stay
        if proc.returncode is None:
            proc.wait()
    reader.join(timeout=10)
    returncode = done
    rss = int(rss_file.read_text())
    took = time.monotonic() - started
    text = err.decode(errors="replace")
    where = f"{full[3:]!r} env={dict(env)!r}"
    assert "Traceback (most recent call last)" not in text, f"{where}\n{text[-3000:]}"
    assert returncode in EXITS[command], f"{where}: exit {returncode}\n{text[-2000:]}"
    assert took < RUN_DEADLINE_S
    assert rss < MAX_RSS_BYTES, f"{where}: the command reached {rss >> 20} MiB"


_settings = settings(max_examples=4 * SCALE, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.too_slow,
                                            HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("command", ["check", "prolog", "fingerprint", "bench"])
@_settings
@given(args=st.data(), env=_env)
def test_every_subcommand_keeps_its_contract(command: str, args: st.DataObject,
                                             env: dict[str, str]) -> None:
    argv = args.draw(_opts(SPECS[command]))
    if command == "prolog":
        argv += ["--scontrol", str(_fixtures()[1])]  # never the real scontrol
    if command == "bench":
        argv += ["--python", "/nonexistent/python"]  # argument handling only: no torch workers
    if command == "check":
        argv += ["--no-bandwidth"]  # the all-reduce starts torch workers: seconds per example
    _run(command, argv, env)


@settings(max_examples=2 * SCALE, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(args=st.data(), env=_env)
def test_serve_starts_cleanly_or_refuses_in_one_line(args: st.DataObject,
                                                     env: dict[str, str]) -> None:
    argv = args.draw(_opts(SPECS["serve"]))
    if "--listen" not in argv:
        argv += ["--listen", "127.0.0.1:0"]  # never the real 9857
    _run("serve", argv, env)


@_settings
@given(a=st.one_of(_value, st.binary(max_size=200).map(lambda b: b.hex())),
       data=st.binary(max_size=2000))
def test_diff_and_explain_on_hostile_files(a: str, data: bytes) -> None:
    FIXTURE_DIR.mkdir(exist_ok=True)
    f = FIXTURE_DIR / "input"
    f.write_bytes(data)
    _run("diff", [str(f), a], {})
    _run("explain", ["-", str(f)], {}, stdin=data)


@_settings
@given(data=st.binary(max_size=2000), packing=st.sampled_from(
    ["gzip", "gzip-cut", "utf-16", "utf-32", "zstd-magic", "pickle-magic", "json-magic"]))
def test_explain_on_hostile_encoded_and_compressed_files(data: bytes, packing: str) -> None:
    """The decoded and compressed inputs explain reads (BOMs, gzip, zstd) and the dump sniffing,
    with hostile contents: the documented exit codes, no traceback."""
    import gzip

    blob = {"gzip": lambda: gzip.compress(data), "gzip-cut": lambda: gzip.compress(data)[:-5],
            "utf-16": lambda: b"\xff\xfe" + data, "utf-32": lambda: b"\x00\x00\xfe\xff" + data,
            "zstd-magic": lambda: b"\x28\xb5\x2f\xfd" + data,
            "pickle-magic": lambda: b"\x80\x02" + data,
            "json-magic": lambda: b'{"version": ' + data}[packing]()
    FIXTURE_DIR.mkdir(exist_ok=True)
    f = FIXTURE_DIR / "input.log"
    f.write_bytes(blob)
    _run("explain", [str(f)], {})


@settings(max_examples=150 * SCALE, deadline=None, database=None)
@given(st.one_of(st.binary(max_size=3000),
                 st.recursive(st.one_of(st.none(), st.booleans(), st.integers(),
                                        st.floats(), _text),
                              lambda c: st.one_of(st.lists(c, max_size=5),
                                                  st.dictionaries(_text, c, max_size=5)),
                              max_leaves=30).map(lambda v: json.dumps({"k": v}).encode())),
       st.sampled_from([".yaml", ".toml", ".json"]))
def test_config_loader_answers_config_or_config_error(data: bytes, suffix: str) -> None:
    """In process, many more examples: any bytes are a Config or a ConfigError, nothing else."""
    FIXTURE_DIR.mkdir(exist_ok=True)
    f = FIXTURE_DIR / f"config{suffix}"
    f.write_bytes(data)
    try:
        assert isinstance(load_file(f), Config)
    except ConfigError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 2000, str(exc)[:3000]
