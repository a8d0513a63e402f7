#!/usr/bin/env bash
# Fresh torchrun + NCCL failure logs for `preflight explain`, in one call.
# Usage on the H200 machine (2 GPUs wanted; with 1 GPU the two-rank cases run on gloo/CPU),
# from the repo root:
#   bash scripts/device/explain_logs.sh        ->  $OUT/explain-logs.tar
# The tar holds real-h200-<case>.log (copy them into tests/explain/logs/, where
# tests/explain/test_real_h200_logs.py reads them), explain-<case>.txt (what preflight explain
# says about each) and runs.log. Cases, each under `timeout` (45 s), about 2 minutes in all:
#   sigkill       rank 1 kills itself with SIGKILL after the first all_reduce
#   sigsegv       rank 1 kills itself with SIGSEGV after the first all_reduce
#   wrong-iface   NCCL_SOCKET_IFNAME names an interface the host does not have
#   timeout       rank 1 sleeps 40 s before the second all_reduce; process-group timeout 15 s
#   init-timeout  rank 1 sleeps 40 s before init_process_group; init timeout 15 s (gloo: a store
#                 wait timeout; NCCL on torch 2.11: no timeout fires, since the communicator is
#                 made lazily and rank 0 waits in NCCL's bootstrap until `timeout` stops torchrun)
# Local dry run without a GPU: EXPLAIN_BACKEND=gloo OUT=/tmp/x bash scripts/device/explain_logs.sh
set -u
NAME=explain-logs
. scripts/device/explain_lib.sh
BACKEND=${EXPLAIN_BACKEND:-$([ "$NGPU" -ge 2 ] && echo nccl || echo gloo)}
echo "backend $BACKEND" >>"$LOG"

cat >"$W/job.py" <<'PY'
import datetime, os, signal, sys, time
import torch, torch.distributed as dist
case, backend = sys.argv[1], sys.argv[2]
rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
dev = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
if backend == "nccl":
    torch.cuda.set_device(dev)
if case == "init-timeout" and rank == 1:
    print(f"rank {rank}: sleeping 40 s before init_process_group", flush=True)
    time.sleep(40)
dist.init_process_group(backend, timeout=datetime.timedelta(seconds=15))
x = torch.ones(1024, device=dev)
for step in range(1, 4):
    print(f"rank {rank}: iteration {step}", flush=True)
    if step == 2 and rank == 1:
        if case == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if case == "sigsegv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if case == "timeout":
            print(f"rank {rank}: sleeping 40 s", flush=True)
            time.sleep(40)
    dist.all_reduce(x)
    if backend == "nccl":
        torch.cuda.synchronize()
print(f"rank {rank}: done, sum {x[0].item()}", flush=True)
dist.destroy_process_group()
PY

port=29731
for case in sigkill sigsegv wrong-iface timeout init-timeout; do
  port=$((port + 1))
  extra=()
  [ "$case" = wrong-iface ] && extra=(NCCL_SOCKET_IFNAME=nosuch0 GLOO_SOCKET_IFNAME=nosuch0)
  printf '\n######## %s\n' "$case" >>"$LOG"
  start=$(date +%s)
  env NCCL_DEBUG=WARN "${extra[@]}" timeout -k 5 45 \
    torchrun --nproc_per_node=2 --master_addr=127.0.0.1 --master_port=$port --tee 3 \
    "$W/job.py" "$case" "$BACKEND" >"$W/real-h200-$case.log" 2>&1
  echo "$case rc=$? in $(( $(date +%s) - start )) s" >>"$LOG"
  python3 -m preflight explain "$W/real-h200-$case.log" >"$W/explain-$case.txt" 2>&1
  echo "explain rc=$?" >>"$LOG"
  for p in $(pgrep -f "$W/job.py"); do echo "left over: pid $p" >>"$LOG"; kill -9 "$p"; done
done
nvidia-smi --query-compute-apps=pid,used_memory --format=csv >>"$LOG" 2>&1
tar -C "$W" -cf "$OUT/explain-logs.tar" runs.log $(cd "$W" && ls real-h200-*.log explain-*.txt)
rm -rf "$W"
