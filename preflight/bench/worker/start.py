"""The GPU worker's entry point, run as ``PYTHON .../worker/start.py --plan JSON ...``.

It loads its own directory as the package ``_preflight_worker`` and removes that directory from
``sys.path`` (where the interpreter put it), so the worker's module names can never shadow the
training environment's and nothing but this directory comes from preflight's installation.
"""

import importlib
import importlib.util
import os
import sys

PACKAGE = "_preflight_worker"


def _load_package() -> object:
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == here:
        del sys.path[0]
    spec = importlib.util.spec_from_file_location(
        PACKAGE, os.path.join(here, "__init__.py"), submodule_search_locations=[here])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the worker package from {here}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)
    return importlib.import_module(PACKAGE + ".main")


if __name__ == "__main__":
    sys.exit(_load_package().main())  # type: ignore[attr-defined]
