#!/usr/bin/env bash
# The GPU probe's deadline from measurement: how long nvmlInit and the first NVML queries take in
# a fresh process, cold (no NVML client on the node, so without persistence mode the driver
# initialises the GPUs again) and warm (another process holds NVML open), and the whole Slurm
# prolog on the real NVML. Also each GPU's idle memory in use (for the epilog's threshold).
# Changes no GPU setting: persistence mode is recorded, never switched.
# Usage there, from the repo root, with the netifaces-plus wheel carried in .whl/:
#   bash scripts/device/nvml_init_timing.sh     -> $OUT/nvml_init_timing.tar.gz (runs.log, *.jsonl)
# Under 3 minutes on one H200; run it on nvidia-h200-x8 too when lent (how init grows with GPUs).
set -u
FINAL=${OUT:-/tmp/out}; mkdir -p "$FINAL"
OUT=$(mktemp -d /tmp/nvml_init.XXXXXX); LOG=$OUT/runs.log
. scripts/device/lib.sh
PY=scripts/device/nvml_init_timing.py

sec "machine $(date -u +%FT%TZ)"
run nvidia-smi -L
run nvidia-smi --query-gpu=index,name,driver_version,persistence_mode,pstate,memory.used,memory.total --format=csv
run sh -c 'ps -eo pid,comm | grep -E "nvidia-persiste|nv-hostengine|dcgm" || echo "no persistence daemon, no DCGM"'
run sh -c 'python3 -c "import pynvml; print(\"nvidia-ml-py\", getattr(pynvml, \"__version__\", \"?\"))"'

# fresh N TAG GAP: N fresh processes, GAP seconds apart (a gap lets a driver without persistence
# mode deinitialise the GPUs after the last client closed them).
fresh() { local n=$1 tag=$2 gap=$3 i
  for i in $(seq 1 "$n"); do
    sleep "$gap"
    t=$(date +%s.%N)
    python3 "$PY" first >>"$OUT/$tag.jsonl" 2>>"$LOG"
    echo "$tag run $i: process wall $(awk "BEGIN{print $(date +%s.%N) - $t}") s" >>"$LOG"
  done
}

sec "cold-ish: fresh processes, nothing else holding NVML (gaps 15 s, 0 s)"
fresh 3 cold-gap15 15
fresh 3 cold-gap0 0

sec "warm: a process holds NVML open meanwhile"
python3 "$PY" hold >"$OUT/hold.out" 2>&1 &
HOLD=$!
for _ in $(seq 1 50); do grep -q holding "$OUT/hold.out" && break; sleep 0.1; done
fresh 5 warm 0

sec "the prolog on the real NVML, warm (report-only: drains nothing; no Slurm needed)"
PRO=(prolog --report-only --scontrol /bin/true --sinfo /bin/true --skip network,master_port,versions)
for i in 1 2 3; do
  t=$(date +%s.%N)
  env PREFLIGHT_STATE_DIR="$OUT/state" "${P[@]}" "${PRO[@]}" --prom-file "$OUT/prolog.prom" >>"$LOG" 2>&1
  echo "prolog warm run $i: rc=$? wall $(awk "BEGIN{print $(date +%s.%N) - $t}") s" >>"$LOG"
done
kill "$HOLD" 2>/dev/null; wait "$HOLD" 2>/dev/null

sec "the prolog on the real NVML, nothing holding NVML (after a 15 s gap)"
for i in 1 2 3; do
  sleep 15
  t=$(date +%s.%N)
  env PREFLIGHT_STATE_DIR="$OUT/state" "${P[@]}" "${PRO[@]}" >>"$LOG" 2>&1
  echo "prolog cold-ish run $i: rc=$? wall $(awk "BEGIN{print $(date +%s.%N) - $t}") s" >>"$LOG"
done

sec "check --only gpu_visible --json (the deadline wrapper on real NVML)"
"${P[@]}" check --only gpu_visible --json >"$OUT/gpu_visible.json" 2>>"$LOG"; echo "rc=$?" >>"$LOG"

sec "idle GPU memory in use (epilog_idle_memory_max_bytes)"
python3 "$PY" memory >"$OUT/memory.json" 2>>"$LOG"; echo "rc=$?" >>"$LOG"
run cat "$OUT/memory.json"

sec "summary (seconds)"
python3 - "$OUT" >>"$LOG" 2>&1 <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for f in sorted(out.glob("*.jsonl")):
    rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    for key in ("import_s", "init_s", "count_s", "shutdown_s", "preflight_snapshot_s"):
        vals = [r[key] for r in rows if key in r]
        if vals:
            print(f"{f.stem:12} {key:22} min {min(vals):.3f} max {max(vals):.3f} (n={len(vals)})")
    first = [sum(v for k, v in g.items() if k.endswith("_s")) for r in rows for g in r["per_gpu"]]
    if first:
        print(f"{f.stem:12} {'first queries/GPU':22} min {min(first):.3f} max {max(first):.3f}")
    print(f"{f.stem:12} warm_evidence {[r.get('warm_evidence') for r in rows]}")
EOF
ps -eo pid,comm,args | grep -E "nvml_init_timing|preflight" | grep -v grep >>"$LOG" || echo "nothing left running" >>"$LOG"
tar -czf "$FINAL/nvml_init_timing.tar.gz" -C "$OUT" .
echo "wrote $FINAL/nvml_init_timing.tar.gz"
