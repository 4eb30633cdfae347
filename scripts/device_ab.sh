# Sourced by the device scripts that time the session's start against the new code in one
# call (run from the repository root with tmp_old/, the start's numba_flash, and tmp_new/,
# the committed tree, carried): leaves the shell in tmp_new with PYTHONPATH on it, and
# defines `variants RUN [ENV=VALUE ...]`, issue #11's softcap / ALiBi / dropout rows
# (bench_variants.py --queued --dropout-only) into $out/c_RUN.*, on tmp_old for RUN=old.
# The device scripts' arguments, OUT [SECONDS [CALL]] (what a script set before sourcing this stays):
out=${out:-$1}
total=${total:-${2:-580}}
call=${call:-${3:-1}}
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-/tmp/nbcache}
root=$PWD
cd tmp_new || exit 1
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
# each failing test's traceback into $out/failures.txt as it fails (tests/conftest.py): kept
# when a time limit kills pytest before its summary
[ -n "${out:-}" ] && export NUMBA_FLASH_FAILURE_LOG=$out/failures.txt
# the card and its clocks, first in every call's output
if [ -n "${out:-}" ]; then
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt" 2>&1
  cat "$out/gpu.txt"
fi
base=$PYTHONPATH
export PYTHONPATH=$PWD:$base

variants() {
  local run=$1 pp=$PWD:$base
  shift
  [ "$run" = old ] && pp=$root/tmp_old:$base
  env PYTHONPATH="$pp" "$@" timeout 100 python3 scripts/bench_variants.py "$out/c_$run.jsonl" --queued \
    --dropout-only > "$out/c_$run.txt" 2>&1
  echo "variants $run rc=$? at ${SECONDS}s" >> "$out/c_$run.txt"
}

# `side RUN SECONDS NAME SCRIPT ARGS...`: python3 SCRIPT $out/NAME_RUN.jsonl ARGS on tmp_old
# (RUN=old) or tmp_new, under a time limit, its output in $out/NAME_RUN.txt.
side() {
  local run=$1 limit=$2 name=$3 script=$4 pp=$PWD:$base
  shift 4
  [ "$run" = old ] && pp=$root/tmp_old:$base
  env PYTHONPATH="$pp" timeout "$limit" python3 "$script" "$out/${name}_$run.jsonl" "$@" > "$out/${name}_$run.txt" 2>&1
  echo "$name $run rc=$? at ${SECONDS}s" >> "$out/${name}_$run.txt"
}

# `tests NAME SECONDS ARGS...`: pytest -m gpu -v ARGS under a time limit, into $out/t_NAME.txt; a summary line
tests() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 -m pytest -m gpu -v -W ignore -p no:cacheprovider "$@" > "$out/t_$name.txt" 2>&1
  echo "tests $name rc=$? at ${SECONDS}s: $(grep -c ' PASSED ' "$out/t_$name.txt") passed," \
    "$(grep -cE ' (FAILED|ERROR) ' "$out/t_$name.txt") failed" | tee -a "$out/t_$name.txt"
}

# `sanitize TOOL MODE SECONDS`: compute-sanitizer's TOOL on sanitize_small.py MODE, appended
# to $out/b_sanitize.txt (memcheck without the driver's host API errors).
sanitize() {
  local tool=$1 mode=$2 limit=$3 extra=()
  [ "$tool" = memcheck ] && extra=(--report-api-errors no)
  # $mode unquoted: a mode of two words ("wgmma wide") is two arguments
  timeout "$limit" compute-sanitizer --tool "$tool" "${extra[@]}" python3 scripts/sanitize_small.py $mode \
    >> "$out/b_sanitize.txt" 2>&1
  echo "$tool $mode rc=$? at ${SECONDS}s" >> "$out/b_sanitize.txt"
}

# `knob LABEL GROUP [ENV=VALUE ...]`: bench_knobs.py GROUP LABEL with the switches given, in a process
# of its own (the switches are read when a call is planned), into $out/knobs.jsonl and $out/k_LABEL.txt;
# skipped once the call has run ${KNOB_UNTIL:-450} seconds; each under ${KNOB_TIMEOUT:-150} seconds.
knob() {
  local label=$1 group=$2
  shift 2
  [ "$SECONDS" -gt "${KNOB_UNTIL:-450}" ] && { echo "$label skipped at ${SECONDS}s"; return; }
  env "$@" timeout "${KNOB_TIMEOUT:-150}" python3 scripts/bench_knobs.py "$out/knobs.jsonl" "$group" "$label" \
    > "$out/k_$label.txt" 2>&1
  echo "$label rc=$? at ${SECONDS}s" >> "$out/k_$label.txt"
  tail -n 2 "$out/k_$label.txt"
}

# `smi NAME`: nvidia-smi's clock / power log, every 250 ms, into $out/smi_NAME.csv, until `kill $smi_pid`.
smi() {
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 250 > "$out/smi_$1.csv" 2>&1 &
  smi_pid=$!
}
