#!/usr/bin/env bash
# The xid and fabric checks for real on a GPU machine (issue 17), in one call of under 2 minutes.
# Usage there, from the repo root:  bash scripts/device/xid_fabric.sh
# Everything lands in ONE tar: $OUT/xid_fabric.tar.gz (xid_fabric.log, check JSON, /metrics text).
# What to look for: xid PASS NoXid (or the node's real Xids, classed), read from /dev/kmsg in well
# under a second; fabric SKIP NoRdmaPorts (no InfiniBand on the H200 machines); the NVML Xid event
# watcher "watching" with every GPU registered; preflight_xid_events_watching 1 on /metrics.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d /tmp/xid_fabric.XXXXXX)
LOG=$W/xid_fabric.log
if compgen -G ".whl/*.whl" >/dev/null; then
  . scripts/device/lib.sh
else  # lib.sh's set-up without the netifaces wheel (neither check needs netifaces)
  export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
  P=(python3 -m preflight)
  sec() { printf '\n######## %s\n' "$*" >>"$LOG"; }
  run() { printf '$ %s\n' "$*" >>"$LOG"; "$@" >>"$LOG" 2>&1; echo "rc=$?" >>"$LOG"; }
fi
finish() { tar -czf "$OUT/xid_fabric.tar.gz" -C "$W" . && rm -rf "$W"; }
trap finish EXIT

sec "machine $(date -u +%FT%TZ)"
run uname -r
run id -u
run nvidia-smi -L
run nvidia-smi --query-gpu=index,pci.bus_id,driver_version --format=csv
run sysctl kernel.dmesg_restrict
run ls -la /dev/kmsg /sys/class/infiniband
run timeout 10 journalctl -k -b 0 -o short-monotonic --no-pager -q -n 3

sec "xid and fabric: table, then JSON (timed)"
run timeout 60 "${P[@]}" check --only xid,fabric
s=$EPOCHREALTIME
timeout 60 "${P[@]}" check --only xid,fabric --json >"$W/check-xid-fabric.json" 2>>"$LOG"
echo "rc=$? wall_s=$(awk -v a="$s" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.3f", b-a}')" >>"$LOG"
: >"$W/empty.yaml"  # an empty config: config files must be regular files (docs/configuration.md)
run timeout 60 "${P[@]}" check --only xid --json --config "$W/empty.yaml" --log-level debug

sec "the kernel log as the reader sees it: records, NVRM lines, Xids (classed)"
run timeout 30 python3 - <<'PY'
import time
from pathlib import Path
from preflight.probes.kernlog import parse_kmsg, parse_journal, xids
from preflight.probes.kmsg import read_kernel_log, read_journal, uptime_s
t = time.monotonic(); log = read_kernel_log(Path("/"), deadline_s=5.0); took = time.monotonic() - t
lines = list(parse_kmsg(log.text) if log.form == "kmsg" else parse_journal(log.text))
print(f"source={log.source} form={log.form} bytes={len(log.text)} records={len(lines)} "
      f"truncated={log.truncated} read_s={took:.4f} tried={log.tried} uptime_s={uptime_s(Path('/'))}")
print("first record uptime_s:", next((l.uptime_s for l in lines if l.uptime_s is not None), None))
for l in lines:
    if "NVRM" in l.text:
        print("NVRM:", l.uptime_s, l.text[:200])
for x in xids(lines):
    print("XID:", x.bus_id, x.code, x.info.cls.value, x.info.what, "|", x.detail[:120])
try:
    j = read_journal(Path("/"), deadline_s=10.0)
    print(f"journalctl -k fallback: {len(j)} bytes, xids={len(xids(parse_journal(j)))}")
except Exception as exc:
    print("journalctl -k fallback unavailable:", exc)
PY

sec "the daemon's NVML Xid event watcher, 5 s"
run timeout 40 python3 - <<'PY'
import time
from preflight.probes.xid_events import NvmlXidEvents, XidWatcher, kernel_log_catch_up
from pathlib import Path
src = NvmlXidEvents()
w = XidWatcher(src, catch_up=kernel_log_catch_up(Path("/")), wait_s=0.5, open_timeout_s=20)
t = time.monotonic(); w.start()
while not w.watching and time.monotonic() - t < 20 and not w.status().startswith("no NVML"):
    time.sleep(0.05)
print(f"status after {time.monotonic() - t:.3f} s: {w.status()}; gpus by bus: {src.gpus}")
time.sleep(5)
print("counts:", w.counts(), "watching:", w.watching)
t = time.monotonic(); w.stop(timeout_s=2.0); print(f"stopped in {time.monotonic() - t:.3f} s")
PY

sec "speed"
run timeout 60 python3 benchmarks/xid_fabric_speed.py --samples 10

sec "preflight serve for 12 s: /metrics"
PORT=$((20000 + RANDOM % 20000))
timeout -s TERM 14 "${P[@]}" serve --listen "127.0.0.1:$PORT" --interval 5 >>"$LOG" 2>&1 &
srv=$!
sleep 11
python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics', timeout=5).read().decode())" >"$W/metrics.txt" 2>>"$LOG"
echo "metrics rc=$?" >>"$LOG"
grep -E '^preflight_(xid|ib_port)|check_status\{check="(xid|fabric)".*\} 1' "$W/metrics.txt" >>"$LOG"
wait $srv; echo "serve rc=$? (124 = stopped by timeout's SIGTERM)" >>"$LOG"
run nvidia-smi --query-compute-apps=pid,used_memory --format=csv
