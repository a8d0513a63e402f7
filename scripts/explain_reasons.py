"""Print the "## Reasons" section of docs/explain.md from the rules (the docs' last section).

    python scripts/explain_reasons.py --write    # rewrite that section in place
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from preflight.explain.rules import RULES

DOC = Path(__file__).parents[1] / "docs" / "explain.md"
HEADING = "## Reasons\n"
TIERS = {0: "cause", 1: "killed rank", 2: "wrapper", 3: "symptom"}


def section() -> str:
    """The section's text, one entry per rule in the order a line is tried."""
    out = ["## Reasons", ""]
    for rule in RULES:
        layers = [rule.layer.value] + [p.layer.value for p in rule.patterns if p.layer]
        out += [f"### `{rule.reason}`: {' / '.join(dict.fromkeys(layers))} "
                f"({TIERS[rule.tier]})", "", "```", rule.example, "```", ""]
        if rule.frames:
            names = ", ".join(f"`{f.function}`" for f in rule.frames)
            out += ["Also recognised from a traceback cut before its last line, by its frames: "
                    f"{names}.", ""]
        if rule.job_frames:
            out += ["Also: a traceback's last line that no pattern knows, a plain Python exception "
                    "raised in a frame of the job's own file (not installed code); or a "
                    "library's refusal of what the job passed it (`KeyError`, `ValueError`, "
                    "`TypeError`, `AssertionError`, `IndexError` raised in installed code under a "
                    "frame of the job's own file: the job's call is named; raised in torch's "
                    "layers or optimizers, `torch/nn/` and `torch/optim/`, which only the model "
                    "calls, with or without a frame of the job's file left). Decode errors of "
                    "the job's input (`JSONDecodeError`, `UnicodeDecodeError`, PyYAML's "
                    "`ScannerError`, `UnpicklingError`) count as `ValueError`; an import of a "
                    "part the installed package lacks (`No module named 'torch._six'`, "
                    "`cannot import name 'X' from 'pkg'`) raised in the job's file is the "
                    "job's code, a package that is not installed is not.", ""]
        out += [f"Fix: {rule.remedy}", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite docs/explain.md's section")
    args = parser.parse_args()
    if not args.write:
        sys.stdout.write(section())
        return 0
    text = DOC.read_text()
    DOC.write_text(text[:text.index(HEADING)] + section())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
