#!/usr/bin/env bash
# Issue 14's time to a verdict on two NVLinked H200s (kind nvidia-h200-x2), after the second
# session's changes: `preflight check` with the 2-GPU all-reduce (--skip gpu_speed, as measured
# before, and whole) x5 each, the sweep beside nccl-tests' figures, a wrong sum on rank 1, a
# SIGSTOPped rank 1 in each phase, a --python venv without nccl4py, the torch engine, and what
# is left afterwards (processes, GPU memory, /dev/shm). Writes $OUT/x2v.log and JSON files.
set -u
STEPS=${STEPS:-check,sweep,stall,venv,torch}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
LOG=${OUT:-/tmp/out}/x2v.log
. scripts/device/lib.sh
wall() { python3 -c "print(round($(date +%s.%N)-$1,3))"; }
sec "machine $(date -u +%FT%TZ)"
run nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total --format=csv
run ls -la /dev/shm

if has check; then
sec "1. preflight check --skip gpu_speed x5, then the whole check x5 (wall, process start included)"
for s in "--skip gpu_speed" ""; do for i in 1 2 3 4 5; do
  n=$([ -z "$s" ] && echo whole || echo skip)
  t0=$(date +%s.%N); "${P[@]}" check --json $s >"$OUT/check-$n-$i.json" 2>>"$LOG"; rc=$?
  echo "check $n run $i rc=$rc wall $(wall $t0) s" >>"$LOG"
  python3 -c "import json; r=json.load(open('$OUT/check-$n-$i.json')); b=r['bandwidth'] or {}; print('  ', r['status'], [(x['check'], x['status'], round(x.get('duration_s') or 0,3)) for x in r['results'] if x['check'] in ('allreduce','gpu_speed')], 'busbw', b.get('busbw_gbps'), 'phases', b.get('phase_times_s'), 'shm', b.get('shm_removed'), 'lib', b.get('libnccl'))" >>"$LOG" 2>&1
done; done
fi

if has sweep; then
sec "2. the sweep 1 MiB..4 GiB (nccl4py) and a wrong sum on rank 1"
t0=$(date +%s.%N); "${P[@]}" bench --max-bytes 4G --json >"$OUT/bench.json" 2>>"$LOG"; echo "bench rc=$? wall $(wall $t0) s" >>"$LOG"
python3 -c "import json; r=json.load(open('$OUT/bench.json')); print(r['status'], r['engine'], r.get('link_efficiency')); [print('  ', x['size_bytes'], round(x['time_s']*1e6,1), x['busbw_gbps'], x['correct']) for x in r['rows']]" >>"$LOG" 2>&1
# (the CLI reads PREFLIGHT_* as configuration: the test-only corruption goes through the parent)
python3 scripts/device/nvml_profile.py corrupt >>"$LOG" 2>&1; echo "corrupt rc=$?" >>"$LOG"

sec "2b. the NVML snapshot every check waits for, profiled"
python3 scripts/device/nvml_profile.py nvml >>"$LOG" 2>&1
fi

if has stall; then
sec "3. SIGSTOP rank 1 in each phase (nccl4py); seconds from the stop to the verdict"
for ph in spawn init "warm-up of 1 GiB" "measure of 4 GiB"; do
  python3 scripts/device/bench_probe.py stall "$ph" nccl4py >>"$OUT/stall.jsonl" 2>>"$LOG"
done
run cat "$OUT/stall.jsonl"
fi

if has venv; then
sec "4. --python: a training venv with torch's NCCL wheel but no nccl4py"
SP=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(os.path.dirname(list(nvidia.nccl.__path__)[0])))")
python3 -m venv /tmp/jobvenv && JS=$(echo /tmp/jobvenv/lib/python3*/site-packages)
mkdir -p "$JS/nvidia" && cp -r "$SP/nvidia/nccl" "$JS/nvidia/" && cp -r "$SP"/nvidia_nccl_cu*.dist-info "$JS/"
t0=$(date +%s.%N); "${P[@]}" check --json --only allreduce,versions --python /tmp/jobvenv/bin/python >"$OUT/venv.json" 2>>"$LOG"; echo "venv check rc=$? wall $(wall $t0) s" >>"$LOG"
python3 -c "import json; r=json.load(open('$OUT/venv.json')); b=r['bandwidth'] or {}; print(r['status'], b.get('status'), b.get('busbw_gbps'), b.get('engine'), b.get('libnccl'), b.get('notes'))" >>"$LOG" 2>&1
fi

if has torch; then
sec "5. the torch engine, once"
t0=$(date +%s.%N); PREFLIGHT_BENCH_ENGINE=torch "${P[@]}" check --json --skip gpu_speed >"$OUT/check-torch.json" 2>>"$LOG"; echo "torch check rc=$? wall $(wall $t0) s" >>"$LOG"
python3 -c "import json; r=json.load(open('$OUT/check-torch.json')); b=r['bandwidth'] or {}; print(r['status'], b.get('engine'), b.get('busbw_gbps'), b.get('phase_times_s'))" >>"$LOG" 2>&1
fi

sec "left behind"
run nvidia-smi --query-compute-apps=pid,used_memory --format=csv
run ls -la /dev/shm
run pgrep -fa 'bench/worker/start.py'
run ls -d /tmp/preflight-bench-* /tmp/preflight-gpuspeed-*
