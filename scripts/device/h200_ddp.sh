#!/usr/bin/env bash
# The DDP ladder (preflight ddp) on a one-GPU H200: the healthy ladder with NCCL (world 1 at
# step 3), one broken NCCL (no interface for its sockets, P2P and SHM off, so NCCL must use them)
# -> layer nccl, the field guide's bare script under torchrun for comparison, timings, and what
# is left after each. Under 3 minutes. Usage there, from the repo root, with the netifaces-plus
# wheel in .whl/:   bash scripts/device/h200_ddp.sh   -> $OUT/h200-ddp.tgz
# In the archive: run.log (every command, its output, exit code), times.tsv (label, wall s, rc),
# *.json (preflight ddp --json / check --ddp --json), torchrun-*.log (the bare script's phases).
set -u
OUT=${OUT:-/tmp/out}
R=$OUT/h200-ddp; mkdir -p "$R"; LOG=$R/run.log; : >"$LOG"; T=$R/times.tsv; : >"$T"
. scripts/device/lib.sh
# timed LABEL EXT CMD...: wall seconds of one run (cut at 100 s), stdout to LABEL.EXT.
timed() {
  local label=$1 ext=$2; shift 2
  local t0 t1 rc; t0=$(date +%s.%N)
  timeout -k 5 100 "$@" >"$R/$label.$ext" 2>>"$LOG"; rc=$?
  t1=$(date +%s.%N)
  printf '%s\t%s\t%s\n' "$label" "$(awk "BEGIN{printf \"%.3f\", $t1 - $t0}")" "$rc" >>"$T"
  printf '$ %s  -> rc=%s\n' "$*" "$rc" >>"$LOG"
}
left() {
  sec "left after: $1"
  { pgrep -fa 'bench/worker/start.py|field_guide_ddp' || echo "no worker process"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | grep . || echo "no compute app"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader
    ls /dev/shm | grep . || echo "/dev/shm empty"
    ls -d /tmp/preflight-* 2>/dev/null || echo "no /tmp/preflight-*"; } >>"$LOG" 2>&1
}

sec "machine $(date -u +%FT%TZ)"
run nvidia-smi -L
run python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
run nproc

sec "1. the healthy ladder: the table, then --json 3 times"
run "${P[@]}" ddp
for i in 1 2 3; do timed "ddp-$i" json "${P[@]}" ddp --json; done
left "preflight ddp"

sec "2. broken NCCL: NCCL_SOCKET_IFNAME=nosuch0, NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1 -> layer nccl"
BROKEN=(NCCL_SOCKET_IFNAME=nosuch0 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
timed ddp-broken-nccl json env "${BROKEN[@]}" "${P[@]}" ddp --json
envrun "${BROKEN[@]}" "${P[@]}" ddp
left "broken NCCL"

sec "3. check --ddp (the check ddp with the node checks)"
timed check-ddp json "${P[@]}" check --ddp --no-bandwidth --json
left "check --ddp"

sec "4. the field guide's bare script under torchrun --nproc_per_node=1, 3 times"
for i in 1 2 3; do
  timed "torchrun-$i" log python3 -m torch.distributed.run --nproc_per_node=1 benchmarks/field_guide_ddp.py
done
cat "$R"/torchrun-*.log >>"$LOG"
left "torchrun"

sec "5. times"
cat "$T" >>"$LOG"
python3 - "$R" >>"$LOG" 2>&1 <<'PY'
import json, pathlib, statistics, sys
r = pathlib.Path(sys.argv[1])
rows = [l.split("\t") for l in (r / "times.tsv").read_text().splitlines()]
wall = {k: float(v) for k, v, _ in rows}
ladder = [wall[f"ddp-{i}"] for i in (1, 2, 3)]
bare = [wall[f"torchrun-{i}"] for i in (1, 2, 3)]
print(f"ladder median {statistics.median(ladder):.2f} s, torchrun median "
      f"{statistics.median(bare):.2f} s, ratio {statistics.median(ladder) / statistics.median(bare):.2f} (target <= 2)")
for name in ("ddp-1", "ddp-2", "ddp-3", "ddp-broken-nccl"):
    try:
        d = json.loads((r / f"{name}.json").read_text())
    except ValueError as exc:
        print(f"{name}: no JSON ({exc})")
        continue
    print(f"{name}: {d['status']} layer {d['layer']} reason {d['reason']} elapsed {d['elapsed_s']} "
          f"start {d['start_s']} warnings {d['evidence'].get('nccl_warnings')}; "
          + "; ".join(f"{s['name']} {s['status']} {s['seconds']} {s['phase_s']}" for s in d["steps"]))
PY
tar -C "$OUT" -czf "$OUT/h200-ddp.tgz" h200-ddp && rm -rf "$R"
