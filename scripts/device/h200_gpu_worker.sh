#!/usr/bin/env bash
# One GPU worker per GPU (gpu_speed's phases, then the all-reduce, in one process and one CUDA
# context) on a one-GPU H200: every GPU path in one call, with timings and what is left after.
# Usage there, from the repo root, with the carried wheels in .whl/ (nccl4py, cuda-bindings,
# netifaces-plus):   bash scripts/device/h200_gpu_worker.sh   -> $OUT/gpu-worker.tgz
# Raw files (all in the archive): run.log (every command, its output and exit code), times.tsv
# (label, wall seconds, exit code), *.json (the JSON outputs).
set -u
OUT=${OUT:-/tmp/out}
R=$OUT/gpu-worker; mkdir -p "$R"; LOG=$R/run.log; : >"$LOG"; T=$R/times.tsv; : >"$T"
. scripts/device/lib.sh
# timed LABEL CMD...: wall seconds of one run, stdout to LABEL.json, stderr to the log.
timed() {
  local label=$1; shift
  local t0 t1 rc; t0=$(date +%s.%N)
  "$@" >"$R/$label.json" 2>>"$LOG"; rc=$?
  t1=$(date +%s.%N)
  printf '%s\t%s\t%s\n' "$label" "$(awk "BEGIN{printf \"%.3f\", $t1 - $t0}")" "$rc" >>"$T"
  printf '$ %s  -> rc=%s\n' "$*" "$rc" >>"$LOG"
}
left() {
  sec "left after: $1"
  { pgrep -fa 'bench/worker/start.py' || echo "no worker process"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | grep . || echo "no compute app"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader
    ls /dev/shm | grep . || echo "/dev/shm empty"
    ls -d /tmp/preflight-* 2>/dev/null || echo "no /tmp/preflight-*"; } >>"$LOG" 2>&1
}
ONE=(python3 scripts/device/one_gpu.py)

sec "machine $(date -u +%FT%TZ)"
run nvidia-smi -L
run nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max,memory.total --format=csv
run python3 -c "import sys, torch, nccl, cuda.bindings; print(sys.version.split()[0], 'torch', torch.__version__, 'nccl4py', getattr(nccl, '__version__', '?'), 'cuda-bindings', cuda.bindings.__version__)"
run nproc
B0=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1 | python3 -c "import sys; from preflight.probes.pci import normalize_bus_id as n; print(n(sys.stdin.read()))")

sec "1. the worker alone: the speed step (cuda engine), its own lines with wall clock"
PLAN='{"label": "GPU 0", "device": 0, "bus_id": "'"$B0"'", "speed": {"engine": "auto", "kinds": ["h2d", "d2h", "d2d", "gemm"], "timeout_s": 30}, "allreduce": null}'
for i in 1 2; do
  t0=$(date +%s.%N); echo "spawn wall $t0" >>"$LOG"
  echo '{"go": true}' | python3 preflight/bench/worker/start.py --plan "$PLAN" --progress-fd 1 >>"$LOG" 2>&1
  echo "rc=$? exited at $(date +%s.%N)" >>"$LOG"
done
python3 -X importtime -c "import cuda.bindings.driver" 2>&1 | tail -3 >>"$LOG"
run python3 -c "import time; t=time.perf_counter(); import cuda.pathfinder as p; l=p.load_nvidia_dynamic_lib('cublas'); import ctypes; ctypes.CDLL(l.abs_path); print('cuBLAS load', round(time.perf_counter()-t, 3), l.abs_path)"

sec "2. the CLI alone, and the node checks (the part of check that is no GPU test)"
for i in 1 2 3; do timed "version-$i" "${P[@]}" --version; done
for i in 1 2 3; do timed "check-no-bandwidth-$i" "${P[@]}" check --no-bandwidth --json; done

sec "3. bench --gpu x5 (target <= 0.9 s), each beside one without the early start (gpu_prestart=false)"
for i in 1 2 3 4 5; do
  timed "bench-gpu-$i" "${P[@]}" bench --gpu --json
  timed "bench-gpu-noprestart-$i" env PREFLIGHT_GPU_PRESTART=false "${P[@]}" bench --gpu --json
done
run "${P[@]}" bench --gpu

