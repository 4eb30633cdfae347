# Sourced by the device scripts that time the session's start against the new code in one
# call (run from the repository root with tmp_old/, the start's numba_flash, and tmp_new/,
# the committed tree, carried): leaves the shell in tmp_new with PYTHONPATH on it, and
# defines `variants RUN [ENV=VALUE ...]`, issue #11's softcap / ALiBi / dropout rows
# (bench_variants.py --queued --dropout-only) into $out/c_RUN.*, on tmp_old for RUN=old.
root=$PWD
cd tmp_new || exit 1
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
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
