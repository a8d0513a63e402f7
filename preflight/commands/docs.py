"""``preflight docs [TOPIC]``: the documentation, from the installed package.

The wheel carries README.md and docs/*.md (copied at build time, setup.py); a source checkout
reads them where they are. Without a topic: the list of topics and their titles.

Exit codes: 0 printed, 2 an unknown topic (the topics are listed) or no documentation installed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from preflight.cli import Formatter, emit

#: Where the wheel puts the docs, inside the package.
PACKAGED = Path(__file__).resolve().parents[1] / "_docs"
#: A source checkout: the repository beside the package.
SOURCE = Path(__file__).resolve().parents[2]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "docs", formatter_class=Formatter,
        help="print the documentation: the list of topics, or one topic",
        description="Print the documentation that comes with this preflight (Markdown text): "
                    "without TOPIC, the topics and their titles. Examples: preflight docs "
                    "checks, preflight docs configuration, preflight docs site-checks, "
                    "preflight docs runbooks/PreflightCheckFailing.",
        epilog="exit codes: 0 printed, 2 unknown topic or no documentation installed")
    p.add_argument("topic", nargs="?", metavar="TOPIC",
                   help="a topic from the list (checks, configuration, ...; a .md suffix or a "
                        "docs/ prefix is accepted)")
    p.add_argument("--json", action="store_true",
                   help="print JSON: the topics with their titles, or {topic, text}")
    p.set_defaults(func=run)


def topics() -> dict[str, Path]:
    """Topic name -> file: ``readme``, ``checks``, ..., ``runbooks/<Alert>``."""
    if PACKAGED.is_dir():
        root, readme = PACKAGED, PACKAGED / "README.md"
    else:
        root, readme = SOURCE / "docs", SOURCE / "README.md"
    found = {"readme": readme} if readme.is_file() else {}
    for path in sorted(root.glob("*.md")) + sorted(root.glob("runbooks/*.md")):
        if path.name == "README.md" and path.parent == root:
            continue
        found[path.relative_to(root).with_suffix("").as_posix()] = path
    return found


def title(path: Path) -> str:
    """The first Markdown heading of ``path``, without the ``#``."""
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.startswith("#"):
                return line.lstrip("#").strip()
    return ""


def _normalise(topic: str) -> str:
    name = topic.strip().removeprefix("./").removeprefix("docs/").removesuffix(".md")
    return "readme" if name.lower() == "readme" else name


def run(args: argparse.Namespace) -> int:
    from preflight.core.result import ExitCode

    found = topics()
    if not found:
        print("preflight docs: no documentation is installed with this copy of preflight "
              "(a wheel built from the source tree carries it)", file=sys.stderr)
        return int(ExitCode.USAGE)
    if args.topic is None:
        rows = {name: title(path) for name, path in found.items()}
        width = max(len(n) for n in rows)
        emit(as_json=args.json, data=lambda: [{"topic": n, "title": t} for n, t in rows.items()],
             text=lambda: "\n".join(f"{n:<{width}}  {t}" for n, t in rows.items()))
        return int(ExitCode.OK)
    want = _normalise(args.topic)
    match = found.get(want) or next((p for n, p in found.items() if n.lower() == want.lower()),
                                    None)
    if match is None:
        print(f"preflight docs: no topic {args.topic!r}; topics: {', '.join(found)}",
              file=sys.stderr)
        return int(ExitCode.USAGE)
    text = match.read_text(encoding="utf-8")
    emit(as_json=args.json, data=lambda: {"topic": want, "text": text},
         text=lambda: text.rstrip("\n"))
    return int(ExitCode.OK)
