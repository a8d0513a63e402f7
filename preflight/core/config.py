"""Configuration: named defaults < a file (TOML or YAML) < ``PREFLIGHT_*`` variables < the CLI.

Loaded once, validated at start: an unknown key or a wrong type is a :class:`ConfigError` that names
the key and where it came from, and the CLI exits 2 on it. Values are numbers, strings, flags and
lists of strings; ``site_checks`` is a list of tables (:class:`SiteCheck`), set in a file only.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preflight.core.boundedio import read_bounded
from preflight.core.errors import ConfigError
from preflight.core.textsafe import escape

GiB = 1 << 30
MiB = 1 << 20

#: Packages whose versions matter for a distributed job (a scikit-learn skew between nodes:
#: docs/fingerprint.md).
DEFAULT_WATCHED_PACKAGES = (
    "torch", "numpy", "scikit-learn", "transformers", "accelerate", "deepspeed", "triton",
    "nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn-cu13",
)


@dataclass(frozen=True)
class SiteCheck:
    """A check a site adds without editing preflight: an executable run with a deadline whose
    exit status is the verdict and whose first line of output is the message
    (docs/site-checks.md). One table of ``site_checks`` in the config file.

    Attributes:
        name: the check's name in the report, ``--only`` / ``--skip`` and the metric label
            (lower case, digits, ``_``; not a built-in check's name).
        path: absolute path of the executable (run directly, never through a shell).
        args: its arguments.
        timeout_s: its deadline, seconds; at the deadline its whole process group is killed.
        scope: whose fault its FAIL or WARN is: ``node`` (the prolog drains on FAIL) or ``job``.
        reason: the reason token of its FAIL and WARN (CamelCase); None: ``SiteCheckFailed`` /
            ``SiteCheckWarning``.
        remedy: what to do when it fails, shown with the verdict.
        summary: one line saying what it verifies.
    """

    name: str
    path: str
    args: tuple[str, ...] = ()
    timeout_s: float = 10.0
    scope: str = "node"
    reason: str | None = None
    remedy: str = ""
    summary: str = ""


@dataclass(frozen=True)
class Config:
    """Every knob, with its default. Keys in files and ``PREFLIGHT_<KEY>`` use these names."""

    #: GPUs this node must show; None = from the job (SLURM_JOB_GPUS, LOCAL_WORLD_SIZE) or any >= 1.
    expect_gpus: int | None = None
    #: NVLinks each GPU must have active; None = auto (GPUs of one node must agree, a lone GPU
    #: without peers is fine).
    expect_nvlinks: int | None = None
    #: Deadline of one check, seconds.
    check_timeout_s: float = 10.0
    #: Smallest acceptable /dev/shm, bytes (NVIDIA: --shm-size=1g).
    shm_min_bytes: int = GiB
    #: NCCL channels assumed when sizing /dev/shm (9.2 MiB per channel per local peer).
    shm_channels: int = 16
    #: Package distributions whose versions go into the fingerprint.
    watched_packages: tuple[str, ...] = DEFAULT_WATCHED_PACKAGES
    #: Files or directories whose sha256 goes into the fingerprint (code, data manifests).
    hash_paths: tuple[str, ...] = ()
    #: A fingerprint JSON (``preflight fingerprint --json``) the node must match.
    golden: str | None = None
    #: Interpreter whose environment is fingerprinted (the training venv); None = this one.
    python: str | None = None
    #: All-reduce floor in GB/s (1e9 B/s) at the largest size; None = built-in table.
    min_busbw_gbps: float | None = None
    #: Largest all-reduce size of the bandwidth test, bytes.
    bench_max_bytes: int = GiB
    #: Smallest all-reduce size of the bandwidth test, bytes.
    bench_min_bytes: int = 1 * MiB
    #: Deadline of the whole bandwidth test, seconds.
    bench_timeout_s: float = 120.0
    #: Bandwidth test workers: auto (nccl4py if importable, else torch), torch or nccl4py.
    bench_engine: str = "auto"
    #: gpu_speed: FAIL a GPU below this fraction of the node's median figure.
    gpu_speed_slow_fraction: float = 0.8
    #: gpu_speed: WARN a figure below this fraction of its hardware limit.
    gpu_speed_warn_fraction: float = 0.5
    #: gpu_speed: deadline of the whole run, seconds (phases have their own, docs/gpu-speed.md).
    gpu_speed_timeout_s: float = 30.0
    #: gpu_speed worker engine: auto (cuda, else torch), cuda, torch, cpu (plumbing test).
    gpu_speed_engine: str = "auto"
    #: Deadline of each step of the DDP ladder (preflight ddp, check --ddp), seconds.
    ddp_timeout_s: float = 60.0
    #: Start the GPU workers while NVML is read (interpreter, imports, cuInit: no CUDA context,
    #: no GPU memory); False: only once NVML says the GPUs are idle.
    gpu_prestart: bool = True
    #: Treat the job as multi-node even when WORLD_SIZE does not say so.
    multi_node: bool = False
    #: On non-master nodes, try a TCP connect to MASTER_ADDR:MASTER_PORT.
    probe_master: bool = False
    #: xid: only Xids logged within this many seconds count; None = since boot (docs/checks.md).
    xid_since_s: float | None = None
    #: fabric: the rate every RDMA port must train at, Gb/s; None = the highest among the node's
    #: ports of the same link layer.
    fabric_expected_rate_gbps: float | None = None
    #: fabric: seconds between the two reads of the error counters (growth = errors now).
    fabric_counter_interval_s: float = 1.0
    #: cluster: a node pair below this share of the typical pair is a suspect (the bar rises
    #: towards 0.9 when the pairs agree closely; docs/cluster.md).
    cluster_relative_floor: float = 0.8
    #: cluster: with nccl, a run across nodes below this share of the slowest node's link
    #: FAILs over RDMA and WARNs over sockets.
    cluster_link_floor: float = 0.5
    #: Daemon: seconds between node-check runs.
    interval_s: float = 60.0
    #: Daemon: seconds between bandwidth tests (only when no job uses the GPUs).
    bandwidth_interval_s: float = 3600.0
    #: Daemon: where to listen.
    listen: str = "127.0.0.1:9857"
    #: Slurm hooks (prolog, epilog, HealthCheckProgram): the whole run's deadline, seconds (under
    #: Slurm's MessageTimeout, 10 s by default); whatever hangs, the hook has ended by then.
    prolog_budget_s: float = 8.0
    #: A GPU probe that has not answered within this many seconds while the driver is known to
    #: be initialised is a node fault (``NvmlNotAnswering``); see docs/slurm.md for the figures.
    gpu_probe_timeout_s: float = 5.0
    #: Slurm hooks: do not drain when the nodes already drained by preflight are more than this
    #: fraction of the cluster (one ``sinfo`` call); 1.0 turns the guard off.
    max_drain_fraction: float = 0.1
    #: ``--resume``: consecutive passing runs after which a node drained by preflight is resumed.
    resume_after: int = 2
    #: Where preflight keeps what it must remember between runs (passes, Xid acknowledgements).
    state_dir: str = "/var/lib/preflight"
    #: epilog: GPU memory in use on a GPU without a compute process above which the memory is
    #: "not released" (the driver itself reserves some; docs/slurm.md has the figure).
    epilog_idle_memory_max_bytes: int = GiB
    #: Checks the site adds: executables with a deadline (docs/site-checks.md); file only.
    site_checks: tuple[SiteCheck, ...] = ()

    # Kubernetes node status, daemon only (docs/kubernetes.md, "Telling the scheduler").
    #: Daemon: write the condition PreflightFailed on its own Node (named by NODE_NAME).
    kube_node_status: bool = False
    #: Daemon: node runs in a row with a node fault before the condition turns True.
    kube_fail_runs: int = 3
    #: Daemon: healthy node runs in a row before a True condition turns False again.
    kube_pass_runs: int = 5
    #: Daemon: also taint the node cluster-preflight/node-fault:NoSchedule while it is True.
    kube_node_taint: bool = False
    #: Daemon: no new mark while more than this fraction of the compared nodes carry one; 1 = off.
    kube_max_marked_fraction: float = 0.1
    #: Daemon: label selector of the nodes the guard compares with ("" = every node).
    kube_guard_selector: str = ""
    #: Daemon: seconds between two writes of an unchanged condition (its heartbeat).
    kube_heartbeat_s: float = 300.0
    #: Daemon: deadline of one Kubernetes API request, seconds.
    kube_timeout_s: float = 10.0

    def replace(self, **changes: Any) -> Config:
        return validate(dataclasses.replace(self, **changes), source="arguments")


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
_HINTS = typing.get_type_hints(Config)


#: Longest number accepted as text (an int of 5,000 digits is not a setting, and converting one is
#: slow); longer text is "not a number".
_MAX_NUMBER_CHARS = 40
#: Characters of a bad value quoted in an error message.
_MAX_SHOWN_CHARS = 80


def shown(value: Any) -> str:
    """``repr(value)`` cut to a length a one-line message can carry (a value may be huge)."""
    if isinstance(value, (list, tuple, dict)) and len(value) > 20:
        return f"a {type(value).__name__} of {len(value)} items"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN_CHARS else text[:_MAX_SHOWN_CHARS - 3] + "..."


def cut(text: str, limit: int = 200) -> str:
    """``text`` on one line, printable (control characters escaped), at most ``limit``
    characters."""
    return escape(" ".join(text.split()), limit)


def _coerce(key: str, value: Any, source: str, *, from_text: bool) -> Any:
    """``value`` as the type of ``Config.<key>``, or ConfigError naming the key and source."""
    if key in _TABLES:
        if from_text:
            raise ConfigError(f"{source}: {key} is a list of tables: set it in the config file "
                              "(docs/configuration.md)")
        return _coerce_tables(key, value, source)
    return _coerce_value(key, _HINTS[key], value, source, from_text=from_text)


def _coerce_value(key: str, hint: Any, value: Any, source: str, *, from_text: bool) -> Any:
    """``value`` as type ``hint`` (a field of Config or of one of its tables), or ConfigError
    naming ``key`` and ``source``."""
    args = typing.get_args(hint)
    optional = (typing.get_origin(hint) in (typing.Union, types.UnionType)) and type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if optional else hint
    if value is None or (from_text and optional and value in ("", "none", "null")):
        if optional:
            return None
        raise ConfigError(f"{source}: {key} must not be empty")
    want = typing.get_origin(base) or base
    try:
        if want is tuple:
            if from_text and isinstance(value, str):
                value = [v for v in value.split(",") if v]
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise TypeError
            return tuple(value)
        if want is bool:
            if isinstance(value, bool):
                return value
            words = {"1": True, "true": True, "yes": True, "on": True,
                     "0": False, "false": False, "no": False, "off": False}
            if from_text and isinstance(value, str) and value.strip().lower() in words:
                return words[value.strip().lower()]
            raise TypeError
        if want is int:
            if isinstance(value, bool):
                raise TypeError
            if isinstance(value, int):
                return value
            if from_text and isinstance(value, str) and len(value.strip()) <= _MAX_NUMBER_CHARS:
                return int(value.strip(), 0)
            raise TypeError
        if want is float:
            if isinstance(value, bool):
                raise TypeError
            if isinstance(value, (int, float)):
                return float(value)  # OverflowError for a huge int: caught below
            if from_text and isinstance(value, str) and len(value.strip()) <= _MAX_NUMBER_CHARS:
                return float(value)
            raise TypeError
        if want is str:
            if not isinstance(value, str):
                raise TypeError
            return value
    except (TypeError, ValueError, OverflowError):
        pass
    else:  # pragma: no cover - every field type is handled above
        raise AssertionError(f"unhandled config type {hint}")
    kinds: dict[Any, str] = {int: "an integer", float: "a number", bool: "true or false",
                             str: "a string", tuple: "a list of strings"}
    unset = " (or null to unset)" if optional else ""
    raise ConfigError(f"{source}: {key} must be {kinds[want]}{unset}, got {shown(value)}")


#: Config keys that hold a list of tables, and the table's type.
_TABLES: dict[str, type[SiteCheck]] = {"site_checks": SiteCheck}
#: Most tables in one list (a site adds a handful of checks).
MAX_TABLES = 64


def _coerce_tables(key: str, value: Any, source: str) -> tuple[Any, ...]:
    """A list of tables (YAML: a list of mappings; TOML: ``[[key]]``) as ``_TABLES[key]``
    instances; every error names the entry (``site_checks[2].timeout_s``)."""
    kind = _TABLES[key]
    fields = {f.name: f for f in dataclasses.fields(kind)}
    hints = typing.get_type_hints(kind)
    required = [n for n, f in fields.items() if f.default is dataclasses.MISSING]
    if not isinstance(value, list):
        raise ConfigError(f"{source}: {key} must be a list of tables ({', '.join(required)}, "
                          f"...), got {shown(value)}")
    if len(value) > MAX_TABLES:
        raise ConfigError(f"{source}: {key} has {len(value)} entries, at most {MAX_TABLES}")
    out = []
    for i, table in enumerate(value):
        where = f"{key}[{i}]"
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: {where} must be a table with {', '.join(required)}, "
                              f"got {shown(table)}")
        unknown = sorted(str(k) for k in table if k not in fields)
        if unknown:
            raise ConfigError(f"{source}: {where}: unknown key {shown(unknown[0])} (known keys: "
                              f"{', '.join(fields)})")
        missing = [n for n in required if n not in table]
        if missing:
            raise ConfigError(f"{source}: {where}: missing {', '.join(missing)}")
        out.append(kind(**{k: _coerce_value(f"{where}.{k}", hints[k], v, source, from_text=False)
                           for k, v in table.items()}))
    return tuple(out)


#: A site check's name: a metric label value and an --only word.
_SITE_NAME = re.compile(r"[a-z][a-z0-9_]{0,47}")
_REASON = re.compile(r"[A-Z][A-Za-z0-9]{0,63}")
#: Longest site-check timeout, seconds.
MAX_SITE_TIMEOUT_S = 600.0
_MAX_SITE_ARGS = 64
_MAX_SITE_TEXT = 500


def _check_site(sc: SiteCheck, where: str, need: Callable[[bool, str, str], None]) -> None:
    need(_SITE_NAME.fullmatch(sc.name) is not None, f"{where}.name",
         "lower-case letters, digits and _ (a letter first, at most 48)")
    need(sc.path.startswith("/") and len(sc.path) <= _MAX_TEXT_CHARS and "\0" not in sc.path,
         f"{where}.path", "an absolute path (it is run directly, not looked up in PATH)")
    need(len(sc.args) <= _MAX_SITE_ARGS and all(len(a) <= _MAX_TEXT_CHARS and "\0" not in a
                                                 for a in sc.args),
         f"{where}.args", f"at most {_MAX_SITE_ARGS} strings without NUL")
    need(math.isfinite(sc.timeout_s) and 0.001 <= sc.timeout_s <= MAX_SITE_TIMEOUT_S,
         f"{where}.timeout_s", f"a finite number in 0.001..{MAX_SITE_TIMEOUT_S:g} s")
    need(sc.scope in ("node", "job"), f"{where}.scope", "node or job")
    need(sc.reason is None or _REASON.fullmatch(sc.reason) is not None, f"{where}.reason",
         "a CamelCase token (letters and digits, a capital first)")
    for name in ("remedy", "summary"):
        text = getattr(sc, name)
        need(len(text) <= _MAX_SITE_TEXT and text.isprintable(), f"{where}.{name}",
             f"one printable line of at most {_MAX_SITE_TEXT} characters")


#: Inclusive sane ranges; a value outside is a typo or an attack, never a setting.
_DAY_S = 86400.0
RANGES: dict[str, tuple[float, float]] = {
    "expect_gpus": (0, 1024),
    "expect_nvlinks": (0, 64),
    "check_timeout_s": (0.001, 3600.0),
    "shm_min_bytes": (0, 1 << 44),
    "shm_channels": (1, 64),
    "min_busbw_gbps": (0, 100_000.0),
    "bench_min_bytes": (4, 64 * GiB),
    "bench_max_bytes": (4, 64 * GiB),
    "bench_timeout_s": (0.001, _DAY_S),
    "interval_s": (0.001, 7 * _DAY_S),
    "bandwidth_interval_s": (0.001, 90 * _DAY_S),
    "gpu_speed_slow_fraction": (0.001, 1.0),
    "gpu_speed_warn_fraction": (0.001, 1.0),
    "gpu_speed_timeout_s": (0.001, _DAY_S),
    "ddp_timeout_s": (0.001, _DAY_S),
    "xid_since_s": (0.001, 10 * 365 * _DAY_S),
    "fabric_expected_rate_gbps": (0.001, 100_000.0),
    "fabric_counter_interval_s": (0, 5.0),
    "cluster_relative_floor": (0.05, 0.99),
    "cluster_link_floor": (0.01, 1.0),
    "kube_fail_runs": (1, 1000),
    "kube_pass_runs": (1, 1000),
    "kube_max_marked_fraction": (0, 1.0),
    "kube_heartbeat_s": (10.0, _DAY_S),
    "kube_timeout_s": (0.1, 300.0),
    "prolog_budget_s": (0.5, 3600.0),
    "gpu_probe_timeout_s": (0.1, 600.0),
    "max_drain_fraction": (0.0, 1.0),
    "resume_after": (1, 1000),
    "epilog_idle_memory_max_bytes": (0, 1 << 44),
}
#: Longest string or list a config value may be (a path, a package list).
_MAX_TEXT_CHARS = 4096
_MAX_ITEMS = 1024


def _listen_port(text: str) -> int | None:
    port = text.rpartition(":")[2]
    if not text.rpartition(":")[1] or not port.isascii() or not port.isdigit() or len(port) > 5:
        return None
    return int(port)


def validate(config: Config, *, source: str) -> Config:
    """Range checks that types alone cannot express: every number finite and within
    :data:`RANGES`, every text and list of a bounded length."""
    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise ConfigError(f"{source}: {key} must be {what}, got {shown(_value(config, key))}")

    for key, (low, high) in RANGES.items():
        value = getattr(config, key)
        if value is None:
            continue
        unit = " s" if key.endswith("_s") else ""
        need(math.isfinite(value) and low <= value <= high, key,
             f"a finite number in {low:g}..{high:g}{unit}")
    for f in dataclasses.fields(Config):
        value = getattr(config, f.name)
        if isinstance(value, str):
            need(len(value) <= _MAX_TEXT_CHARS and "\0" not in value, f.name,
                 f"at most {_MAX_TEXT_CHARS} characters without NUL")
        elif isinstance(value, tuple) and f.name not in _TABLES:
            need(len(value) <= _MAX_ITEMS and all(len(v) <= _MAX_TEXT_CHARS and "\0" not in v
                                                  for v in value),
                 f.name, f"at most {_MAX_ITEMS} items of at most {_MAX_TEXT_CHARS} characters")
    need(config.bench_max_bytes >= config.bench_min_bytes, "bench_max_bytes", ">= bench_min_bytes")
    need(config.bench_engine in ("auto", "torch", "nccl4py"), "bench_engine",
         "one of auto, torch, nccl4py")
    need(config.gpu_speed_engine in ("auto", "cuda", "torch", "cpu"), "gpu_speed_engine",
         "auto, cuda, torch or cpu")
    need(config.kube_guard_selector.isascii() and config.kube_guard_selector.isprintable(),
         "kube_guard_selector", "a label selector in printable ASCII")
    need(config.state_dir.startswith("/"), "state_dir", "an absolute path")
    port = _listen_port(config.listen)
    need(port is not None and port <= 65535, "listen", "HOST:PORT with a port in 0..65535")
    need(len(config.site_checks) <= MAX_TABLES, "site_checks", f"at most {MAX_TABLES} entries")
    seen: set[str] = set()
    for i, sc in enumerate(config.site_checks):
        _check_site(sc, f"site_checks[{i}]", need)
        need(sc.name not in seen, f"site_checks[{i}].name", "a name no other site check has")
        seen.add(sc.name)
    return config


def _value(config: Config, key: str) -> Any:
    """The value at ``key`` (``listen``, ``site_checks[2].timeout_s``), for error messages."""
    m = re.fullmatch(r"(\w+)\[(\d+)\]\.(\w+)", key)
    if m is None:
        return getattr(config, key)
    return getattr(getattr(config, m.group(1))[int(m.group(2))], m.group(3))


def as_data(config: Config) -> dict[str, Any]:
    """``config`` as plain data a YAML or JSON file holds (lists, not tuples); loading it back
    gives the same Config."""
    def plain(value: Any) -> Any:
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return {k: plain(v) for k, v in dataclasses.asdict(config).items()}


def _known_hint(key: Any) -> str:
    """The keys closest to a mistyped ``key``, and where every key is listed: the whole list
    (some forty keys) would make the message longer than a log line should be."""
    import difflib

    close = difflib.get_close_matches(str(key)[:_MAX_SHOWN_CHARS], sorted(_FIELDS), n=3)
    did = f"did you mean {', '.join(close)}? " if close else ""
    return f"{did}every key: preflight docs configuration"


def from_mapping(data: Mapping[str, Any], *, source: str, base: Config | None = None,
                 from_text: bool = False) -> Config:
    """Apply ``data`` over ``base``; unknown keys and wrong types raise ConfigError."""
    changes = {}
    for key, value in data.items():
        if key not in _FIELDS:
            raise ConfigError(f"{source}: unknown key {shown(key)} ({_known_hint(key)})")
        changes[key] = _coerce(key, value, source, from_text=from_text)
    return validate(dataclasses.replace(base or Config(), **changes), source=source)


#: Deepest nesting a config file may have (a real one has 2 levels).
MAX_DEPTH = 16


def _depth(value: Any, limit: int) -> bool:
    """True when ``value`` nests no deeper than ``limit`` (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return False
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return True


def load_file(path: str | Path, *, base: Config | None = None) -> Config:
    """Read a TOML (``.toml``) or YAML (anything else) file; keys may sit under ``[preflight]``.

    The file is read through :func:`~preflight.core.boundedio.read_bounded` (a regular file of at
    most 4 MiB, within 5 s), must be UTF-8, and may not use YAML aliases, duplicate keys or nest
    deeper than :data:`MAX_DEPTH`: anything else is a :class:`ConfigError`, never a hang or a
    traceback.
    """
    p = Path(path)
    kind = "TOML" if p.suffix == ".toml" else "YAML"
    try:
        raw = read_bounded(p)
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config file: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start}); write the config in "
                          "UTF-8") from None
    # Each parser is loaded only for its own kind of file.
    parse: Callable[[str], Any]
    invalid: type[Exception]
    if kind == "TOML":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover
            import tomli as tomllib
        parse, invalid = tomllib.loads, tomllib.TOMLDecodeError
    else:
        from preflight.core import configyaml

        parse, invalid = configyaml.parse, configyaml.YAMLError
    try:
        data: Any = parse(text)
    except invalid as exc:
        first = " ".join(str(exc).split())
        raise ConfigError(f"{p}: not valid {kind}: {cut(first)}") from None
    except (RecursionError, ValueError, OverflowError, MemoryError) as exc:
        raise ConfigError(f"{p}: not a usable {kind} config: {type(exc).__name__}: "
                          f"{cut(str(exc))}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of keys to values at the top level")
    if not _depth(data, MAX_DEPTH):
        raise ConfigError(f"{p}: nested deeper than {MAX_DEPTH} levels")
    if set(data) == {"preflight"} and isinstance(data["preflight"], dict):
        data = data["preflight"]
    return from_mapping(data, source=str(p), base=base)


