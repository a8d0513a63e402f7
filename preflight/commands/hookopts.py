"""The options every Slurm hook command has (``prolog``, ``epilog``), in a module of their own:
building the parser loads none of the hooks' machinery (:mod:`preflight.commands.slurmhook`)."""

from __future__ import annotations

import argparse


def add_hook_options(p: argparse.ArgumentParser) -> None:
    """Options every Slurm hook has."""
    p.add_argument("--report-only", action="store_true",
                   help="run and report everything (stderr, --prom-file), drain and resume "
                        "nothing, exit 0: the first step of a rollout")
    p.add_argument("--fail-closed", action="store_true",
                   help="drain and exit 1 also when preflight could not decide or its config is "
                        "bad (default: log and let the job run)")
    p.add_argument("--prom-file", metavar="PATH",
                   help="also write the verdict and what the hook did as node_exporter textfile "
                        "metrics (preflight_slurm_*; never changes the exit code)")
    p.add_argument("--node", metavar="NAME",
                   help="the Slurm node name (default: SLURMD_NODENAME, else the short host "
                        "name)")
    p.add_argument("--scontrol", default=None, metavar="PATH",
                   help="scontrol to call (default: /usr/bin/scontrol, /usr/local/bin/scontrol)")
    p.add_argument("--sinfo", default=None, metavar="PATH",
                   help="sinfo for the fleet guard's count (default: /usr/bin/sinfo, "
                        "/usr/local/bin/sinfo)")
