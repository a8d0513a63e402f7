#!/usr/bin/env bash
# preflight cluster on two H200 GPUs (kind nvidia-h200-x2), issue 12's "On GPUs" section:
#  A. two one-GPU "nodes" (CUDA_VISIBLE_DEVICES=0 and =1), NCCL over sockets (P2P and SHM off),
#     each agent in its own network namespace on a bridge when the machine allows, else both on
#     127.0.0.1; time to verdict of each agent (target under 10 s), 3 runs with the default engine
#     (auto: nccl4py, whose unique id crosses the nodes through the cluster store, when the
#     carried wheels installed it), then 1 run with --engine torch for comparison; every summary
#     line says which engine ran and the workers' phase times;
#  B. one node of two GPUs (NVLink, 1 GiB, judged against the built-in 2x H200 figure);
#  C. node 1's agent SIGSTOPped after it arrived: node 0 names it, nothing is left running;
#  D. a floor no link reaches (--min-busbw 10000): the localisation rounds and their verdict.
# Everything goes into ONE tar, $OUT/cluster_x2.tar.gz (x2.log + JSON). Under 4 minutes.
set -u
FINAL=${OUT:-/tmp/out}; mkdir -p "$FINAL"
OUT=$(mktemp -d /tmp/cluster_x2.XXXXXX); LOG=$OUT/x2.log
. scripts/device/lib.sh
T0=$(date +%s)
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1
COMMON=(cluster --backend nccl --nproc-per-node 1 --size 64M --timeout 20 --json --verbose)
PORT=$((20000 + RANDOM % 20000)); TAG=pfx2$$

sec "machine $(date -u +%FT%TZ)"
run nvidia-smi -L
run python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
run python3 -c "import nccl.bindings.nccl as n; print('libnccl', n.get_version(), n.get_library_path())"

# Network namespaces: a hub with a bridge, node namespaces n0/n1 with eth0 10.78.0.1/.2.
NS=0
if ip netns add "$TAG-hub" 2>>"$LOG"; then
  ip -n "$TAG-hub" link add br0 type bridge && ip -n "$TAG-hub" link set br0 up && NS=1
  for r in 0 1; do
    ip netns add "$TAG-n$r" && ip -n "$TAG-n$r" link set lo up &&
    ip -n "$TAG-hub" link add "v$r" type veth peer name eth0 netns "$TAG-n$r" &&
    ip -n "$TAG-hub" link set "v$r" master br0 up &&
    ip -n "$TAG-n$r" addr add "10.78.0.$((r + 1))/24" dev eth0 &&
    ip -n "$TAG-n$r" link set eth0 up || NS=0
  done
fi
cleanup() { for n in "$TAG-n0" "$TAG-n1" "$TAG-hub"; do ip netns del "$n" 2>/dev/null; done; }
trap cleanup EXIT
if [ "$NS" = 1 ]; then MASTER=10.78.0.1; IFN=eth0; else MASTER=127.0.0.1; IFN=lo; fi
echo "network namespaces: $NS (master $MASTER, NCCL_SOCKET_IFNAME=$IFN)" >>"$LOG"
in_node() { local r=$1; shift
  if [ "$NS" = 1 ]; then ip netns exec "$TAG-n$r" "$@"; else "$@"; fi; }

# agent NAME NODE_RANK GPU [args]: one agent in the background, its wall time to its verdict.
agent() { local name=$1 r=$2 gpu=$3; shift 3
  ( t=$(date +%s.%N)
    in_node "$r" env CUDA_VISIBLE_DEVICES="$gpu" NCCL_SOCKET_IFNAME="$IFN" timeout 45 \
      "${P[@]}" "${COMMON[@]}" --nnodes 2 --node-rank "$r" --master-addr "$MASTER" \
      --master-port "$PORT" "$@" >"$OUT/$name.json" 2>"$OUT/$name.err"
    rc=$?; echo "$name node $r rc=$rc wall $(python3 -c "print(round($(date +%s.%N)-$t,2))") s" \
      >>"$LOG" ) & }
