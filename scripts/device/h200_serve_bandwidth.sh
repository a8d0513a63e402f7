#!/usr/bin/env bash
# The daemon as the chart runs it with bandwidthTest.enabled (the torch-free engines: gpu_speed
# on cuda, the all-reduce on nccl4py; a private /dev/shm is not possible here, the node's is
# used), on the one H200, while its bandwidth runs (gpu_speed and the all-reduce plan) happen:
# the peak memory of the daemon and all its children, polled from /proc (scripts/device/
# tree_rss.py: summed Rss, Pss and RssAnon of the tree, each process's VmHWM, /dev/shm used).
# A cgroup memory limit cannot be set on that machine, so the peak is measured instead, for the
# chart's bandwidthTest.memoryBaseMi / memoryPerGpuMi.
# Run from the source tree (PYTHONPATH=$PWD), the netifaces-plus and engine wheels carried in
# .whl/ (lib.sh). Writes $OUT/serve-bandwidth/{summary.json,rss-*.json,metrics-*.txt,report-*.json,
# daemon-*.log,run.log} and $OUT/serve-bandwidth.tar.gz.
set -u
OUT=${OUT:-/tmp/out}
D=$OUT/serve-bandwidth
mkdir -p "$D"
LOG=$D/run.log
. scripts/device/lib.sh
PORT=${PORT:-9857}
RUN_S=${RUN_S:-75}
scrape() { python3 -c "import urllib.request,sys; print(urllib.request.urlopen('http://127.0.0.1:$PORT'+sys.argv[1], timeout=5).read().decode())" "$1"; }

sec "machine $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>"$LOG" 2>&1
python3 -c "import cuda.bindings, cuda.pathfinder, nccl; print('engines importable')" >>"$LOG" 2>&1
grep -E 'MemTotal|MemAvailable' /proc/meminfo >>"$LOG"
df -h /dev/shm >>"$LOG"

# The chart's config (ConfigMap) for the daemon, with intervals short enough for a few runs.
cat >"$D/preflight.yaml" <<'EOF'
interval_s: 10
bandwidth_interval_s: 25
EOF

one() {  # one daemon run: $1 = label, then engine settings as VAR=VALUE
  local label=$1; shift
  sec "serve with $label ($*) for $RUN_S s"
  env "$@" python3 -m preflight --log-level info serve --listen "127.0.0.1:$PORT" \
    --config "$D/preflight.yaml" --root / >"$D/daemon-$label.log" 2>&1 &
  local pid=$!
  python3 scripts/device/tree_rss.py "$pid" "$D/rss-$label.json" --every 0.05 &
  local sampler=$!
  sleep "$RUN_S"
  scrape /metrics >"$D/metrics-$label.txt" 2>>"$LOG"
  scrape /report >"$D/report-$label.json" 2>>"$LOG"
  grep -E '^preflight_(runs_total|allreduce_last_run|check_status\{check="(gpu_speed|allreduce)",status="(pass|fail|error|skip)"\} 1)' \
    "$D/metrics-$label.txt" >>"$LOG"
  kill -TERM "$pid"; wait "$pid"; echo "daemon rc=$?" >>"$LOG"
  wait "$sampler"
  grep -E 'bandwidth run|bandwidth test deferred' "$D/daemon-$label.log" | tail -5 >>"$LOG"
  pgrep -fa 'preflight.*(serve|worker)' | grep -v pgrep >>"$LOG" || echo "no daemon or worker left" >>"$LOG"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader >>"$LOG" 2>&1
}

# What the `nccl` image runs (no torch imported anywhere), then torch's engines for comparison.
one torch-free PREFLIGHT_GPU_SPEED_ENGINE=cuda PREFLIGHT_BENCH_ENGINE=nccl4py
one torch PREFLIGHT_GPU_SPEED_ENGINE=torch PREFLIGHT_BENCH_ENGINE=torch

sec "summary"
python3 - "$D" >"$D/summary.json" <<'EOF'
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
gpus = 1
out = {"gpus": gpus}
for label in ("torch-free", "torch"):
    try:
        rss = json.loads((d / f"rss-{label}.json").read_text())
        report = json.loads((d / f"report-{label}.json").read_text())
    except (OSError, ValueError) as exc:
        out[label] = {"error": str(exc)}
        continue
    results = {r["check"]: (r["status"], r["reason"]) for r in report["results"]}
    daemon_hwm = rss["by_role"].get("daemon", {}).get("max_vm_hwm_mib")
    out[label] = {
        "gpu_speed": results.get("gpu_speed"), "allreduce": results.get("allreduce"),
        "peak_tree_rss_mib": rss["peak_tree_rss_mib"], "peak_tree_pss_mib": rss["peak_tree_pss_mib"],
        "peak_tree_anon_mib": rss["peak_tree_anon_mib"],
        "peak_dev_shm_used_mib": rss["peak_dev_shm_used_mib"],
        "daemon_vm_hwm_mib": daemon_hwm, "by_role": rss["by_role"],
        # what the chart's limit must hold per GPU: the tree's peak beyond the daemon itself
        "per_gpu_estimate_mib": round((rss["peak_tree_pss_mib"] - (daemon_hwm or 0)) / gpus, 1),
    }
out["chart_limit_mib_for_1_gpu"] = 512 + 1 * 1024 + 1024
print(json.dumps(out, indent=1))
EOF
cat "$D/summary.json" >>"$LOG"
tar -C "$OUT" -czf "$OUT/serve-bandwidth.tar.gz" serve-bandwidth
echo "wrote $OUT/serve-bandwidth.tar.gz" >>"$LOG"
