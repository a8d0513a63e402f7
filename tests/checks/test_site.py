"""Site checks: real executables from the config, judged by exit status and first output line;
their own breakage (missing, not executable, hanging, flooding, crashing) is ERROR, never FAIL."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from preflight.checks.site import MESSAGE_CHARS, site_checks
from preflight.core.config import Config, ConfigError, SiteCheck
from preflight.core.result import Result, Scope, Status
from preflight.core.runner import run_checks
from tests import topologies
from tests.conftest import MakeCtx
from tests.helpers import cli_json, pid_alive, run_cli, write_fixture


def script(tmp_path: Path, name: str, body: str, *, mode: int = 0o755) -> Path:
    path = tmp_path / name
    path.write_text(body)
    path.chmod(mode)
    return path


def sh(tmp_path: Path, name: str, body: str) -> Path:
    return script(tmp_path, name, f"#!/bin/sh\n{body}\n")


def run_one(make_ctx: MakeCtx, path: Path, *args: str, env: dict[str, str] | None = None,
            **entry: object) -> Result:
    sc = SiteCheck(name="site_one", path=str(path), args=args, **entry)  # type: ignore[arg-type]
    cfg = Config().replace(site_checks=(sc,))
    report = run_checks(make_ctx(config=cfg, env=env), site_checks(cfg, ()))
    return report.results[0]


@pytest.mark.parametrize(("code", "status", "reason", "scope"), [
    (0, Status.PASS, "SiteCheckOk", Scope.NODE),
    (1, Status.FAIL, "SiteCheckFailed", Scope.NODE),
    (2, Status.WARN, "SiteCheckWarning", Scope.NODE),
    (3, Status.ERROR, "SiteCheckUndecided", Scope.UNDECIDED),
])
def test_exit_status_is_the_verdict_and_the_first_line_the_message(
        make_ctx: MakeCtx, tmp_path: Path, code: int, status: Status, reason: str,
        scope: Scope) -> None:
    path = sh(tmp_path, "verdict",
              f"echo 'lustre: /lustre mounted, 3 OSTs'\necho second\nexit {code}")
    r = run_one(make_ctx, path)
    assert (r.status, r.reason, r.scope) == (status, reason, scope)
    assert r.message == "lustre: /lustre mounted, 3 OSTs"
    assert r.details["exit_status"] == code


def test_reason_scope_and_remedy_come_from_the_entry(make_ctx: MakeCtx, tmp_path: Path) -> None:
    path = sh(tmp_path, "licence", "echo 'licence server lic01:27000 refused'; exit 1")
    r = run_one(make_ctx, path, reason="LicenceDown", scope="job",
                remedy="ask the job owner to renew the licence")
    assert (r.status, r.reason, r.scope) == (Status.FAIL, "LicenceDown", Scope.JOB)
    assert r.remedy == "ask the job owner to renew the licence"


def test_arguments_are_passed_as_words_never_through_a_shell(make_ctx: MakeCtx,
                                                             tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = script(tmp_path, "argv", "#!" + sys.executable + "\nimport sys\n"
                  "print(repr(sys.argv[1:]))\n")
    args = ("a b", f"; touch {marker}", "$(touch " + str(marker) + ")", "*")
    r = run_one(make_ctx, path, *args)
    assert r.status is Status.PASS
    assert r.message == repr(list(args))
    assert not marker.exists()


def test_the_job_environment_is_the_scripts(make_ctx: MakeCtx, tmp_path: Path) -> None:
    path = sh(tmp_path, "env", 'echo "job $SLURM_JOB_ID"')
    r = run_one(make_ctx, path, env={"SLURM_JOB_ID": "4242"})
    assert r.message == "job 4242"


def test_a_hanging_script_and_its_children_are_killed_at_the_deadline(
        make_ctx: MakeCtx, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    path = sh(tmp_path, "hang", f"sleep 300 &\necho $! > {pids}\necho $$ >> {pids}\nsleep 300")
    t0 = time.monotonic()
    r = run_one(make_ctx, path, timeout_s=0.5)
    took = time.monotonic() - t0
    assert (r.status, r.reason, r.scope) == (Status.ERROR, "SiteCheckTimeout", Scope.UNDECIDED)
    assert "did not finish within its 0.5 s deadline" in r.message
    assert took < 30  # the deadline holds, whatever the machine's load
    left = [int(p) for p in pids.read_text().split()]
    give_up = time.monotonic() + 10  # SIGKILL is asynchronous; reaping is init's
    while any(pid_alive(p) for p in left) and time.monotonic() < give_up:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in left)


def test_a_megabyte_of_output_is_read_bounded(make_ctx: MakeCtx, tmp_path: Path) -> None:
    path = script(tmp_path, "flood", "#!" + sys.executable + "\nimport sys\n"
                  "sys.stdout.write('x' * 1_000_000 + '\\n' + 'y' * 100_000)\n")
    r = run_one(make_ctx, path)
    assert (r.status, r.reason) == (Status.PASS, "SiteCheckOk")
    assert len(r.message) == MESSAGE_CHARS and r.message.endswith("...")
    assert r.details["output_bytes"] == 1_100_001


def test_endless_output_does_not_fill_memory(make_ctx: MakeCtx, tmp_path: Path) -> None:
    path = sh(tmp_path, "yes", "exec yes")
    r = run_one(make_ctx, path, timeout_s=0.5)
    assert r.reason == "SiteCheckTimeout"


def test_control_characters_in_the_message_are_escaped(make_ctx: MakeCtx, tmp_path: Path) -> None:
    path = sh(tmp_path, "evil", r"printf '\033[2Jcleared\007\n'; exit 1")
    r = run_one(make_ctx, path)
    assert r.status is Status.FAIL
    assert r.message == "\\e[2Jcleared\\x07"


def test_not_executable_missing_and_a_directory_are_errors(make_ctx: MakeCtx,
                                                           tmp_path: Path) -> None:
    plain = script(tmp_path, "plain", "#!/bin/sh\nexit 1\n", mode=0o644)
    r = run_one(make_ctx, plain)
    assert (r.status, r.reason, r.scope) == (Status.ERROR, "SiteCheckNotExecutable",
                                             Scope.UNDECIDED)
    assert "is not executable" in r.message and "chmod +x" in r.remedy
    assert run_one(make_ctx, tmp_path / "nope").reason == "SiteCheckNotFound"
    assert run_one(make_ctx, tmp_path).reason == "SiteCheckNotExecutable"


def test_a_script_without_an_interpreter_line(make_ctx: MakeCtx, tmp_path: Path) -> None:
    path = script(tmp_path, "noshebang", "\x7fELF not really\n")
    r = run_one(make_ctx, path)
    assert (r.status, r.reason) == (Status.ERROR, "SiteCheckNotExecutable")
    assert "#! line" in r.message


def test_a_crashing_interpreter_is_broken_not_a_failure(make_ctx: MakeCtx, tmp_path: Path) -> None:
    """Python exits 1 on an uncaught exception, with nothing on stdout: that must not drain."""
    path = script(tmp_path, "crash", "#!" + sys.executable + "\nraise KeyError('mountpoint')\n")
    r = run_one(make_ctx, path)
    assert (r.status, r.reason, r.scope) == (Status.ERROR, "SiteCheckNoMessage", Scope.UNDECIDED)
    assert "KeyError: 'mountpoint'" in r.message and r.details["stderr"] == "KeyError: 'mountpoint'"


@pytest.mark.parametrize(("body", "text"), [
    ("exit 7", "exited 7"),
    ("kill -9 $$", f"was killed by signal {signal.SIGKILL.value}"),
])
def test_other_exit_statuses_are_errors(make_ctx: MakeCtx, tmp_path: Path, body: str,
                                        text: str) -> None:
    r = run_one(make_ctx, sh(tmp_path, "odd", f"echo hello\n{body}"))
    assert (r.status, r.reason) == (Status.ERROR, "SiteCheckBadExit")
    assert text in r.message


def test_a_builtin_name_is_refused() -> None:
    cfg = Config().replace(site_checks=(SiteCheck("shm", "/bin/true"),))
    with pytest.raises(ConfigError, match=r"site_checks\[0\]\.name 'shm' is a built-in"):
        site_checks(cfg, ("shm", "xid"))


def test_the_runner_waits_for_the_scripts_own_deadline(make_ctx: MakeCtx, tmp_path: Path) -> None:
    """A site check's deadline is its timeout_s, not check_timeout_s."""
    path = sh(tmp_path, "slow", "sleep 0.6; echo done")
    sc = SiteCheck(name="slow", path=str(path), timeout_s=5)
    cfg = Config().replace(site_checks=(sc,), check_timeout_s=0.2)
    r = run_checks(make_ctx(config=cfg), site_checks(cfg, ())).results[0]
    assert (r.status, r.message) == (Status.PASS, "done")


