#!/usr/bin/env bash
# The Kubernetes pieces' view of a real GPU node, as the image's non-root user 65532 (Dockerfile
# USER, chart runAsUser): can NVML be read without root (the DaemonSet requests no GPU and runs
# non-root), does the init container's exact command pass, does the DaemonSet's command (its
# args and the chart's default config) serve metrics from real NVML. No container runtime here:
# the host's driver stands in for what the NVIDIA toolkit mounts into a container.
# Writes one tar: $OUT/k8s_user.tar (k8s_user.log, daemon-stderr.log). Takes about 40 s.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/pf-k8s-XXXXXX)
LOG=$WORK/k8s_user.log
. scripts/device/lib.sh
# a copy of the tree and of the carried wheel that user 65532 can read
cp -r preflight "$WORK/src-preflight" && mkdir -p "$WORK/src" && mv "$WORK/src-preflight" "$WORK/src/preflight"
cp -r /tmp/site "$WORK/site"
chmod -R a+rX "$WORK"
AS=(setpriv --reuid=65532 --regid=65532 --clear-groups env PYTHONPATH="$WORK/src:$WORK/site"
    HOME=/tmp NCCL_NVLS_ENABLE=0)

sec "device nodes and who may open them $(date -u +%FT%TZ)"
ls -l /dev/nvidia* >>"$LOG" 2>&1
run "${AS[@]}" id

sec "init container: preflight check --no-bandwidth --expect-gpus N (N = the GPUs here), as 65532"
N=$(nvidia-smi -L | grep -c '^GPU')
run timeout 60 "${AS[@]}" python3 -m preflight check --no-bandwidth --expect-gpus "$N"

sec "the same as root, for comparison"
run timeout 60 python3 -m preflight check --no-bandwidth --expect-gpus "$N" --only gpu_visible,cuda_devices,shm

sec "DaemonSet: serve with the chart's default config and --root /, as 65532"
printf 'interval_s: 60\nbandwidth_interval_s: 3600\n' >"$WORK/preflight.yaml"; chmod a+r "$WORK/preflight.yaml"
timeout 60 "${AS[@]}" python3 -m preflight serve --listen 127.0.0.1:9858 \
  --config "$WORK/preflight.yaml" --root / >"$WORK/daemon-stderr.log" 2>&1 &
SERVE=$!
sleep 15
python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9858/metrics', timeout=5).read().decode())" \
  | grep -E '^preflight_(gpu_visible|node_healthy|runs_total|shm_size|check_status\{check="(gpu_visible|shm|allreduce)",status="(pass|skip|fail|error)")' >>"$LOG" 2>&1
python3 -c "import json,urllib.request; d=json.load(urllib.request.urlopen('http://127.0.0.1:9858/report', timeout=5)); print(d['status'], [(r['check'], r['status'], r['reason']) for r in d['results']])" >>"$LOG" 2>&1
kill -TERM $SERVE; wait $SERVE; echo "serve rc=$?" >>"$LOG"
pgrep -u 65532 -fa preflight >>"$LOG" || echo "no process of user 65532 left" >>"$LOG"

tar -C "$WORK" -cf "$OUT/k8s_user.tar" k8s_user.log daemon-stderr.log
rm -rf "$WORK"