summary() { for f in "$@"; do python3 - "$f" >>"$LOG" 2>&1 <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
ar = v.get("allreduce") or {}
print(sys.argv[1].rsplit("/", 1)[-1], v["status"], "exit", v["exit_code"], "verdict in",
      v["elapsed_s"], "s; busbw", ar.get("busbw_gbps"), "GB/s;", ar.get("message"))
print("  engine", ar.get("engine"), "nccl", ar.get("nccl_version"), ar.get("libnccl"),
      "phase_times_s", ar.get("phase_times_s"), "first_allreduce_s", ar.get("first_allreduce_s"))
print("  slow", v["slow_nodes"], "missing", v["missing_nodes"], "unresponsive",
      v["unresponsive_nodes"], "rounds", [(r["round"], [(g["nodes"], g["status"], g["busbw_gbps"])
      for g in r["groups"]]) for r in v["localisation"]["rounds"]])
for f in v["findings"]:
    print("  ", f["status"], f["reason"], f["message"][:400])
PY
done; }

# Stay under 4 minutes even if a run hits its deadlines: later sections are skipped, and say so.
left() { if (( $(date +%s) - T0 > 170 )); then echo "skipped: $1 (time)" >>"$LOG"; return 1; fi; }

sec "A. two one-GPU nodes, NCCL over sockets, 3 runs"
for i in 1 2 3; do
  left "A run $i" || break
  PORT=$((PORT + 1)); agent "a$i-n0" 0 0; agent "a$i-n1" 1 1; wait
  summary "$OUT/a$i-n0.json" "$OUT/a$i-n1.json"
done

sec "A-torch. the same, --engine torch (the engine before issue 12's nccl4py relay), 1 run"
left A-torch && {
PORT=$((PORT + 5)); agent at-n0 0 0 --engine torch; agent at-n1 1 1 --engine torch; wait
summary "$OUT/at-n0.json" "$OUT/at-n1.json"; }

sec "B. one node of two GPUs (NVLink: P2P and SHM allowed again)"
left B && {
t=$(date +%s.%N)
env -u NCCL_P2P_DISABLE -u NCCL_SHM_DISABLE timeout 45 "${P[@]}" cluster --backend nccl --size 1G --timeout 30 --json --nnodes 1 \
  --node-rank 0 --master-addr 127.0.0.1 --master-port $((PORT + 7)) >"$OUT/b.json" 2>"$OUT/b.err"
echo "B rc=$? wall $(python3 -c "print(round($(date +%s.%N)-$t,2))") s" >>"$LOG"
summary "$OUT/b.json"; }

sec "C. node 1's agent SIGSTOPped after it arrived"
left C && {
PORT=$((PORT + 11)); agent c-n0 0 0 --timeout 10; agent c-n1 1 1 --timeout 10
for _ in $(seq 1 300); do grep -q "node 1: arrived" "$OUT/c-n1.err" 2>/dev/null && break; sleep 0.1; done
# The agent itself, not the `timeout` wrapper whose command line looks the same.
pid=$(for p in $(pgrep -f "preflight cluster .*--node-rank 1 .*--master-port $PORT"); do
  [ "$(cat /proc/"$p"/comm 2>/dev/null)" != timeout ] && echo "$p"; done | head -1)
echo "SIGSTOP node 1 agent pid $pid at $(date +%T.%N)" >>"$LOG"; kill -STOP "$pid"
for _ in $(seq 1 600); do [ -s "$OUT/c-n0.json" ] && grep -q '}' "$OUT/c-n0.json" && break; sleep 0.1; done
sleep 1; echo "node 0 done at $(date +%T.%N); SIGCONT node 1" >>"$LOG"; kill -CONT "$pid"; wait
summary "$OUT/c-n0.json"; run cat "$OUT/c-n1.err"
run pgrep -fa "preflight cluster|bench/worker/start.py"
run nvidia-smi --query-compute-apps=pid,used_memory --format=csv; }

sec "D. a floor no link reaches: localisation"
left D && {
PORT=$((PORT + 13)); agent d-n0 0 0 --min-busbw 10000; agent d-n1 1 1 --min-busbw 10000; wait
summary "$OUT/d-n0.json"; }

echo "total $(( $(date +%s) - T0 )) s" >>"$LOG"
tar -czf "$FINAL/cluster_x2.tar.gz" -C "$OUT" . && rm -rf "$OUT"
