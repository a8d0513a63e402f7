"""The layers contract's one allowance: imports under ``if TYPE_CHECKING:`` are left out of the
graph (pyproject.toml), so the only such import that points up a layer is the Context naming the
probes' types. Anything else that hides an upward import that way fails here."""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
#: (importer, imported) type-only imports that point upward, and why they may.
ALLOWED = {
    ("preflight.core.context", "preflight.probes.gpu"),  # the Context serves GpuSnapshot
    ("preflight.core.context", "preflight.probes.net"),  # ... and NetSnapshot, IbSnapshot
}


def _layer_of() -> dict[str, int]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["id"] == "layers")["layers"]
    return {f"preflight.{name.strip()}": depth for depth, line in enumerate(layers)
            for name in line.replace(":", "|").split("|")}


def _package(module: str, known: dict[str, int]) -> str | None:
    parts = module.split(".")
    return next((".".join(parts[:n]) for n in range(len(parts), 0, -1)
                 if ".".join(parts[:n]) in known), None)


def test_only_the_contexts_probe_types_point_up_under_type_checking() -> None:
    layer = _layer_of()
    full = grimp.build_graph("preflight", exclude_type_checking_imports=False, cache_dir=None)
    run = grimp.build_graph("preflight", exclude_type_checking_imports=True, cache_dir=None)
    upward = set()
    for importer in full.modules:
        for imported in full.find_modules_directly_imported_by(importer):
            if imported in run.find_modules_directly_imported_by(importer):
                continue
            low, high = _package(importer, layer), _package(imported, layer)
            # a smaller depth is a higher layer
            if low and high and low != high and layer[high] < layer[low]:
                upward.add((importer, imported))
    assert upward == ALLOWED