ENV_PREFIX = "PREFLIGHT_"
#: Variables with our prefix that are not configuration keys.
_ENV_NOT_CONFIG = frozenset({"PREFLIGHT_CONFIG", "PREFLIGHT_NVML_FIXTURE", "PREFLIGHT_LOG_LEVEL",
                             "PREFLIGHT_GPU_SPEED_FIXTURE", "PREFLIGHT_GPUSPEED_TEST_STALL"})


def from_env(env: Mapping[str, str], *, base: Config) -> Config:
    """Apply ``PREFLIGHT_<KEY>`` overrides (e.g. ``PREFLIGHT_EXPECT_GPUS=8``)."""
    data = {
        k[len(ENV_PREFIX):].lower(): v
        for k, v in env.items()
        if k.startswith(ENV_PREFIX) and k not in _ENV_NOT_CONFIG
    }
    return from_mapping(data, source="environment (PREFLIGHT_*)", base=base, from_text=True)


def load(*, path: str | None, env: Mapping[str, str], overrides: Mapping[str, Any]) -> Config:
    """Defaults < file (``path`` or ``$PREFLIGHT_CONFIG``) < environment < CLI ``overrides``."""
    config = Config()
    path = path or env.get("PREFLIGHT_CONFIG") or None
    if path:
        config = load_file(path, base=config)
    config = from_env(env, base=config)
    return from_mapping({k: v for k, v in overrides.items() if v is not None},
                        source="command line", base=config)


__all__ = ["Config", "ConfigError", "GiB", "MiB", "SiteCheck", "as_data", "load", "load_file"]
