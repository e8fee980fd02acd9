#!/usr/bin/env bash
# The reference engine and NVML on a GPU, in one command (under 4 minutes on an H200, model creation included):
#   scripts/gpu_check.sh                      # on the GPU machine: cuda, float32/bfloat16/float16, the full-size pair
#   scripts/gpu_check.sh --device cpu --small # here: the same parts on a tiny pair (the plumbing, ~1 min)
# Parts (each runs whatever the others did; a summary at the end; logs and JSON into $OUT when set; GPU_CHECK_PARTS,
# a space-separated list of names, runs those alone beside wheels and pair):
#   wheels    pydantic & co from .whl/ when python3 lacks it (the GPU image has none; GPU_CHECK_WHEELS=1: install anyway)
#   pair      a random-weight target with SmolLM2-135M-Instruct's shapes and its first 4 layers as the draft, in /tmp
#   bench     trtspec bench-engine (decode, verify 2/4/8, batch 4/8/16, the limit) per dtype, NVML sampling it
#   exactness tests/test_engine_exactness.py and test_engine_precision.py on that pair and device
#   heads     tests/test_heads_exactness.py: the shipped EAGLE-3 head and Medusa heads on that target, every dtype
#   plainstep scripts/bench_eagle3_plain_step.py --warm: a plain step with the EAGLE-3 head loaded against the baseline's
#   logits    one position's logits in a decode, a verify and a batch of 16: differences and the top-2 margin
#   machine   machine.py's NVML GPU detection, one NVML read, `trtspec doctor` on the pair
set -u
cd "$(dirname "$0")/.."
DEVICE=cuda
SMALL=
DTYPES=float32,bfloat16,float16
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --small) SMALL=--small; shift ;;
    --dtypes) DTYPES=$2; shift 2 ;;
    *) echo "usage: $0 [--device cuda|cpu] [--small] [--dtypes float32,bfloat16,float16]" >&2; exit 2 ;;
  esac
done
PY=${PY:-python3}
OUT=${OUT:-/tmp/trtspec-gpu-check/out}
ROOT=${GPU_CHECK_ROOT:-/tmp/trtspec-gpu-check}
mkdir -p "$OUT" "$ROOT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TRTSPEC_CACHE=$ROOT/cache  # anything trtspec caches (kernels, demo pair) stays in /tmp
T_START=$(date +%s)
declare -a NAMES=() RCS=() SECS=()

part() {  # part NAME TIMEOUT_S CMD...: runs CMD (a program: under timeout), records its exit status and time
  local name=$1 limit=$2; shift 2
  case " wheels pair ${GPU_CHECK_PARTS:-$name} " in *" $name "*) ;; *) return 0 ;; esac
  echo; echo "==== $name ($(date -u +%H:%M:%S) UTC, at most ${limit} s): $*"
  local t0=$(date +%s) rc
  if [ "$(type -t "$1")" = function ]; then "$@"; else timeout -k 5 "$limit" "$@"; fi
  rc=$?
  NAMES+=("$name"); RCS+=("$rc"); SECS+=("$(( $(date +%s) - t0 ))")
  echo "==== $name: exit $rc in $(( $(date +%s) - t0 )) s$([ "$rc" = 124 ] && echo ' (timed out)')"
}

main() {
echo "gpu_check: device $DEVICE, dtypes $DTYPES${SMALL:+, small pair}; root $ROOT; out $OUT; $(date -u)"
"$PY" -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(), "transformers", transformers.__version__, transformers.__file__)'
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem,power.draw --format=csv

wheels() {
  if [ -z "${GPU_CHECK_WHEELS:-}" ] && "$PY" -c 'import pydantic' 2>/dev/null; then echo "pydantic already importable: $("$PY" -c 'import pydantic; print(pydantic.VERSION)')"; return 0; fi
  ls .whl/*.whl >/dev/null 2>&1 || { echo "no pydantic and no .whl/ wheels (config loading, doctor and the precision tests need it)"; return 1; }
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$ROOT/site" .whl/*.whl || return 1
  "$PY" -c "import sys; sys.path.insert(0, '$ROOT/site'); import pydantic, pydantic_core; print('pydantic', pydantic.VERSION, 'from', pydantic.__file__)"
}
part wheels 60 wheels
[ -d "$ROOT/site" ] && export PYTHONPATH=$PYTHONPATH:$ROOT/site  # after the repo, before the image's packages

part pair 75 "$PY" scripts/gpu_check.py make-pair "$ROOT" $SMALL
if [ "$DEVICE" = cpu ]; then
  BENCH_DTYPES=float32; TEST_FILTER=(-k "not bfloat16")  # bf16 on this CPU: slow, and its xfail is strict
else
  BENCH_DTYPES=auto,${DTYPES#float32,}; TEST_FILTER=()          # auto shows what the engine picks on a GPU (float32)
fi
part bench 100 "$PY" scripts/gpu_check.py bench "$ROOT" --device "$DEVICE" --dtypes "$BENCH_DTYPES" --out "$OUT"
part exactness 120 env TRTSPEC_TEST_DEVICE="$DEVICE" TRTSPEC_TEST_PAIR="$ROOT/target:$ROOT/draft" \
  "$PY" -m pytest -q -rfEsxX -p no:cacheprovider tests/test_engine_exactness.py tests/test_engine_precision.py \
  "${TEST_FILTER[@]}" --junitxml="$OUT/exactness.xml"
part heads 150 env TRTSPEC_TEST_DEVICE="$DEVICE" TRTSPEC_TEST_PAIR="$ROOT/target:$ROOT/draft" \
  "$PY" -m pytest -q -s -rfEsxX -p no:cacheprovider tests/test_heads_exactness.py "${TEST_FILTER[@]}" \
  --junitxml="$OUT/heads.xml"
for dt in $([ "$DEVICE" = cpu ] && echo float32 || echo float32 bfloat16); do
  part "plainstep-$dt" 240 "$PY" scripts/bench_eagle3_plain_step.py --device "$DEVICE" --dtype "$dt" --warm \
    --target "$ROOT/target" --rounds "$([ -n "$SMALL" ] && echo 3 || echo 12)" --json "$OUT/plainstep-$dt.json"
done
part logits 60 "$PY" scripts/gpu_check.py logits "$ROOT" --device "$DEVICE" --dtypes "$([ "$DEVICE" = cpu ] && echo float32 || echo "$DTYPES")" --out "$OUT"
part machine 60 "$PY" scripts/gpu_check.py machine "$ROOT" --device "$DEVICE" --out "$OUT"

echo; echo "==== summary ($(( $(date +%s) - T_START )) s in all; device $DEVICE)"
FAILED=0
JSON="{\"device\": \"$DEVICE\", \"seconds\": $(( $(date +%s) - T_START )), \"parts\": {"
for i in "${!NAMES[@]}"; do
  status=ok; [ "${RCS[$i]}" != 0 ] && status="FAILED (exit ${RCS[$i]})" && FAILED=1
  [ "${RCS[$i]}" = 124 ] && status="TIMED OUT"
  printf '  %-10s %-20s %4s s\n' "${NAMES[$i]}" "$status" "${SECS[$i]}"
  JSON+="$([ "$i" -gt 0 ] && echo ', ')\"${NAMES[$i]}\": {\"exit\": ${RCS[$i]}, \"seconds\": ${SECS[$i]}}"
done
echo "$JSON}}" > "$OUT/summary.json"
echo "  files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
return $FAILED
}

main 2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
