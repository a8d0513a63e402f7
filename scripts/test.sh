#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh Debian machine, then run lint, types, the
# import contracts and tests. Idempotent: a second run reuses .venv and skips installed packages.
# Extra args go to pytest.
#
#   --fast   the edit loop: no installs once .venv exists, and pytest -m "not slow" (the
#            end-to-end suites left out: real bandwidth workers, namespaces, Slurm, the image
#            build, the CLI fuzzer; tests/conftest.py lists them). CI runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [ "${1:-}" = "--fast" ]; then
  fast=1
  shift
fi

# System tools the tests use for real: promtool and prometheus (Prometheus rules and metrics, a real
# server in tests/alerts), iproute2 (network namespaces), util-linux (unshare), systemd
# (systemd-analyze for the unit file), procps (pgrep).
if ! ((fast)); then
  need=()
  command -v promtool >/dev/null || need+=(prometheus)
  # amtool checks the Alertmanager example (deploy/alertmanager/); the service is not started.
  command -v amtool >/dev/null || need+=(prometheus-alertmanager)
  command -v ip >/dev/null || need+=(iproute2)
  command -v unshare >/dev/null || need+=(util-linux)
  command -v systemd-analyze >/dev/null || need+=(systemd)
  command -v pgrep >/dev/null || need+=(procps)
  # A real one-node Slurm for the prolog test (tests/slurm): daemons, clients, munge for auth.
  command -v slurmctld >/dev/null || need+=(slurmctld)
  command -v slurmd >/dev/null || need+=(slurmd)
  command -v sbatch >/dev/null || need+=(slurm-client)
  command -v munged >/dev/null || need+=(munge)
  # The image build (tests/image, scripts/image.sh): a Debian base by debootstrap, buildah to build
  # and run it without a daemon; the CA bundle is bind-mounted into the build for pip.
  command -v buildah >/dev/null || need+=(buildah)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  [ -f /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
  # The test Kubernetes API server's certificates (tests/kube).
  command -v openssl >/dev/null || need+=(openssl)
  if ((${#need[@]})); then
    if [ "$(id -u)" = 0 ]; then
      echo "test.sh: installing ${need[*]}" >&2
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${need[@]}" >/dev/null
    else
      echo "test.sh: not root, cannot install ${need[*]}; the tests that need them will skip" >&2
    fi
  fi
fi

PY=${PYTHON:-python3}
if ! ((fast)) || [ ! -x .venv/bin/lint-imports ]; then
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  # torch==2.13.0 pinned: the CPU build (gloo) is all the tests need; GPU nodes install their own.
  # (pip's notes about this machine's extra indexes are noise here: filtered, errors kept.)
  .venv/bin/pip install -q --disable-pip-version-check -e '.[test]' torch==2.13.0 2>&1 |
    { grep -v 'is ignored: it is neither a file nor a directory' || true; } >&2
fi

.venv/bin/ruff check preflight tests benchmarks scripts
.venv/bin/mypy
# The layers and independence contracts in pyproject.toml (docs/architecture.md).
.venv/bin/lint-imports --no-cache
if ((fast)); then
  .venv/bin/python -m pytest -q -m "not slow" "$@"
else
  .venv/bin/python -m pytest -q "$@"
fi
