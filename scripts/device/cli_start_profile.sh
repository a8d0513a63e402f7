#!/usr/bin/env bash
# Where the CLI's start-up goes on a GPU machine: wall seconds of --version, check
# --no-bandwidth, bench --gpu and check, first on the tree as copied (no bytecode: every module
# compiled on every start, as the copy is), then after `compileall` (what a pip install or the
# image has); the modules each imports (-X importtime) and the 25 slowest; a cProfile of check.
# Usage there, from the repo root, with the wheels in .whl/:
#   bash scripts/device/cli_start_profile.sh   -> $OUT/start-profile.tgz
# In the archive: run.log, times.tsv (label, wall s, rc), importtime-*.txt, check.prof.txt.
set -u
OUT=${OUT:-/tmp/out}
R=$OUT/start-profile; mkdir -p "$R"; LOG=$R/run.log; : >"$LOG"; T=$R/times.tsv; : >"$T"
. scripts/device/lib.sh
timed() {
  local label=$1; shift
  local t0 t1 rc; t0=$(date +%s.%N)
  timeout -k 5 60 "$@" >/dev/null 2>>"$LOG"; rc=$?
  t1=$(date +%s.%N)
  printf '%s\t%s\t%s\n' "$label" "$(awk "BEGIN{printf \"%.3f\", $t1 - $t0}")" "$rc" >>"$T"
}
rounds() {  # rounds TAG: each command 3 times
  local tag=$1 i
  for i in 1 2 3; do timed "$tag-version-$i" "${P[@]}" --version; done
  for i in 1 2 3; do timed "$tag-check-no-bandwidth-$i" "${P[@]}" check --no-bandwidth --json; done
  for i in 1 2 3; do timed "$tag-bench-gpu-$i" "${P[@]}" bench --gpu --json; done
  for i in 1 2 3; do timed "$tag-check-$i" "${P[@]}" check --json; done
}
imports() {  # imports TAG ARGS...: module count and the slowest 25 (cumulative us)
  local tag=$1; shift
  python3 -X importtime -m preflight "$@" >/dev/null 2>"$R/importtime-$tag.txt"
  { echo "$tag: $(grep -c '^import time: *[0-9]' "$R/importtime-$tag.txt") modules"
    grep '^import time: *[0-9]' "$R/importtime-$tag.txt" | sort -t'|' -k2 -n | tail -25; } >>"$LOG"
}

sec "machine $(date -u +%FT%TZ)"
run nproc
run python3 -c "import sys; print(sys.version, sys.flags.dont_write_bytecode)"
run env
find preflight -name '__pycache__' -prune -exec rm -rf {} +

sec "1. as copied (no bytecode; PYTHONDONTWRITEBYTECODE=1 so none is written between runs)"
export PYTHONDONTWRITEBYTECODE=1
rounds fresh
imports fresh-version --version
imports fresh-check-nb check --no-bandwidth --json
unset PYTHONDONTWRITEBYTECODE

sec "2. compiled (python3 -m compileall, as pip install and the image leave it)"
timed compileall python3 -m compileall -q preflight
rounds compiled
imports compiled-version --version
imports compiled-check-nb check --no-bandwidth --json
imports compiled-check check --json

sec "3. cProfile of check (compiled), 40 slowest by cumulative time"
python3 -c "
import cProfile, pstats, sys
sys.argv = ['preflight', 'check', '--json']
from preflight.cli import main
pr = cProfile.Profile(); pr.enable()
try:
    main()
finally:
    pr.disable()
    with open('$R/check.prof.txt', 'w') as f:
        pstats.Stats(pr, stream=f).sort_stats('cumulative').print_stats(40)
" >/dev/null 2>>"$LOG"

sec "4. times"
cat "$T" >>"$LOG"
python3 - "$T" >>"$LOG" <<'PY'
import statistics, sys, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    label, wall, _ = line.split("\t")
    rows[label.rsplit("-", 1)[0]].append(float(wall))
for label, walls in rows.items():
    print(f"{label:32} median {statistics.median(walls):.3f} s  {walls}")
PY
tar -C "$OUT" -czf "$OUT/start-profile.tgz" start-profile && rm -rf "$R"
