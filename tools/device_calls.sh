#!/bin/bash
# A session's GPU calls, one phase per call (`bash tools/device_calls.sh models`), each step
# with its own time limit inside the call's budget, logs under $OUT. Earlier sessions' phases
# are in git's history.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
END=$(( $(date +%s) + ${BUDGET:-585} ))
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  local l=$(( END - $(date +%s) )); (( limit > l )) && limit=$l
  (( limit < 15 )) && { echo "== $name: no time left"; return; }
  echo "== $name (limit ${limit}s)"; local t0=$(date +%s)
  timeout $limit "$@" > $OUT/$name.log 2>&1; echo "   rc=$? in $(( $(date +%s) - t0 ))s"
  tail -${TAIL:-3} $OUT/$name.log
}
case $1 in
ro39)  # issue 20's three host-bound steps with CUDA graphs (goal: each at most
  # mode="reduce-overhead"'s); about 300 s. Session 39 timed the first two (its device time
  # ran out in ResNet-50 b64's interleaved process): MODELS=resnet50 for the third, ~110 s.
  M=${MODELS:-gpt2_2x256,resnet50_b16,resnet50}
  TAIL=30 step models 420 python bench/models.py --models $M \
    --jobs 4 --budget 300 --timeout 360 --modes inductor_ro,aotgrad_ro --out $OUT/models ;;
gpu36)  # the CUDA tests of aotgrad's Inductor defaults (pointwise combos, the forward's since
  # session 39), of the Inductor backend on CUDA, and of tangents in their output's memory
  # format (session 39: test_a_channels_last_outputs_gradient_may_come_in_any_layout[cuda-*])
  TAIL=8 step pytest_211 170 python -m pytest -n 8 -v -o addopts= -p no:cacheprovider \
    -p no:warnings tests/test_backends.py tests/test_cudagraphs.py tests/test_donation.py \
    tests/test_batch_norm_devices.py -k "cuda or combo or Cuda or CUDA"
  grep -E "(FAILED|ERROR) " $OUT/pytest_211.log | sort | uniq | head -20
  grep -c " PASSED " $OUT/pytest_211.log ;;
host38)  # host37 without aotgrad's combos: DeBERTa-v2's no-combo aotgrad step was 1.25-1.32x
  # torch's in sessions 34 and 36 (equal launch counts, equal GPU work); where its host goes
  TAIL=0 step shared 300 python tools/probe37.py deberta_v2 inductor,aotgrad_no_combo,aotgrad
  grep -h "ms (medians" $OUT/*.log
  sed -n '/less inductor/,$p' $OUT/shared.log | head -30 ;;
host38b)  # host38 found DeBERTa-v2's no-combo aotgrad step at parity with torch's in a process
  # that compiled both (host 36.17 vs 36.90 ms), against 1.25x in the bench's interleaved
  # process, which loads both from the caches the cold processes filled: a fresh process
  # fills the caches, a second loads them (aotgrad's graphs by Inductor key), both profiled
  export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d); export AOTGRAD_CACHE_DIR=$TORCHINDUCTOR_CACHE_DIR/aotgrad
  TAIL=0 step cold 200 python tools/probe37.py deberta_v2 inductor,aotgrad_no_combo
  TAIL=0 step warm 150 python tools/probe37.py deberta_v2 inductor,aotgrad_no_combo
  grep -h "ms (medians\|compiled and" $OUT/*.log
  sed -n '/less inductor/,$p' $OUT/warm.log | head -40 ;;
suite)
  # -v: each result as it comes, so that a run cut short still says what failed
  TAIL=3 step pytest_211 560 python -m pytest -n 15 -v -o addopts= -p no:cacheprovider -p no:warnings \
    --durations=20 tests/
  grep -E "(FAILED|ERROR) " $OUT/pytest_211.log | sort | uniq | head -40
  grep -c " PASSED " $OUT/pytest_211.log ;;
esac