sec "4. the whole default check x5 (target <= 1.0 s; allreduce SKIPs on one GPU), and without the early start"
for i in 1 2 3 4 5; do
  timed "check-$i" "${P[@]}" check --json
  timed "check-noprestart-$i" env PREFLIGHT_GPU_PRESTART=false "${P[@]}" check --json
done
run "${P[@]}" check
left "check"

sec "5. gpu_speed then a ONE-rank all-reduce in the same worker (check, one_gpu.py) x3"
for i in 1 2 3; do timed "check-one-rank-$i" "${ONE[@]}" check --json; done
envrun PREFLIGHT_BENCH_ENGINE=torch "${ONE[@]}" check
timed "check-one-rank-torch" env PREFLIGHT_BENCH_ENGINE=torch "${ONE[@]}" check --json
left "one-rank check"

sec "6. bench --json with phase times: one-rank sweep 1M..1G, nccl4py and torch; corrupted sum"
timed bench-one-rank "${ONE[@]}" bench --json
run "${ONE[@]}" bench
timed bench-one-rank-torch "${ONE[@]}" bench --engine torch --json
# (The test-only variable is no configuration key: the CLI refuses it, so this runs the parent.)
timed bench-corrupt "${ONE[@]}" corrupt
timed bench-corrupt-torch "${ONE[@]}" corrupt torch
run "${P[@]}" bench --json
left "bench"

sec "7. gpu_speed engines: torch, and auto falling back to torch when cuBLAS cannot load"
timed bench-gpu-torch "${P[@]}" bench --gpu --gpu-engine torch --json
mkdir -p /tmp/nocublas/cuda/pathfinder
echo 'raise ImportError("cuda.pathfinder hidden by the test: no cuBLAS")' >/tmp/nocublas/cuda/pathfinder/__init__.py
timed bench-gpu-fallback env PYTHONPATH="/tmp/nocublas:$PYTHONPATH" "${P[@]}" bench --gpu --json
run "${P[@]}" bench --gpu --gpu-engine cpu

sec "8. frozen workers named: SIGSTOP in the speed step, in the all-reduce's phases"
timed stall-speed env PREFLIGHT_GPUSPEED_TEST_STALL="$B0:gemm" "${P[@]}" bench --gpu --json
timed stall-speed-check env PREFLIGHT_GPUSPEED_TEST_STALL="$B0:d2d" "${ONE[@]}" check --json
for ph in import init warm-up measure; do run "${ONE[@]}" stall "$ph"; done
run "${ONE[@]}" stall measure torch
left "stalls"

sec "9. --python: a bare venv, a training venv with torch but no nccl4py (preflight's nccl4py drives its libnccl)"
SITE=$(python3 -c "import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))")
python3 -m venv --without-pip /tmp/vbare
python3 -m venv --without-pip /tmp/vtrain && echo "$SITE" >"$(/tmp/vtrain/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz-torch.pth"
# preflight's own environment with nccl4py installed in it (not through PYTHONPATH, which the
# workers would inherit): venv P reaching the image's packages, plus the carried wheels.
python3 -m venv --without-pip /tmp/vpre
PSITE=$(/tmp/vpre/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$PSITE" .whl/*.whl >>"$LOG" 2>&1
echo "$SITE" >"$PSITE/zz-torch.pth"
PP=(env PYTHONPATH="$PWD" /tmp/vpre/bin/python)
run "${PP[@]}" -c "import nccl, sys; print('preflight env nccl4py', nccl.__file__)"
run /tmp/vtrain/bin/python -c "import importlib.util as u; print('training venv: torch', bool(u.find_spec('torch')), 'nccl4py', bool(u.find_spec('nccl')))"
timed python-bare-gpu "${PP[@]}" -m preflight bench --gpu --python /tmp/vbare/bin/python --json
timed python-bare-check "${PP[@]}" scripts/device/one_gpu.py check --python /tmp/vbare/bin/python --json
timed python-train-check "${PP[@]}" scripts/device/one_gpu.py check --python /tmp/vtrain/bin/python --json
run "${PP[@]}" scripts/device/one_gpu.py check --python /tmp/vtrain/bin/python
timed python-train-torch "${PP[@]}" scripts/device/one_gpu.py bench --python /tmp/vtrain/bin/python --engine torch --max-bytes 64M --json
left "--python"

sec "10. times"
cat "$T" >>"$LOG"
tar -C "$OUT" -czf "$OUT/gpu-worker.tgz" gpu-worker && rm -rf "$R"
