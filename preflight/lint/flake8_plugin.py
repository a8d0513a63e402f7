"""The ``DDP`` rules as a flake8 plugin (entry point ``flake8.extension``: ``DDP``).

flake8 hands over the parsed tree; ``# noqa`` is flake8's own business here, and it imports
nothing from flake8, so this module loads without it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from preflight import __version__
from preflight.lint import analyse


class Plugin:
    """flake8 calls ``Plugin(tree).run()`` and gets (line, column, "DDP1xx message", type)."""

    name = "preflight-lint"
    version = __version__

    def __init__(self, tree: ast.AST) -> None:
        self._tree = tree

    def run(self) -> Iterator[tuple[int, int, str, type[Plugin]]]:
        if not isinstance(self._tree, ast.Module):
            return
        try:
            findings = analyse(self._tree)
        except RecursionError:
            return
        for f in findings:
            yield f.line, f.col - 1, f"{f.rule} {f.message}", type(self)


__all__ = ["Plugin"]
