"""``preflight fingerprint`` and ``preflight diff``: the environment fingerprint, and what differs
between two of them (an image's CI, an operator comparing a bad node with a good one).

``fingerprint``: exit 0 with the fingerprint; 1 when ``--python`` names an interpreter that is
missing or broken; 2 on a configuration error; 3 when it did not answer in time.
``diff A B``: exit 0 same, 1 different, 2 when a file is unreadable or not a fingerprint.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from preflight.cli import Formatter, add_config_options, build_context
from preflight.core.textsafe import escape


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "fingerprint", formatter_class=Formatter,
        help="print this environment's fingerprint (python, torch, CUDA, cuDNN, NCCL, driver, "
             "packages, hashes)",
        description="Describe the training environment without importing torch: python, torch "
                    "and its CUDA, cuDNN, NCCL (ncclGetVersion), the driver, the watched "
                    "packages (config watched_packages) and sha256 of hash_paths. Save it on a "
                    "good node as the golden file for `preflight check --golden FILE`.",
        epilog="exit codes: 0 ok, 1 the --python interpreter is missing or broken, "
               "2 usage/config error, 3 it did not answer in time")
    p.add_argument("--json", action="store_true",
                   help="print the fingerprint as JSON (the golden-file format)")
    p.add_argument("--python", metavar="PATH",
                   help="interpreter of the training environment (default: config key python, "
                        "else the one running preflight)")
    add_config_options(p)
    p.set_defaults(func=run_fingerprint)

    d = sub.add_parser(
        "diff", formatter_class=Formatter,
        help="say what differs between two fingerprints (or two check --json reports)",
        description="Compare two fingerprints (preflight fingerprint --json, or the fingerprint "
                    "inside preflight check --json reports) and name each difference: "
                    "'scikit-learn: 1.3.2 on A, 1.5.0 on B', 'only on B: deepspeed 0.14.0'.",
        epilog="exit codes: 0 same, 1 different, 2 a file is unreadable or not a fingerprint")
    d.add_argument("a", metavar="A.json", help="first fingerprint file (A)")
    d.add_argument("b", metavar="B.json", help="second fingerprint file (B)")
    d.add_argument("--json", action="store_true", help="print the differences as JSON")
    d.set_defaults(func=run_diff)


def _human(fp: dict[str, Any]) -> str:
    from preflight.probes.fingerprint import summary

    meta = fp.get("meta") or {}
    lines = [summary(fp), f"sha256      {fp['sha256']}", f"python      {meta.get('executable')}"]
    lines += [f"  {name:<24} {version}" for name, version in fp["packages"].items()]
    lines += [f"  sha256 of {path}: {value}" for path, value in fp["hashes"].items()]
    lines += [f"note: {e}" for e in meta.get("errors") or ()]
    # Names, versions and paths come from the environment's own metadata: printable, one line each.
    return "\n".join(escape(line) for line in lines)


def run_fingerprint(args: argparse.Namespace) -> int:
    from preflight.checks.versions import fingerprint_of
    from preflight.core.result import ExitCode
    from preflight.probes.pyenv import PyEnvError

    ctx = build_context(args, {"python": args.python})
    try:
        fp = fingerprint_of(ctx)
    except PyEnvError as exc:
        print(f"preflight fingerprint: {escape(str(exc), 600)}", file=sys.stderr)
        return int(ExitCode.UNDECIDED if exc.kind == "timeout" else ExitCode.FAILED)
    if args.json:
        json.dump(fp, sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(_human(fp) + "\n")
    return int(ExitCode.OK)


def run_diff(args: argparse.Namespace) -> int:
    from preflight.core.result import ExitCode
    from preflight.probes.fingerprint import FingerprintError, diff, load

    try:
        a, b = load(args.a), load(args.b)
    except FingerprintError as exc:
        print(f"preflight diff: {escape(str(exc), 600)}", file=sys.stderr)
        return int(ExitCode.USAGE)
    diffs = diff(a, b)
    if args.json:
        json.dump({"a": args.a, "b": args.b, "same": not diffs,
                   "a_sha256": a.get("sha256"), "b_sha256": b.get("sha256"),
                   "differences": [d.to_json() for d in diffs]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif diffs:
        print(f"A = {escape(args.a)}\nB = {escape(args.b)}\n{len(diffs)} difference"
              f"{'s' if len(diffs) != 1 else ''}:")
        for d in diffs:
            print(f"  {escape(d.describe())}")
    else:
        print(f"same: {escape(args.a)} and {escape(args.b)} describe the same environment")
    return int(ExitCode.FAILED if diffs else ExitCode.OK)
