#!/bin/bash
# Session 9's second GPU call: the fixes the first one called for, on torch 2.11.
export PYTHONPATH=$PWD
END=$(( $(date +%s) + ${BUDGET:-150} ))
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  local l=$(( END - $(date +%s) )); (( limit > l )) && limit=$l
  (( limit < 10 )) && { echo "== $name: no time left"; return; }
  echo "== $name (limit ${limit}s)"; local t0=$(date +%s)
  timeout $limit "$@" > $OUT/$name.log 2>&1; echo "   rc=$? in $(( $(date +%s) - t0 ))s"
  tail -${TAIL:-3} $OUT/$name.log
}
TAIL=4 step gpu_hops_region 45 python tools/gpu_hops.py --cases compiled_region --out $OUT/gpu_hops_region.json
TAIL=3 step pytest_211 75 python -m pytest -n 15 -q -o addopts= -p no:cacheprovider tests/test_guards.py tests/test_lazy_backward.py tests/test_compiled_autograd.py tests/test_effects.py
TAIL=1 step diag_effects 20 python tools/diag_effects.py
grep -E "^(FAILED|ERROR)" $OUT/pytest_211.log | head -12
