# Sourced by scripts/device/explain_*.sh: the set-up they share. Needs NAME (the work folder's
# name). After it: $OUT exists, $W is a fresh work folder with $LOG in it, $NGPU counts the GPUs,
# NVLink multicast is off, and PYTHONPATH reaches the source tree (and the carried netifaces-plus
# wheel in .whl/ when there is one: the CLI imports netifaces; what the scripts make is written
# either way). The first lines of $LOG give the date, the GPUs and the torch / CUDA / NCCL versions.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; then
  export PYTHONPATH=$PWD:/tmp/site
fi
W=$(mktemp -d "/tmp/$NAME.XXXXXX")
LOG=$W/runs.log
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
{ echo "date $(date -u +%FT%TZ) gpus $NGPU"; nvidia-smi -L 2>&1
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None)"
} >>"$LOG" 2>&1
