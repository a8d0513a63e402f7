#!/usr/bin/env bash
# Device-only: a signal to `preflight check` while its GPU workers run leaves nothing on the node
# (core/aborting.py, the gpu_speed worker's PR_SET_PDEATHSIG). One H200 is enough: gpu_speed runs
# on every GPU; the all-reduce runs with one rank through scripts/device/check_one_rank.py.
# After each case: worker processes, GPU compute apps and memory, /dev/shm, TMPDIR.
# Output: $OUT/signals.tar.gz (signals.log + JSON).
set -u
source scripts/device/lib.sh
LOG=$OUT/signals.log; : >"$LOG"
export TMPDIR=/tmp/pf-signals; rm -rf "$TMPDIR"; mkdir -p "$TMPDIR"
# NVML's bus id as preflight writes it (0000:00:06.0): the last 12 characters, lower case.
BUS=$(python3 -c "import sys; b=sys.argv[1].lower(); print(b[-12:])" "$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1)")

left() {
  local w; w=$(pgrep -f 'bench/worker/start.py' | tr '\n' ' ')
  printf 'left: workers [%s] compute-apps [%s] mem-used %s MiB shm [%s] tmp [%s]\n' "$w" \
    "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | tr '\n' ' ')" \
    "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | tr '\n' ' ')" \
    "$(ls /dev/shm | tr '\n' ' ')" "$(ls "$TMPDIR" | tr '\n' ' ')" >>"$LOG"
}

# $1 label, $2 signal, $3 what to wait for (pgrep pattern), $4 extra sleep, rest: command
case_() {
  local label=$1 sig=$2 pat=$3 extra=$4; shift 4
  sec "$label: $* ; $sig once '$pat' runs (+${extra} s)"
  local t0; t0=$(date +%s.%N)
  "$@" >"$OUT/$label.json" 2>>"$LOG" &
  local pid=$!
  for _ in $(seq 600); do pgrep -f "$pat" >/dev/null && break; sleep 0.02; done
  sleep "$extra"
  echo "workers at the signal: $(pgrep -f "$pat" | tr '\n' ' ') states: $(for p in $(pgrep -f "$pat"); do awk '{print $3}' /proc/$p/stat; done | tr '\n' ' ')" >>"$LOG"
  kill -s "$sig" "$pid"
  wait "$pid"; echo "rc=$? after $(python3 -c "import sys,time; print(round(time.time()-float(sys.argv[1]),2))" "$t0") s" >>"$LOG"
  sleep 1; left
}

sec "machine $(date -u +%FT%TZ)"
run nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.used --format=csv
echo "bus $BUS" >>"$LOG"; left

sec "baseline: the whole check (gpu_speed on the cuda engine; the all-reduce SKIPs with one GPU)"
for i in 1 2; do
  t0=$(date +%s.%N); "${P[@]}" check --json >"$OUT/check-$i.json" 2>>"$LOG"; rc=$?
  echo "check run $i rc=$rc wall $(python3 -c "import sys,time; print(round(time.time()-float(sys.argv[1]),3))" "$t0") s" >>"$LOG"
done
python3 - "$OUT/check-2.json" >>"$LOG" 2>&1 <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("status", d["status"], [(r["check"], r["status"], r.get("reason")) for r in d["results"]
                              if r["check"] in ("allreduce", "gpu_speed")])
EOF
left

# gpu_speed: the worker stops itself entering d2d (a worker hung in the driver looks the same).
for sig in TERM INT HUP; do
  case_ "speed-stopped-$sig" "$sig" 'bench/worker/start.py' 1.5 \
    env PREFLIGHT_GPUSPEED_TEST_STALL="$BUS:d2d" "${P[@]}" check --only gpu_speed --json
done
case_ "speed-stopped-KILL" KILL 'bench/worker/start.py' 1.5 \
  env PREFLIGHT_GPUSPEED_TEST_STALL="$BUS:d2d" "${P[@]}" check --only gpu_speed --json
rm -rf "${TMPDIR:?}"/preflight-*  # SIGKILL leaves the directory (documented); the next case starts clean
# SIGTERM the moment a worker shows in ps: it may still be inside Popen (core/aborting.starting).
for i in 1 2 3; do
  case_ "speed-starting-TERM-$i" TERM 'bench/worker/start.py' 0 "${P[@]}" check --only gpu_speed --json
done
# gpu_speed live: SIGTERM while it initialises the context / measures.
case_ "speed-live-TERM" TERM 'bench/worker/start.py' 0.4 "${P[@]}" check --only gpu_speed --json
# The all-reduce (nccl4py, one rank) in the check's thread: SIGTERM during import / NCCL init.
for extra in 0.3 0.8; do
  case_ "allreduce-TERM-$extra" TERM 'bench/worker/start.py' "$extra" \
    python3 scripts/device/check_one_rank.py check --only allreduce --json
done
sec "after all"; left
tar -czf "$OUT/signals.tar.gz" -C "$OUT" signals.log $(cd "$OUT" && ls *.json)
