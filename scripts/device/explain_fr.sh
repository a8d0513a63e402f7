#!/usr/bin/env bash
# Real PyTorch flight recorder dumps from the GPU machine for `preflight explain`, in one call.
# Usage on the H200 machine, from the repo root (about 3 minutes; no downloads):
#   bash scripts/device/explain_fr.sh        ->  $OUT/explain-fr.tar
# Cases (scripts/device/explain_fr_worker.py says how each is made; each under a deadline):
#   nccl-timeout  NCCL, 1 rank on 1 GPU: its stream is held by a GPU spin kernel before an
#                 all_reduce, the watchdog's 5 s timeout fires, ProcessGroupNCCL dumps itself
#                 (TORCH_NCCL_DUMP_ON_TIMEOUT=1) - two ranks cannot share one GPU under NCCL
#   skip          gloo on CUDA tensors, 2 ranks on the one GPU: rank 1 skips the 4th all_reduce
#   mismatch      gloo on CUDA tensors, 2 ranks: all_reduce of 16 vs 8 floats
#   nccl-skip     NCCL, 2 ranks, only when 2 GPUs are visible
# The tar holds fr/<case>/rank_<R> (pickled dumps, torch's own file format), fr/<case>-json/,
# each rank's log, torch.txt (versions), explain-<case>.txt / .json (what preflight explain
# says) and fr_trace-<case>.txt (what torch's analyser says about the same dumps).
# Local dry run without a GPU: FR_CASES=skip,mismatch FR_TENSORS=cpu OUT=/tmp/x bash THIS
set -u
NAME=explain-fr
. scripts/device/explain_lib.sh
CASES=nccl-timeout,skip,mismatch
[ "$NGPU" -ge 2 ] && CASES=$CASES,nccl-skip
CASES=${FR_CASES:-$CASES}
echo "cases $CASES" >>"$LOG"
timeout 400 python3 scripts/device/explain_fr_worker.py --out "$W/fr" --cases "$CASES" \
  --device "${FR_TENSORS:-cuda}" >>"$LOG" 2>&1
echo "worker rc=$?" >>"$LOG"
for dir in "$W"/fr/*/; do
  case=$(basename "$dir")
  timeout 60 python3 -m preflight explain "$dir" >"$W/explain-$case.txt" 2>&1
  timeout 60 python3 -m preflight explain --json "$dir" >"$W/explain-$case.json" 2>&1
  case $case in *-json) continue;; esac
  timeout 60 python3 -m torch.distributed.flight_recorder.fr_trace "$dir" -p rank_ \
    >"$W/fr_trace-$case.txt" 2>&1
  echo "fr_trace $case rc=$?" >>"$LOG"
done
# nothing of ours may be left on the GPU
pgrep -af explain_fr_worker >>"$LOG" 2>&1 && echo "LEFTOVER processes" >>"$LOG"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv >>"$LOG" 2>&1
tar -C "$W" -cf "$OUT/explain-fr.tar" .
rm -rf "$W"
echo "wrote $OUT/explain-fr.tar"
