#!/usr/bin/env bash
# Issue 14 on ONE H200 (kind nvidia-h200; the 2-GPU kind was not lent): the nccl4py worker's
# imports, its GPU-side fill and exact check, its exit, NCCL's init timings and `preflight
# check`'s own time, with a one-rank communicator (teardown_probe.py). Writes $OUT/one.log and
# $OUT/one.jsonl; tar them. STEPS: which sections to run (default: all).
set -u
LOG=${OUT:-/tmp/out}/one.log
. scripts/device/lib.sh
J="$OUT/one.jsonl"
STEPS=${STEPS:-imports,importtime,orchestrated,venv,exit,ncclinit,check,check1,gpuspeed}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
T=scripts/device/teardown_probe.py
sec "machine $(date -u +%FT%TZ)"
run nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total --format=csv
if has imports; then sec "imports"; python3 $T imports >>"$J" 2>>"$LOG"; fi
if has importtime; then
  sec "importtime"
  for t in nccl.core nccl.bindings.nccl cuda.bindings.driver cuda.core numpy; do
    python3 $T importtime $t >>"$J" 2>>"$LOG"; done
  python3 $T importtime numpy OPENBLAS_NUM_THREADS=1 >>"$J" 2>>"$LOG"
  python3 $T importtime nccl.core OPENBLAS_NUM_THREADS=1 >>"$J" 2>>"$LOG"
fi
if has orchestrated; then
  sec "orchestrated one rank: 1 GiB x5, the sweep, the corruption"
  for i in 1 2 3 4 5; do python3 $T orchestrated 1G >>"$J" 2>>"$LOG"; done
  python3 $T orchestrated sweep >>"$J" 2>>"$LOG"
  python3 $T orchestrated 1G corrupt >>"$J" 2>>"$LOG"
  python3 $T orchestrated 1G nccl >>"$J" 2>>"$LOG"
fi
if has venv; then
  sec "--python: a training venv with torch's NCCL wheel but no nccl4py"
  SP=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(os.path.dirname(list(nvidia.nccl.__path__)[0])))")
  python3 -m venv /tmp/jobvenv && JS=$(echo /tmp/jobvenv/lib/python3*/site-packages)
  mkdir -p "$JS/nvidia" && cp -r "$SP/nvidia/nccl" "$JS/nvidia/" && cp -r "$SP"/nvidia_nccl_cu*.dist-info "$JS/"
  run ls "$JS" "$JS/nvidia/nccl/lib"
  python3 $T venv /tmp/jobvenv/bin/python >>"$J" 2>>"$LOG"
  echo "not an ELF" >/tmp/bogus.so.2
  python3 $T venv /tmp/jobvenv/bin/python /tmp/bogus.so.2 >>"$J" 2>>"$LOG"
fi
if has exit; then
  sec "exit variants x3"
  for i in 1 2 3; do for v in destroy abort exit; do
    python3 $T exit $v >>"$J" 2>>"$LOG"; done; done
fi
if has ncclinit; then
  sec "NCCL init timings, one rank"
  NCCL_DEBUG=INFO python3 $T exit exit 2>&1 | grep -E "timings|Init COMPLETE|NCCL version|RAS|cudaDriver|\"experiment\"" >>"$LOG"
fi
if has check; then
  sec "preflight check on one GPU (allreduce SKIP): wall x3, and without gpu_speed x3"
  for s in "" "--skip gpu_speed"; do for i in 1 2 3; do
    t0=$(date +%s.%N); "${P[@]}" check --json $s >"$OUT/chk.json" 2>>"$LOG"; rc=$?
    echo "check $s run $i rc=$rc wall $(python3 -c "print(round($(date +%s.%N)-$t0,3))") s" >>"$LOG"
  done; done
fi
if has check1; then
  sec "preflight check with a ONE-rank all-reduce (check_one_rank.py): x5 with --skip gpu_speed, x5 whole"
  for s in "--skip gpu_speed" ""; do for i in 1 2 3 4 5; do
    t0=$(date +%s.%N); python3 scripts/device/check_one_rank.py check --json $s >"$OUT/chk1.json" 2>>"$LOG"; rc=$?
    echo "check1 $s run $i rc=$rc wall $(python3 -c "print(round($(date +%s.%N)-$t0,3))") s" >>"$LOG"
    python3 -c "import json; r=json.load(open('$OUT/chk1.json')); b=r['bandwidth'] or {}; print('  ', [(x['check'], x['status'], round(x.get('duration_s') or 0,3)) for x in r['results'] if x['check'] in ('allreduce','gpu_speed','versions')], 'elapsed', b.get('elapsed_s'), 'phases', b.get('phase_times_s'), 'shm', b.get('shm_removed'), [g.get('phase_s') for g in ((([x for x in r['results'] if x['check']=='gpu_speed'] or [{}])[0].get('details') or {}).get('gpu_speed') or {}).get('gpus', [])])" >>"$LOG" 2>&1
  done; done
fi
if has gpuspeed; then
  sec "gpu_speed alone: preflight check --only gpu_speed, x3, with the worker's phase times"
  for i in 1 2 3; do
    t0=$(date +%s.%N); "${P[@]}" check --json --only gpu_speed >"$OUT/chk2.json" 2>>"$LOG"; rc=$?
    echo "gpu_speed run $i rc=$rc wall $(python3 -c "print(round($(date +%s.%N)-$t0,3))") s" >>"$LOG"
    python3 -c "import json; r=json.load(open('$OUT/chk2.json')); x=r['results'][0]; print('  ', x['status'], round(x['duration_s'],3), json.dumps(x['details'])[:1500])" >>"$LOG" 2>&1
  done
fi
sec "left behind"
run nvidia-smi --query-compute-apps=pid,used_memory --format=csv
run ls -la /dev/shm
run pgrep -fa 'worker/start.py|teardown_probe'
cat "$J" >>"$LOG"
