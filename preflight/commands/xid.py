"""``preflight xid``: the Xids in the kernel log, and the operator's record that they are fixed.

``preflight xid`` shows what the ``xid`` check sees (each Xid with its class and whether it is
acknowledged). ``--ack [--gpu BUSID]`` records that the Xids logged so far (of that GPU, or of
every GPU) are dealt with; ``--reset --gpu BUSID`` resets the GPU with ``nvidia-smi`` first and
records the reset. Records are per boot, under ``state_dir`` (:mod:`preflight.core.xidacks`).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys

from preflight.cli import Formatter, add_config_options, build_context, emit_report, report_exit
from preflight.core.errors import ConfigError
from preflight.core.textsafe import escape

# What the command runs is imported when it runs: building the parser loads none of it.

#: Deadline of ``nvidia-smi --gpu-reset``, seconds (a reset takes seconds; NVIDIA: 5-10 s).
RESET_TIMEOUT_S = 60.0
_FULL_BUS_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")

DESCRIPTION = """\
Show the NVIDIA Xid errors in the kernel log as the xid check judges them, or record that they
are dealt with. An Xid stays in the kernel log until reboot; without a record every later
prolog would drain the node again for it.

  preflight xid                          what the xid check sees (table, or --json)
  preflight xid --reset --gpu 0000:3b:00.0
                                         nvidia-smi --gpu-reset -i BUSID, then record the reset
  preflight xid --ack [--gpu BUSID]      record that the Xids logged so far are dealt with

Xids logged before a record are reported as acknowledged and no longer fail; a new Xid after
it fails again. Records are kept per boot in state_dir (default /var/lib/preflight).
The operator's steps after a drain for an Xid: docs/slurm.md."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "xid", formatter_class=Formatter,
        help="show the kernel log's Xids; record a GPU reset or an acknowledgement",
        description=DESCRIPTION,
        epilog="exit codes: 0 no Xid that counts, 1 a GPU fault Xid counts, 2 usage or "
               "configuration error (or the record could not be made), 3 could not decide")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--ack", action="store_true",
                      help="record that the Xids logged up to now are dealt with")
    what.add_argument("--reset", action="store_true",
                      help="reset the GPU (--gpu, required) with nvidia-smi, then record it")
    p.add_argument("--gpu", metavar="BUSID",
                   help="the GPU's PCI address as in the Xid line or nvidia-smi "
                        "(0000:3b:00.0, 3b:00.0); default for --ack: every GPU")
    p.add_argument("--nvidia-smi", metavar="PATH", default=None,
                   help="nvidia-smi for --reset (default: the one on PATH, else "
                        "/usr/bin/nvidia-smi)")
    p.add_argument("--json", action="store_true", help="print the JSON report")
    add_config_options(p)
    p.set_defaults(func=run)


def parse_gpu(text: str) -> str:
    """``--gpu`` as the ``dddd:bb:dd`` key of Xid lines; ConfigError when not a PCI address."""
    from preflight.probes.kernlog import gpu_key
    from preflight.probes.pci import normalize_bus_id

    raw = text.strip()
    full = normalize_bus_id(raw if "." in raw else raw + ".0")
    if not _FULL_BUS_ID.match(full):
        raise ConfigError(f"--gpu {escape(raw, 60)!r} is not a PCI address (e.g. 0000:3b:00.0, "
                          "as `nvidia-smi --query-gpu=pci.bus_id --format=csv` prints it)")
    return gpu_key(full)


def run(args: argparse.Namespace) -> int:
    from preflight.checks import CHECKS
    from preflight.checks.xid import NAME as XID
    from preflight.core import xidacks
    from preflight.core.runner import run_checks, select
    from preflight.core.state import StateError
    from preflight.probes.kmsg import uptime_s

    ctx = build_context(args, {})
    gpu = parse_gpu(args.gpu) if args.gpu else None
    if args.reset and gpu is None:
        raise ConfigError("--reset needs --gpu BUSID (the GPU to reset)")
    if args.ack or args.reset:
        if args.reset:
            _reset(args.nvidia_smi or shutil.which("nvidia-smi") or "/usr/bin/nvidia-smi", gpu)
        now = uptime_s(ctx.root)
        if now is None:
            raise ConfigError(f"cannot read {ctx.root}/proc/uptime: the record needs the time "
                              "since boot")
        try:
            ack = xidacks.record(ctx.config.state_dir, ctx.root, gpu=gpu, uptime_s=now,
                                 by="reset" if args.reset else "ack")
        except StateError as exc:
            raise ConfigError(f"cannot record in state_dir: {exc}") from None
        who = f"GPU {gpu}" if gpu else "every GPU"
        print(f"preflight xid: {who}: Xids logged up to now ({ack.describe()}) are "
              f"acknowledged in {ctx.config.state_dir}", file=sys.stderr)
    report = run_checks(ctx, select(CHECKS, only=[XID]), mode="xid")
    emit_report(report, as_json=args.json)
    return report_exit(report, strict=False)


def _reset(nvidia_smi: str, gpu: str | None) -> None:
    from preflight.core.procgroup import HelperFailed, run_checked

    argv = [nvidia_smi, "--gpu-reset", "-i", f"{gpu}.0"]
    try:
        run_checked(argv, timeout_s=RESET_TIMEOUT_S)
    except HelperFailed as exc:
        raise ConfigError(f"{escape(str(exc), 400)}; nothing recorded (a GPU in use cannot be "
                          "reset: stop its processes first; one that does not reset needs a "
                          "reboot)") from None
