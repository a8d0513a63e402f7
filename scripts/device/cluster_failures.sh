#!/usr/bin/env bash
# preflight cluster when NCCL itself fails (kind nvidia-h200, one GPU is enough; on
# nvidia-h200-x2 section C also runs): a failure is named as a failure, with NCCL's own words,
# never as "slow"; the rows say which check made a node warn or fail; --master-addr given means
# no MasterAddrUnset.
#  A. two agents on the same GPU (both CUDA_VISIBLE_DEVICES=0): NCCL refuses ("Duplicate GPU
#     detected"); expect FAIL WorldAllreduceFailed quoting it, failed_nodes, no SlowNode /
#     SlowNetwork;
#  B. node 1 with NCCL_SOCKET_IFNAME=nosuch0 ("no socket interface found" in NCCL's words);
#  C. (2 GPUs) three one-GPU agents, node 2 sharing GPU 1 with node 1: the world run fails,
#     the pairs round runs by default, and the verdict names what it can prove.
# Everything goes into ONE tar, $OUT/cluster_failures.tar.gz (failures.log + JSON). About 60 s
# on one GPU (A and B), under 2 min with C.
set -u
FINAL=${OUT:-/tmp/out}; mkdir -p "$FINAL"
OUT=$(mktemp -d /tmp/cluster_failures.XXXXXX); LOG=$OUT/failures.log
. scripts/device/lib.sh
T0=$(date +%s)
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1
COMMON=(cluster --backend nccl --nproc-per-node 1 --size 64M --timeout 15 --json --verbose
        --master-addr 127.0.0.1)
PORT=$((20000 + RANDOM % 20000))

sec "machine $(date -u +%FT%TZ)"
run nvidia-smi -L
GPUS=$(nvidia-smi -L | wc -l)

# agent NAME NNODES NODE_RANK GPU [env...]: one agent in the background.
agent() { local name=$1 n=$2 r=$3 gpu=$4; shift 4
  ( env CUDA_VISIBLE_DEVICES="$gpu" NCCL_SOCKET_IFNAME=lo "$@" timeout 90 "${P[@]}" \
      "${COMMON[@]}" --nnodes "$n" --node-rank "$r" --master-port "$PORT" \
      >"$OUT/$name.json" 2>"$OUT/$name.err"
    echo "$name rc=$?" >>"$LOG" ) & }
summary() { for f in "$@"; do python3 - "$f" >>"$LOG" 2>&1 <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
ar = v.get("allreduce") or {}
print(sys.argv[1].rsplit("/", 1)[-1], v["status"], "exit", v["exit_code"], "verdict in",
      v["elapsed_s"], "s")
print("  world:", ar.get("status"), ar.get("reason"), (ar.get("message") or "")[:600])
print("  nccl_warnings", ar.get("nccl_warnings"), "failed_nodes", v["failed_nodes"],
      "slow_nodes", v["slow_nodes"])
for n in v["nodes"]:
    print("  row", n["node_rank"], n["status"], n["why"], n.get("link"))
for r in v["localisation"]["rounds"]:
    print("  round", r["round"], [(g["nodes"], g["status"], g["busbw_gbps"]) for g in r["groups"]])
for f in v["findings"]:
    print("  ", f["status"], f["reason"], f["message"][:500])
PY
done; }

sec "A. two agents on one GPU"
PORT=$((PORT + 1)); agent a-n0 2 0 0; agent a-n1 2 1 0; wait
summary "$OUT/a-n0.json"; run tail -5 "$OUT/a-n1.err"

sec "B. node 1's NCCL_SOCKET_IFNAME names no interface"
# Its own GPU where there are two; on one GPU NCCL's bootstrap fails before it compares GPUs.
PORT=$((PORT + 3)); agent b-n0 2 0 0; agent b-n1 2 1 $(( GPUS >= 2 ? 1 : 0 )) \
  NCCL_SOCKET_IFNAME=nosuch0
wait; summary "$OUT/b-n0.json"

if [ "$GPUS" -ge 2 ]; then
  sec "C. three one-GPU agents, node 2 on node 1's GPU"
  PORT=$((PORT + 5)); agent c-n0 3 0 0; agent c-n1 3 1 1; agent c-n2 3 2 1; wait
  summary "$OUT/c-n0.json"
fi

sec "nothing left"
run pgrep -fa "preflight cluster|bench/worker/start.py"
run nvidia-smi --query-compute-apps=pid,used_memory --format=csv
echo "total $(( $(date +%s) - T0 )) s" >>"$LOG"
tar -czf "$FINAL/cluster_failures.tar.gz" -C "$OUT" . && rm -rf "$OUT"
