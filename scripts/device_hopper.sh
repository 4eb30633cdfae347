# Sourced by session 11's device scripts: the steps they share.
#   hopper_pytest OUT SECONDS [pytest options]  the GPU tests of both Hopper files into
#                                               OUT/a_pytest_hopper.txt; returns pytest's rc
#   wgmma_sanitizers OUT PREFIX SECONDS TOOL... compute-sanitizer TOOL on sanitize_small.py wgmma
hopper_pytest() {
  local out=$1 secs=$2; shift 2
  timeout "$secs" python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider "$@" tests/test_ptx_hopper.py \
    tests/test_wgmma_forward.py > "$out/a_pytest_hopper.txt" 2>&1
  local rc=$?
  echo "pytest rc=$rc" >> "$out/a_pytest_hopper.txt"
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed|Error|rc=" "$out/a_pytest_hopper.txt" | tail -30
  return $rc
}

wgmma_sanitizers() {
  local out=$1 prefix=$2 secs=$3; shift 3
  for tool in "$@"; do
    timeout "$secs" compute-sanitizer --tool "$tool" --report-api-errors no python3 scripts/sanitize_small.py wgmma \
      > "$out/${prefix}_$tool.txt" 2>&1
    echo "$tool rc=$?" >> "$out/${prefix}_$tool.txt"
    tail -2 "$out/${prefix}_$tool.txt"
  done
}