# -- through the CLI: the JSON, the table, /metrics, the prolog ------------------------------

def _config(tmp_path: Path, body: str, *, kind: str = "yaml") -> Path:
    cfg = tmp_path / f"site.{kind}"
    cfg.write_text(body)
    return cfg


def test_cli_reports_a_site_check_like_any_check(tmp_path: Path) -> None:
    path = sh(tmp_path, "lustre", "echo '/lustre is not mounted'; exit 1")
    cfg = _config(tmp_path, f"""
[[site_checks]]
name = "lustre"
path = "{path}"
reason = "LustreMissing"
remedy = "mount -t lustre mds01@o2ib:/fs /lustre"
""", kind="toml")
    fixture = write_fixture(tmp_path / "nvml.json", topologies.healthy_8x_h100())
    prom = tmp_path / "metrics.prom"
    rc, data = cli_json(["check", "--config", str(cfg), "--only", "lustre,shm",
                         "--prom-file", str(prom)], fixture=fixture)
    assert rc == 1
    r = next(x for x in data["results"] if x["check"] == "lustre")
    assert (r["status"], r["reason"], r["scope"]) == ("fail", "LustreMissing", "node")
    assert r["message"] == "/lustre is not mounted"
    text = prom.read_text()
    assert ('preflight_check_result_info{check="lustre",reason="LustreMissing",scope="node",'
            'status="fail"} 1.0') in text
    table = run_cli(["check", "--config", str(cfg), "--only", "lustre"], fixture=fixture)
    assert "lustre" in table.stdout and "/lustre is not mounted" in table.stdout


