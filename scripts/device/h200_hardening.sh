#!/usr/bin/env bash
# Issue #11 on a real GPU node (1 or 2 H200): the daemon with real NVML keeps running its
# bandwidth test with the GPU-use query on its own thread; hostile configs by SIGHUP; an HTTP
# connection flood under a 200-fd limit; the prolog's fail-open cases; bounded CLI numbers.
# Everything goes into ONE tar: $OUT/hardening.tar (hardening.log + daemon-stderr.log). < 4 min.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d /tmp/preflight-hardening.XXXXXX)
LOG=$W/hardening.log
. scripts/device/lib.sh
PORT=$((20000 + RANDOM % 20000))
scrape() { python3 -c "import urllib.request,sys; print(urllib.request.urlopen('http://127.0.0.1:$PORT'+sys.argv[1], timeout=5).read().decode())" "$1"; }
metric() { scrape /metrics | grep -E "^$1( |\{)" | head -3; }

sec "host $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=index,name,driver_version --format=csv >>"$LOG" 2>&1

sec "serve under prlimit --nofile=200, interval 5 s, bandwidth every 8 s"
printf 'interval_s: 5\nbandwidth_interval_s: 8\n' >"$W/cfg.yaml"
prlimit --nofile=200:200 python3 -m preflight --log-level info serve --listen 127.0.0.1:$PORT \
  --config "$W/cfg.yaml" >"$W/daemon-stderr.log" 2>&1 &
SERVE=$!
sleep 25
metric preflight_runs_total >>"$LOG"
metric preflight_allreduce_last_run_timestamp_seconds >>"$LOG"
grep -E "bandwidth run:|bandwidth test deferred|NVML did not answer" "$W/daemon-stderr.log" | tail -3 >>"$LOG"

sec "SIGHUP with hostile configs: each must keep the old config (reload_success 0), one line"
hostile() {  # label, then a command that prints the file's bytes
  local label=$1; shift
  cp "$W/cfg.yaml" "$W/good.yaml"; "$@" >"$W/cfg.yaml"; kill -HUP $SERVE; sleep 2
  echo "-- $label: alive=$(kill -0 $SERVE 2>/dev/null && echo yes || echo NO) $(metric preflight_config_reload_success)" >>"$LOG"
  cp "$W/good.yaml" "$W/cfg.yaml"; kill -HUP $SERVE; sleep 1
}
hostile not-utf8 printf 'interval_s: 5\n# \xff\xfe\n'
hostile nested-10000 python3 -c "print('a: ' + '['*10000 + ']'*10000)"
hostile 5000-digits python3 -c "print('expect_gpus: ' + '9'*5000)"
hostile alias-bomb python3 -c "print('a: &a [1,1,1,1,1,1,1,1,1]'); [print(f'{c}: &{c} [' + ','.join([f'*{p}']*9) + ']') for p, c in zip('abcdefg', 'bcdefgh')]; print('watched_packages: [' + ','.join(['*h']*9) + ']')"
hostile inf-interval printf 'interval_s: .inf\n'
grep -c "config reload failed" "$W/daemon-stderr.log" | sed 's/^/reload failures logged: /' >>"$LOG"
grep -c Traceback "$W/daemon-stderr.log" | sed 's/^/tracebacks: /' >>"$LOG"

sec "300 idle HTTP connections held for 15 s (fd limit 200): no RunFailed"
python3 - "$PORT" >>"$LOG" 2>&1 <<'PY'
import socket, sys, time
socks, refused = [], 0
for _ in range(300):
    try:
        socks.append(socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2))
    except OSError:
        refused += 1
time.sleep(15)
print(f"opened {len(socks)}, refused {refused}")
for s in socks:
    s.close()
PY
sleep 2
echo "RunFailed lines: $(grep -c RunFailed "$W/daemon-stderr.log")" >>"$LOG"
echo "capped-connection warnings (at most one a minute): $(grep -c 'HTTP connections at once' "$W/daemon-stderr.log")" >>"$LOG"
metric preflight_node_healthy >>"$LOG"
kill -TERM $SERVE; wait $SERVE; echo "serve rc=$?" >>"$LOG"

sec "prolog fail-open (recording scontrol): all rc=0, no drain"
printf '#!/bin/sh\necho DRAIN "$@" >> %s\n' "$LOG" >"$W/scontrol"; chmod +x "$W/scontrol"
printf '\xff\xfe\n' >"$W/bad.yaml"
export SLURMD_NODENAME=h200
run "${P[@]}" prolog --scontrol "$W/scontrol" --config "$W/bad.yaml"
envrun PREFLIGHT_LOG_LEVEL=garbage "${P[@]}" prolog --scontrol "$W/scontrol"
envrun PREFLIGHT_CHECK_TIMEOUT_S=inf "${P[@]}" prolog --scontrol "$W/scontrol"
run "${P[@]}" prolog --scontrol "$W/scontrol" --root /nonexistent
run "${P[@]}" prolog --scontrol "$W/scontrol" --expect-gpus inf

sec "bounded CLI numbers and messages (expect rc=2, rc=2, rc=1 with MasterAddrInvalid, rc=3)"
run "${P[@]}" bench --nproc 100000
run "${P[@]}" check --timeout inf
envrun MASTER_ADDR=a..b MASTER_PORT=29500 RANK=1 WORLD_SIZE=2 "${P[@]}" check --only master_port
printf '$ check --only shm >&-\n' >>"$LOG"; "${P[@]}" check --only shm >&- 2>>"$LOG"; echo "rc=$?" >>"$LOG"
pgrep -fa -- "-m preflight .*serve|$PWD/preflight/bench/worker/start.py" >>"$LOG" || echo "no preflight process left" >>"$LOG"

tar -C "$W" -cf "$OUT/hardening.tar" hardening.log daemon-stderr.log
rm -rf "$W"
