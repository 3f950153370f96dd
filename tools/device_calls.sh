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
models32a|models32b|models32c)  # the model table, inductor and aotgrad, three models a call
  # (session 29; EfficientNet-B0's and Swin-T's steps ran out of time: models33a/b); then
  # `python bench/models.py --report` over the three folders' JSON copied into one. Session
  # 32 re-ran BERT alone (its attention now on cuDNN): the nine in one session's code next
  case $1 in models32a) M=gpt2,llama,bert ;; models32b) M=resnet50,efficientnet_b0,vit_s16 ;;
    models32c) M=swin_t,convnext_t,deberta_v2 ;; esac
  TAIL=14 step models 575 python bench/models.py --models $M --modes inductor,aotgrad --jobs 1 \
    --budget 420 --timeout 180 --out $OUT/models ;;
spans32)  # next session: GPT-2's and BERT's residual streams (25 values each) are recomputed
  # at the backward's start from up to 102 and 170 saved values (`saved_compare --ops`), and
  # kept alive: saving them would raise the modeled peak. Does saving them pay in kernel time?
  # (Their backward was 1.018x and 1.019x torch's partition's, session 22.)
  TAIL=20 step part 570 python bench/profile_gap.py --models gpt2,bert --steps 5 --timeout 140 \
    --modes aotgrad_dynamo,aotgrad_dynamo_spans_saved --out $OUT/part ;;
processes32)  # DeBERTa-v2's step in four interleaved processes (session 31: a host-bound
  # step's ratio is drawn per process, 0.81x to 1.29x in nine): each mode's median of theirs
  TAIL=14 step models 575 python bench/models.py --models deberta_v2 --modes inductor,aotgrad \
    --jobs 2 --budget 200 --timeout 560 --processes 4 --out $OUT/models ;;
suite)
  # -v: each result as it comes, so that a run cut short still says what failed
  TAIL=3 step pytest_211 560 python -m pytest -n 15 -v -o addopts= -p no:cacheprovider -p no:warnings \
    --durations=20 tests/
  grep -E "(FAILED|ERROR) " $OUT/pytest_211.log | sort | uniq | head -40
  grep -c " PASSED " $OUT/pytest_211.log ;;
esac
