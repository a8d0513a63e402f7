#!/usr/bin/env bash
# Issue 16 on two H200s (kind nvidia-h200-x2), one call: the gpu_speed figures per GPU with their
# fractions of the limit (cuda engine, then torch), time to verdict (median of 3), the check
# together with the all-reduce, a GPU slowed on purpose by a second process loading it, a
# SIGSTOPped worker, and nothing left behind. Writes $OUT/gpuspeed.log and JSON files.
# Run from the repository root (the lent machine's copy): bash scripts/device/h200_gpu_speed.sh
set -u
# Clocks and power limits are left as they are: the lent machines forbid changing them, so the
# slow GPU is made by load from a second process (the check itself SKIPs a GPU in use;
# preflight bench --gpu measures it with a note).
LOG=${OUT:-/tmp/out}/gpuspeed.log
[ -d .whl ] || ln -s ../../.whl .whl   # from .wt/<branch> on the device copy
. scripts/device/lib.sh
export CUDA_DEVICE_ORDER=PCI_BUS_ID

sec "machine $(date -u +%FT%TZ)"
run nvidia-smi --query-gpu=index,name,pci.bus_id,clocks.max.sm,clocks.max.mem,power.limit,power.default_limit,pcie.link.gen.max,pcie.link.width.max --format=csv
run python3 -c "import cuda.bindings, cuda.pathfinder as p; print('cuda-bindings', cuda.bindings.__version__, 'cublas', p.load_nvidia_dynamic_lib('cublas').abs_path)"
run python3 -c "
import json; from preflight.probes.nvml import NvmlGpuProbe
for g in NvmlGpuProbe().snapshot().gpus: print(g.index, g.pci_bus_id, g.name, json.dumps(g.clocks.__dict__))"

sec "1. preflight bench --gpu, cuda engine (torch-free), then torch"
B0=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | sed -n 1p | python3 -c "import sys; from preflight.probes.pci import normalize_bus_id as n; print(n(sys.stdin.read()))")
PLAN='{"label": "GPU 0", "device": 0, "bus_id": "'"$B0"'", "speed": {"engine": "cuda", "kinds": ["h2d", "d2h", "d2d", "gemm"], "timeout_s": 30}, "allreduce": null}'
echo '{"go": true}' | run timeout 60 python3 preflight/bench/worker/start.py --plan "$PLAN" --progress-fd 1
run "${P[@]}" bench --gpu --gpu-engine cuda
"${P[@]}" bench --gpu --gpu-engine cuda --json >"$OUT/gpu-cuda.json" 2>>"$LOG"; echo "rc=$?" >>"$LOG"
run "${P[@]}" bench --gpu --gpu-engine torch

sec "2. time to verdict: preflight check --only gpu_speed, 3 runs (wall, process start included)"
for i in 1 2 3; do
  t0=$(date +%s.%N); "${P[@]}" check --only gpu_speed --json >"$OUT/check-gs-$i.json" 2>>"$LOG"; rc=$?
  echo "gpu_speed run $i rc=$rc wall $(python3 -c "print(round($(date +%s.%N)-$t0,2))") s" >>"$LOG"
done
run python3 -c "import json; r=json.load(open('$OUT/check-gs-3.json'))['results'][0]; print(r['status'], r['reason'], r['message'])"

sec "3. preflight check: all checks with the all-reduce, then without gpu_speed, 3 runs each"
for i in 1 2 3; do
  for skip in versions gpu_speed; do   # versions: a cheap stand-in, so both runs pass --skip
    t0=$(date +%s.%N); "${P[@]}" check --skip "$skip" --json >"$OUT/check-$skip-$i.json" 2>>"$LOG"; rc=$?
    echo "check --skip $skip run $i rc=$rc wall $(python3 -c "print(round($(date +%s.%N)-$t0,2))") s" >>"$LOG"
  done
done 2>>"$LOG"
run "${P[@]}" check

sec "4. slow GPU 1 on purpose: a second process loads it (matmul + 1 GiB copies, torch)"
python3 - >>"$LOG" 2>&1 <<'PY' &
import time, torch
d = torch.device("cuda", 1)
a = torch.randn(8192, 8192, device=d, dtype=torch.bfloat16); b = a.clone()
x = torch.empty(1 << 30, dtype=torch.uint8, device=d); y = torch.empty_like(x)
print("loader ready", flush=True); t = time.time()
while time.time() - t < 30:
    torch.matmul(a, b); y.copy_(x)
    torch.cuda.synchronize(d)
PY
loader=$!; sleep 6
run "${P[@]}" bench --gpu
"${P[@]}" bench --gpu --json >"$OUT/gpu-slow.json" 2>>"$LOG"; echo "rc=$?" >>"$LOG"
run "${P[@]}" check --only gpu_speed
kill "$loader"; wait "$loader" 2>/dev/null

sec "5. SIGSTOP: the worker of GPU 1 stops itself entering gemm (test hook)"
B1=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | sed -n 2p | python3 -c "import sys; from preflight.probes.pci import normalize_bus_id as n; print(n(sys.stdin.read()))")
envrun PREFLIGHT_GPUSPEED_TEST_STALL="$B1:gemm" "${P[@]}" bench --gpu --timeout 12

sec "6. nothing left behind: no worker process, no GPU memory in use"
run pgrep -fa 'bench/worker/start.py'
run nvidia-smi --query-compute-apps=pid,used_memory --format=csv
run nvidia-smi --query-gpu=index,memory.used --format=csv
