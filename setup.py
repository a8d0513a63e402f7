"""Build hook: the wheel carries the documentation for ``preflight docs`` (one source: docs/).

Everything else about the package is in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
#: What ``preflight docs`` can print: the README and docs/ (measurement logs of docs/device-runs
#: stay in the source tree).
DOC_GLOBS = ("README.md", "docs/*.md", "docs/runbooks/*.md")


class BuildWithDocs(build_py):
    """build_py, then copy the docs into the built package as ``preflight/_docs``."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "preflight" / "_docs"
        for pattern in DOC_GLOBS:
            for src in sorted(HERE.glob(pattern)):
                rel = src.relative_to(HERE / "docs") if src.parent != HERE else Path(src.name)
                dst = target / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)


setup(cmdclass={"build_py": BuildWithDocs})
