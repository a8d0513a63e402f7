#!/usr/bin/env bash
# The daemon and the prolog on a real GPU node (one H200): NVML metrics, the bandwidth run
# deferred while a real CUDA job holds the GPU, SIGTERM, and `preflight prolog`. Writes $OUT/serve.log.
set -u
LOG=${OUT:-/tmp/out}/serve.log
. scripts/device/lib.sh
scrape() { python3 -c "import urllib.request,sys; print(urllib.request.urlopen('http://127.0.0.1:9857'+sys.argv[1], timeout=5).read().decode())" "$1"; }

sec "serve $(date -u +%FT%TZ)"
python3 -m preflight --log-level info serve --listen 127.0.0.1:9857 --interval 5 \
  --bandwidth-interval 8 >"$OUT/daemon-stderr.log" 2>&1 &
SERVE=$!
sleep 12
sec "metrics after the first runs"
scrape /metrics | grep -E '^preflight_(gpu_|allreduce_|node_healthy|last_run|shm_|check_status\{check="(gpu_visible|allreduce)",status="(pass|skip)")|fingerprint_info|build_info)' >>"$LOG"
scrape /healthz >>"$LOG" 2>&1
scrape /report | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['mode'], d['status'], [(r['check'], r['status']) for r in d['results']])" >>"$LOG"
echo "torch libraries mapped into the daemon: $(grep -c -e libtorch -e site-packages/torch/ /proc/$SERVE/maps)" >>"$LOG"
sec "a real CUDA job holds the GPU: the bandwidth run must be deferred"
python3 -c "import torch,time; x=torch.ones(1,device='cuda'); time.sleep(25)" & JOB=$!
sleep 20
nvidia-smi --query-compute-apps=pid,used_memory --format=csv >>"$LOG"
grep "bandwidth test deferred" "$OUT/daemon-stderr.log" | tail -2 >>"$LOG"
wait $JOB
sec "SIGTERM"
t0=$(date +%s.%N); kill -TERM $SERVE; wait $SERVE; rc=$?; t1=$(date +%s.%N)
echo "rc=$rc after $(python3 -c "print(round($t1-$t0,2))") s" >>"$LOG"
pgrep -fa 'preflight --log-level info serve|bench/worker/start.py' >>"$LOG" || echo "no preflight process left" >>"$LOG"
sec "prolog (recording scontrol)"
printf '#!/bin/sh\necho scontrol "$@" >> %s\n' "$LOG" >/tmp/scontrol; chmod +x /tmp/scontrol
SLURMD_NODENAME=h200 python3 -m preflight prolog --scontrol /tmp/scontrol >>"$LOG" 2>&1; echo "prolog rc=$?" >>"$LOG"
SLURMD_NODENAME=h200 python3 -m preflight prolog --scontrol /tmp/scontrol --expect-gpus 2 >>"$LOG" 2>&1; echo "prolog rc=$?" >>"$LOG"
sec "daemon log"
tail -n 30 "$OUT/daemon-stderr.log" >>"$LOG"
