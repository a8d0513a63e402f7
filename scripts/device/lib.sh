# Sourced by the scripts in scripts/device/: the set-up every GPU run shares.
# After it: $OUT exists, the carried netifaces-plus wheel is installed in /tmp/site, PYTHONPATH
# reaches the source tree, NVLink multicast is off, and sec/run/envrun append to "$LOG".
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "${WHL:-.whl}"/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site
P=(python3 -m preflight)
sec() { printf '\n######## %s\n' "$*" >>"$LOG"; }
run() { printf '$ %s\n' "$*" >>"$LOG"; "$@" >>"$LOG" 2>&1; echo "rc=$?" >>"$LOG"; }
envrun() { printf '$ %s\n' "$*" >>"$LOG"; env "$@" >>"$LOG" 2>&1; echo "rc=$?" >>"$LOG"; }
