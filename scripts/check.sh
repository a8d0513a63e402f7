#!/usr/bin/env bash
# Set up cluster-preflight in .venv (first run only) and run `preflight check` on this node.
# Extra arguments go to `preflight check` (e.g. --json, --no-bandwidth, --expect-gpus 8).
# torch is not installed here: the bandwidth test uses the torch of the node's training
# environment (--python / PREFLIGHT_PYTHON) or `pip install .venv torch` yourself.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -c 'import preflight' 2>/dev/null ||
  .venv/bin/pip install -q --disable-pip-version-check -e .
exec .venv/bin/preflight check "$@"
