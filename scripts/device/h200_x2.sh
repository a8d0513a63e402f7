#!/usr/bin/env bash
# Issue 14 on two NVLinked H200 GPUs (kind nvidia-h200-x2), in one call: the bench with each
# engine beside the plain torch loop (nccl-tests' figures are in docs/benchmarks.md), phase times,
# time to a verdict of `preflight check` (3 runs per engine), the first all-reduce after
# allocation, a SIGSTOPped rank 1 in each phase (stopped on the parent's progress, not a clock),
# and what is left afterwards. Writes $OUT/x2.log and JSON files; tar them to bring them back.
# WHL: the folder of the carried wheels (nccl4py, cuda-core, cuda-bindings, cuda-pathfinder,
# netifaces-plus), default .whl.
set -u
LOG=${OUT:-/tmp/out}/x2.log
. scripts/device/lib.sh

sec "machine $(date -u +%FT%TZ)"
run nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total --format=csv
run nvidia-smi topo -m
run python3 -c "import torch, nccl.core as n, cuda.core as c; print('torch', torch.__version__, 'torch nccl', torch.cuda.nccl.version()); print('nccl4py', n.__version__, 'cuda.core', c.__version__); print(n.get_version())"

sec "1. side by side: the full sweep 1 MiB..4 GiB, nccl4py engine, torch engine, the plain loop"
for e in nccl4py torch; do
  t0=$(date +%s.%N)
  "${P[@]}" bench --engine "$e" --max-bytes 4G --json >"$OUT/bench-$e.json" 2>>"$LOG"
  echo "bench --engine $e rc=$? wall $(python3 -c "print(round($(date +%s.%N)-$t0,2))") s" >>"$LOG"
  run "${P[@]}" bench --engine "$e" --max-bytes 4G
done
run python3 benchmarks/plain_allreduce.py --max-bytes 4G

sec "2. time to verdict: preflight check (the 2-GPU all-reduce included), 3 runs per engine"
for e in auto torch; do
  for i in 1 2 3; do
    t0=$(date +%s.%N)
    PREFLIGHT_BENCH_ENGINE=$e "${P[@]}" check --json >"$OUT/check-$e-$i.json" 2>>"$LOG"; rc=$?
    echo "check engine=$e run $i rc=$rc wall $(python3 -c "print(round($(date +%s.%N)-$t0,2))") s" >>"$LOG"
  done
done
run "${P[@]}" check
for i in 1 2 3; do
  t0=$(date +%s.%N)
  "${P[@]}" bench --min-bytes 1G --max-bytes 1G --json >"$OUT/bench1g-$i.json" 2>>"$LOG"; rc=$?
  echo "bench 1 GiB only (auto engine) run $i rc=$rc wall $(python3 -c "print(round($(date +%s.%N)-$t0,2))") s" >>"$LOG"
done

sec "3. the first all-reduce of 1 GiB after allocation: allocator x NCCL setting"
for a in device nccl; do
  for v in "" NCCL_RUNTIME_CONNECT=0 NCCL_LOCAL_REGISTER=0 CUDA_MODULE_LOADING=EAGER; do
    python3 scripts/device/bench_probe.py first "$a" $v >>"$OUT/first.jsonl" 2>>"$LOG"
  done
done
run cat "$OUT/first.jsonl"

sec "4. SIGSTOP rank 1 in each phase, on the parent's progress; verdict time from the stop"
for e in nccl4py torch; do
  for ph in spawn init "warm-up of 1 GiB" "measure of 4 GiB"; do
    python3 scripts/device/bench_probe.py stall "$ph" "$e" >>"$OUT/stall.jsonl" 2>>"$LOG"
  done
done
run cat "$OUT/stall.jsonl"
run pgrep -fa 'bench/worker/start.py'
run nvidia-smi --query-compute-apps=pid,used_memory --format=csv
run ls -d /tmp/preflight-bench-*
