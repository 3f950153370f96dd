#!/bin/bash
# Session 9's GPU call: one machine start, everything in turn, each step with a time limit.
export PYTHONPATH=$PWD
left() { echo $(( END - $(date +%s) )); }
END=$(( $(date +%s) + ${BUDGET:-585} ))
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  local l=$(left); (( limit > l )) && limit=$l
  (( limit < 20 )) && { echo "== $name: no time left"; return; }
  echo "== $name (limit ${limit}s)"; local t0=$(date +%s)
  timeout $limit "$@" > $OUT/$name.log 2>&1; echo "   rc=$? in $(( $(date +%s) - t0 ))s"
  tail -${TAIL:-3} $OUT/$name.log
}
TAIL=9 step compiled_autograd 230 python tools/gpu_compiled_autograd.py --parallel --timeout 220 --budget 220 --out $OUT/compiled_autograd
step diag_effects 30 python tools/diag_effects.py
TAIL=2 step pytest_211 130 python -m pytest -n 15 -q -o addopts= -p no:cacheprovider tests/test_cache.py tests/test_hops.py tests/test_compiled_autograd.py tests/test_effects.py tests/test_cudagraphs.py
TAIL=12 step gpu_hops 100 python tools/gpu_hops.py --out $OUT/gpu_hops.json
TAIL=4 step gpu_hops_try_triton 40 python tools/gpu_hops.py --cases user_triton_kernel,user_triton_wrap_triton --try-triton --out $OUT/gpu_hops_try.json
TAIL=8 step cache 240 python bench/cache.py --gpu --models gpt2 --sides aotgrad,aotgrad_dynamo,torch --timeout 110 --out $OUT/cache
