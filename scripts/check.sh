#!/usr/bin/env bash
# Set up cluster-preflight in .venv (first run only) and run `preflight check` on this node.
# Extra arguments go to `preflight check` (e.g. --json, --no-bandwidth, --expect-gpus 8).
# torch is not installed here: the bandwidth test runs under the node's training environment
# (--python PATH, or PREFLIGHT_PYTHON=PATH); without one it SKIPs, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# (pip's notes about this machine's extra indexes are noise: filtered, errors kept.)
[ -x .venv/bin/preflight ] ||
  .venv/bin/pip install -q --disable-pip-version-check -e . 2>&1 |
  { grep -v 'is ignored: it is neither a file nor a directory' || true; } >&2
exec .venv/bin/preflight check "$@"
