#!/usr/bin/env bash
# The runs of issue 7 on two NVLinked H200 GPUs (kind nvidia-h200-x2), in one call:
# side-by-side bandwidth, time to verdict (median of 3), a SIGSTOPped NCCL rank, the two-GPU
# verdicts of the node checks. Writes $OUT/x2.log and JSON files. Not yet run: the kind was not
# lent in the session that wrote it (2026-11-29).
set -u
LOG=${OUT:-/tmp/out}/x2.log
. scripts/device/lib.sh

sec "machine $(date -u +%FT%TZ)"
run nvidia-smi topo -m
run nvidia-smi nvlink -s

sec "1. side by side: preflight bench, then the plain loop, same sizes"
"${P[@]}" bench --json >"$OUT/bench.json" 2>>"$LOG"; echo "rc=$?" >>"$LOG"
run "${P[@]}" bench
run python3 benchmarks/plain_allreduce.py
run python3 -c "import json; d=json.load(open('$OUT/bench.json')); print('busbw', d['busbw_gbps'], 'link efficiency', d['link_efficiency'], d['link_basis'])"

sec "2. time to verdict: preflight check (bandwidth included), 3 runs"
for i in 1 2 3; do
  t0=$(date +%s.%N); "${P[@]}" check --json >"$OUT/check-$i.json" 2>>"$LOG"; rc=$?
  echo "run $i rc=$rc wall $(python3 -c "print(round($(date +%s.%N)-$t0,2))") s" >>"$LOG"
done
run "${P[@]}" check

sec "3. SIGSTOP rank 1 during the measurement"
"${P[@]}" bench --timeout 60 --json >"$OUT/stall.json" 2>>"$LOG" &
bg=$!
for _ in $(seq 1 300); do
  w=$(pgrep -f 'bench/worker.py --rank 1' | head -1)
  [ -n "$w" ] && grep -q nvidia /proc/"$w"/maps 2>/dev/null && break; sleep 0.1
done
sleep 6; echo "SIGSTOP rank 1 pid $w at $(date +%T)" >>"$LOG"; kill -STOP "$w"
wait $bg; echo "bench rc=$? at $(date +%T)" >>"$LOG"
run python3 -c "import json; d=json.load(open('$OUT/stall.json')); print(d['status'], d['reason'], d['message'])"
run pgrep -fa 'bench/worker.py'
run nvidia-smi --query-compute-apps=pid,used_memory --format=csv

sec "4. two-GPU verdicts of the node checks"
U1=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | sed -n 2p); PFX1=${U1:0:12}
for v in "" 1,0 "$PFX1" 0,1,0; do
  if [ -z "$v" ]; then run "${P[@]}" check --json --no-bandwidth; else
    envrun CUDA_VISIBLE_DEVICES="$v" "${P[@]}" check --only gpu_visible,cuda_devices --no-bandwidth; fi
done
envrun LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 "${P[@]}" check --json --no-bandwidth --only cuda_devices,launcher_env
