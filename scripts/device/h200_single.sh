#!/usr/bin/env bash
# Every run this project makes on a one-GPU H200 machine, in one call (device time is scarce).
# Usage there, from the repo root, with the netifaces-plus wheel carried in .whl/:
#   bash scripts/device/h200_single.sh      (writes $OUT/runs.log and a few JSON files)
set -u
LOG=${OUT:-/tmp/out}/runs.log
. scripts/device/lib.sh

sec "machine $(date -u +%FT%TZ)"
run nvidia-smi -L
run nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,memory.total --format=csv
run python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'nccl', torch.cuda.nccl.version())"

sec "foundation: preflight check --json --no-bandwidth"
"${P[@]}" check --json --no-bandwidth >"$OUT/check-no-bandwidth.json" 2>>"$LOG"; echo "rc=$?" >>"$LOG"
run "${P[@]}" check --no-bandwidth

sec "cuda_devices verdicts (and what the driver itself exposes)"
U=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1); PFX=${U:0:12}
ORACLE='import ctypes as c;cu=c.CDLL("libcuda.so.1");rc=cu.cuInit(0);n=c.c_int(0);rc or cu.cuDeviceGetCount(c.byref(n));print("driver: cuInit rc",rc,"devices",n.value);b=c.create_string_buffer(64);[print("driver: cuda:%d"%i,cu.cuDeviceGetPCIBusId(b,64,i) or b.value.decode()) for i in range(n.value)]'
for v in 0 "$PFX" 0,0 5 0,-1,1 "${PFX#GPU-}"; do
  envrun CUDA_VISIBLE_DEVICES="$v" "${P[@]}" check --only gpu_visible,cuda_devices,launcher_env
  envrun CUDA_VISIBLE_DEVICES="$v" python3 -c "$ORACLE"
done
envrun CUDA_VISIBLE_DEVICES=0 LOCAL_RANK=2 LOCAL_WORLD_SIZE=4 "${P[@]}" check --only cuda_devices,launcher_env
envrun LOCAL_RANK=2 LOCAL_WORLD_SIZE=4 RANK=2 WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 "${P[@]}" check --only cuda_devices,launcher_env --json

sec "network and master_port"
run "${P[@]}" check --only network,master_port
IP=$(hostname -I | awk '{print $1}')
envrun MASTER_ADDR="$IP" MASTER_PORT=29500 RANK=0 WORLD_SIZE=16 LOCAL_WORLD_SIZE=8 "${P[@]}" check --only network,master_port
envrun MASTER_ADDR="$IP" MASTER_PORT=29500 RANK=0 WORLD_SIZE=16 LOCAL_WORLD_SIZE=8 NCCL_SOCKET_IFNAME=lo "${P[@]}" check --only network,master_port

sec "bandwidth on one GPU: bench and the allreduce check skip; the NCCL worker path with one rank"
run "${P[@]}" bench
run "${P[@]}" check --only allreduce
run "${P[@]}" check
run python3 scripts/device/nccl_one_rank.py
run nvidia-smi --query-compute-apps=pid,used_memory --format=csv
sec "stall: SIGSTOP the one NCCL worker during its sweep"
python3 scripts/device/nccl_one_rank.py >>"$LOG" 2>&1 &
bg=$!
for _ in $(seq 1 100); do w=$(pgrep -f 'bench/worker/start.py' | head -1); [ -n "$w" ] && break; sleep 0.1; done
sleep 4; echo "SIGSTOP worker pid $w at $(date +%T)" >>"$LOG"; kill -STOP "$w"
wait $bg; echo "rc=$? at $(date +%T)" >>"$LOG"
run pgrep -fa 'bench/worker/start.py'
run nvidia-smi --query-compute-apps=pid,used_memory --format=csv

sec "fingerprint and versions"
"${P[@]}" fingerprint --json >"$OUT/fingerprint-h200.json" 2>>"$LOG"; echo "rc=$?" >>"$LOG"
run "${P[@]}" fingerprint
run "${P[@]}" check --only versions --golden "$OUT/fingerprint-h200.json"
run "${P[@]}" diff "$OUT/fingerprint-h200.json" "$OUT/fingerprint-h200.json"
run python3 benchmarks/fingerprint_speed.py --runs 7

sec "explain on real NCCL / torchrun logs"
cat >/tmp/ar.py <<'PY'
import os, torch, torch.distributed as dist
r = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(int(os.environ.get("DEV", r)))
dist.init_process_group("nccl"); x = torch.ones(1, device="cuda"); dist.all_reduce(x)
print(f"iteration 1 sum {x.item()}")
PY
for case in "ok:1:" "iface:1:NCCL_SOCKET_IFNAME==nosuch0" "dup:2:DEV=0" "ord:1:DEV=7"; do
  IFS=: read -r name n var <<<"$case"
  env NCCL_DEBUG=INFO $var timeout 120 torchrun --nproc_per_node="$n" --master_port=29611 /tmp/ar.py >"/tmp/$name.log" 2>&1
  echo "torchrun $name rc=$?" >>"$LOG"; cp "/tmp/$name.log" "$OUT/nccl-$name.log" 2>/dev/null
  run "${P[@]}" explain "/tmp/$name.log"
done

sec "speed: preflight check --no-bandwidth"
run python3 benchmarks/check_speed.py --runs 7
run python3 benchmarks/network_checks.py
