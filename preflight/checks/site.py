"""Site checks: executables a site adds through the config (``site_checks``), judged like any
check, as node-problem-detector runs its custom plugins.

What: each entry names an executable, its arguments, a deadline and a scope. It runs directly
(never through a shell), with the job's environment, stdin from /dev/null, in a process group of
its own that is killed whole at the deadline. Its exit status is the verdict and the first line of
its standard output is the message (at most :data:`MESSAGE_CHARS` characters, control characters
escaped); the rest of the output is read and dropped past :data:`MAX_OUTPUT_BYTES`.

Why: every cluster has facts of its own that decide whether a job will run (a parallel file system
mounted, a licence server up, a BIOS setting); putting them beside the built-in checks gives them
the same report, exit code, drain and metrics without editing preflight.

Verdicts (exit status, docs/site-checks.md says why):
    0 PASS ``SiteCheckOk``; 1 FAIL and 2 WARN with the entry's ``reason`` (default
    ``SiteCheckFailed`` / ``SiteCheckWarning``) and ``scope``; 3 ERROR ``SiteCheckUndecided``
    (the script could not tell). The script's own breakage is ERROR, never a FAIL that would drain
    a node: ``SiteCheckNotFound``, ``SiteCheckNotExecutable``, ``SiteCheckTimeout``,
    ``SiteCheckBadExit`` (another status, or killed by a signal), and ``SiteCheckNoMessage`` (1
    or 2 without a first line: a crashing interpreter exits 1 with its traceback on stderr).

Knobs: per entry ``name``, ``path``, ``args`` ([]), ``timeout_s`` (10), ``scope`` (node),
``reason``, ``remedy``, ``summary``.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Collection
from typing import Any

from preflight.checks.base import Check
from preflight.core.config import Config, ConfigError, SiteCheck
from preflight.core.context import Context, activity
from preflight.core.procgroup import GroupTimeout, run_in_group
from preflight.core.result import Result, Scope, Status
from preflight.core.textsafe import escape

#: Characters of the first output line kept as the message.
MESSAGE_CHARS = 300
#: Bytes of stdout and of stderr kept (each); the rest is read and dropped.
MAX_OUTPUT_BYTES = 64 * 1024
#: How much longer than the script's own deadline the runner waits for this check: the time to
#: kill the group and collect what it wrote, so the deadline is reported here, naming the script.
RUNNER_GRACE_S = 3.0

#: Exit status -> verdict. 0 and 1 mean what they mean for any command (test, grep -q), so an
#: existing probe script works unchanged; 2 flags without failing; 3 is "could not tell", as
#: node-problem-detector's Unknown and the Nagios plugin convention's UNKNOWN.
EXIT_STATUS = {0: Status.PASS, 1: Status.FAIL, 2: Status.WARN, 3: Status.ERROR}


def site_checks(config: Config, builtin: Collection[str]) -> tuple[Check, ...]:
    """One Check per ``site_checks`` entry, after the built-in ones.

    Raises:
        ConfigError: an entry takes a built-in check's name (its report and metrics would mix).
    """
    taken = set(builtin)
    for i, sc in enumerate(config.site_checks):
        if sc.name in taken:
            raise ConfigError(f"site_checks[{i}].name {sc.name!r} is a built-in check's name; "
                              "choose another")
    return tuple(_as_check(sc) for sc in config.site_checks)


def _as_check(sc: SiteCheck) -> Check:
    def run(ctx: Context) -> Result:
        return run_site_check(sc, ctx)

    def deadline(ctx: Context) -> float:
        return sc.timeout_s + RUNNER_GRACE_S

    return Check(sc.name, run, sc.summary or f"site check: {escape(sc.path, 60)}",
                 timeout_s=deadline)


def _error(sc: SiteCheck, reason: str, message: str, remedy: str,
           details: dict[str, Any]) -> Result:
    return Result(sc.name, Status.ERROR, reason, message, remedy, details=details,
                  scope=Scope.UNDECIDED)


def _first_line(data: bytes) -> str:
    line = data.split(b"\n", 1)[0].rstrip(b"\r")
    return escape(line.decode("utf-8", "replace").strip(), MESSAGE_CHARS)


def _last_line(data: bytes) -> str:
    lines = [x for x in data.decode("utf-8", "replace").splitlines() if x.strip()]
    return escape(lines[-1].strip(), MESSAGE_CHARS) if lines else ""


def run_site_check(sc: SiteCheck, ctx: Context) -> Result:
    """Run one site check and turn its exit status and first line into a Result."""
    shown = escape(sc.path, 200)
    details: dict[str, Any] = {"path": sc.path, "args": list(sc.args), "timeout_s": sc.timeout_s}
    fix = (f"Fix the site check {sc.name} ({shown}) or remove it from site_checks; this is the "
           "script's own trouble, not the node's")
    try:
        st = os.stat(sc.path)
    except FileNotFoundError:
        return _error(sc, "SiteCheckNotFound", f"{shown} does not exist on this node",
                      f"Install it on every node (or fix site_checks path). {fix}.", details)
    except OSError as exc:
        return _error(sc, "SiteCheckNotExecutable", f"{shown}: {exc.strerror or exc}", fix + ".",
                      details)
    if not stat.S_ISREG(st.st_mode) or not os.access(sc.path, os.X_OK):
        what = "is not a regular file" if not stat.S_ISREG(st.st_mode) else "is not executable"
        return _error(sc, "SiteCheckNotExecutable", f"{shown} {what}",
                      f"chmod +x {shown} (and give it a #! line). {fix}.", details)
    try:
        with activity(f"site check {shown} (deadline {sc.timeout_s:g} s)"):
            done = run_in_group([sc.path, *sc.args], timeout_s=sc.timeout_s, env=ctx.env,
                                max_output_bytes=MAX_OUTPUT_BYTES)
    except GroupTimeout:
        return _error(sc, "SiteCheckTimeout",
                      f"{shown} did not finish within its {sc.timeout_s:g} s deadline; its "
                      "process group was killed", f"Make it answer faster or raise its "
                      f"timeout_s. {fix}.", details)
    except OSError as exc:
        reason = "SiteCheckNotFound" if exc.errno == errno.ENOENT else "SiteCheckNotExecutable"
        hint = " (a script needs a #! line)" if exc.errno == errno.ENOEXEC else ""
        return _error(sc, reason, f"{shown} cannot be started: {exc.strerror or exc}{hint}",
                      fix + ".", details)
    message = _first_line(done.stdout)
    details.update(exit_status=done.returncode,
                   output_bytes=len(done.stdout) + done.stdout_dropped)
    stderr = _last_line(done.stderr)
    if stderr:
        details["stderr"] = stderr
    status = EXIT_STATUS.get(done.returncode)
    said = f" (stderr: {stderr})" if stderr else ""
    if status is None:
        how = (f"was killed by signal {-done.returncode}" if done.returncode < 0
               else f"exited {done.returncode}")
        return _error(sc, "SiteCheckBadExit",
                      f"{shown} {how}; a site check exits 0 (pass), 1 (fail), 2 (warn) or 3 "
                      f"(could not tell){said}", fix + ".", details)
    if status is Status.ERROR:
        return _error(sc, "SiteCheckUndecided", message or f"{shown} could not tell (exit 3)",
                      sc.remedy, details)
    if status in (Status.FAIL, Status.WARN) and not message:
        return _error(sc, "SiteCheckNoMessage",
                      f"{shown} exited {done.returncode} without a message on its first line of "
                      f"output, so it is taken as broken, not as a verdict{said}",
                      f"Print the reason on stdout's first line. {fix}.", details)
    if status is Status.PASS:
        return Result(sc.name, Status.PASS, "SiteCheckOk", message or f"{shown} passed",
                      details=details)
    default = "SiteCheckFailed" if status is Status.FAIL else "SiteCheckWarning"
    return Result(sc.name, status, sc.reason or default, message, sc.remedy, details=details,
                  scope=Scope(sc.scope))


__all__ = ["EXIT_STATUS", "MAX_OUTPUT_BYTES", "MESSAGE_CHARS", "run_site_check", "site_checks"]