def test_cli_config_errors_name_the_entry(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "site_checks:\n  - name: lustre\n    path: bin/lustre\n")
    proc = run_cli(["check", "--config", str(cfg)])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "site_checks[0].path must be an absolute path" in proc.stderr


def test_prolog_drains_for_a_node_fail_but_never_for_a_broken_script(
        tmp_path: Path, scontrol: tuple[Path, Path]) -> None:
    fake, calls = scontrol
    fixture = write_fixture(tmp_path / "nvml.json", topologies.healthy_8x_h100())
    broken = script(tmp_path, "broken", "#!/bin/sh\nexit 1\n", mode=0o644)
    cfg = _config(tmp_path, json.dumps({"site_checks": [
        {"name": "broken", "path": str(broken)}]}))
    skip = "network,master_port,versions,xid,fabric"
    proc = run_cli(["prolog", "--scontrol", str(fake), "--config", str(cfg), "--skip", skip],
                   fixture=fixture, env={"SLURMD_NODENAME": "gpu017"})
    assert proc.returncode == 0 and not calls.exists()
    assert "ERROR broken SiteCheckNotExecutable" in proc.stderr
    failing = sh(tmp_path, "failing", "echo 'BIOS: SR-IOV off'; exit 1")
    cfg.write_text(json.dumps({"site_checks": [{"name": "bios", "path": str(failing),
                                                "reason": "BiosSetting"}]}))
    proc = run_cli(["prolog", "--scontrol", str(fake), "--config", str(cfg), "--skip", skip],
                   fixture=fixture, env={"SLURMD_NODENAME": "gpu017",
                                         # no sinfo here: no fleet guard (tests/slurm has one)
                                         "PREFLIGHT_MAX_DRAIN_FRACTION": "1"})
    assert proc.returncode == 1
    assert "reason=preflight: bios BiosSetting" in calls.read_text()


def test_the_daemon_has_site_check_series_from_the_first_scrape(tmp_path: Path) -> None:
    from preflight.daemon import Daemon
    from preflight.outputs.prom import render

    cfg = Config().replace(site_checks=(SiteCheck("lustre", str(tmp_path / "x")),))
    d = Daemon(cfg, known_checks=("shm",), bandwidth=False)
    assert d.checks() == ("shm", "lustre")
    text = render(d.snapshot()).decode()
    assert 'preflight_check_status{check="lustre",status="pass"} 0.0' in text
