#!/usr/bin/env bash
# Issue #10 (+ #11 point 3, #14 point 2) on a real H200 node, in one call: the verdict of a healthy
# node with skipped checks is PASS (footer, JSON, exit code); every result carries its scope; the
# prolog drains for a node fault and never for a job's own setting; the new memlock check.
# Usage there, from the repo root, with the netifaces-plus wheel carried in .whl/:
#   bash scripts/device/t10_scope.sh      (everything in $OUT/t10-scope.tar.gz; < 1 min)
# What to look for in runs.log:
#   - "check --no-bandwidth" footer "<host>: PASS (N pass, M skip)" and rc=0; check-*.json "status":
#     "pass" and a "scope" on every result;
#   - on 2 GPUs the full check (all-reduce included) still ends PASS, rc=0;
#   - prolog with CUDA_VISIBLE_DEVICES=0,0: rc=0, a "(scope job)" line, scontrol-calls.txt empty;
#   - prolog with --root at an empty tree (no /dev/shm: a node fault): rc=1, scontrol-calls.txt
#     holds "reason=preflight: shm ShmMissing";
#   - memlock: SKIP NoRdma on a node without RDMA ports (or the limit, if it has some).
set -u
OUT=${OUT:-/tmp/out}; W=$(mktemp -d /tmp/t10-XXXXXX); LOG=$W/runs.log
. scripts/device/lib.sh

sec "machine $(date -u +%FT%TZ)"
run nvidia-smi -L
run bash -c 'ulimit -l; ls /sys/class/infiniband 2>&1'

sec "a healthy node with skipped checks is PASS"
run "${P[@]}" check --no-bandwidth
"${P[@]}" check --json --no-bandwidth >"$W/check-no-bandwidth.json" 2>>"$LOG"; echo "rc=$?" >>"$LOG"
run timeout 180 "${P[@]}" check
"${P[@]}" check --json --only launcher_env,master_port >"$W/check-nothing-applies.json" 2>>"$LOG"
echo "rc=$? (expected 0, status skip)" >>"$LOG"

sec "scope: a job's own setting fails check (rc 1) with scope job"
CVD_BAD=0,0
envrun CUDA_VISIBLE_DEVICES=$CVD_BAD "${P[@]}" check --only gpu_visible,cuda_devices --no-bandwidth
CUDA_VISIBLE_DEVICES=$CVD_BAD "${P[@]}" check --json --only gpu_visible,cuda_devices \
  >"$W/check-job-fault.json" 2>>"$LOG"; echo "rc=$?" >>"$LOG"

sec "prolog: a job fault never drains, a node fault does (scontrol is a recording stand-in)"
printf '#!/bin/sh\nfor a in "$@"; do printf "%%s\\n" "$a"; done >> %s\necho --- >> %s\n' \
  "$W/scontrol-calls.txt" "$W/scontrol-calls.txt" >"$W/scontrol"; chmod +x "$W/scontrol"
: >"$W/scontrol-calls.txt"
envrun SLURMD_NODENAME=t10node CUDA_VISIBLE_DEVICES=$CVD_BAD "${P[@]}" prolog --scontrol "$W/scontrol"
echo "calls after the job fault: $(wc -l <"$W/scontrol-calls.txt")" >>"$LOG"
mkdir -p "$W/emptyroot/sys"
envrun SLURMD_NODENAME=t10node "${P[@]}" prolog --scontrol "$W/scontrol" --root "$W/emptyroot"
run cat "$W/scontrol-calls.txt"

sec "memlock"
run "${P[@]}" check --only memlock
run bash -c "ulimit -l 64; ${P[*]} check --only memlock --json"

run nvidia-smi --query-compute-apps=pid,used_memory --format=csv
tar -C "$W" -czf "$OUT/t10-scope.tar.gz" . && rm -rf "$W"
