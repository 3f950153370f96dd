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
  # `python bench/models.py --report` over the three folders' JSON copied into one
  case $1 in models32a) M=gpt2,llama,bert ;; models32b) M=resnet50,efficientnet_b0,vit_s16 ;;
    models32c) M=swin_t,convnext_t,deberta_v2 ;; esac
  TAIL=14 step models 575 python bench/models.py --models $M --modes inductor,aotgrad --jobs 1 \
    --budget 420 --timeout 180 --out $OUT/models ;;
verify33)  # next session, first: session 29's autocast work (the cast cache in the joint trace
  # and the double backward's replay, the guards, reentrant checkpoints; SDPA's math backward
  # in float32) on torch 2.11 + CUDA, never run there
  TAIL=12 step verify33 560 python -m pytest -n 14 -q -o addopts= -p no:cacheprovider \
    -p no:warnings -rf tests/test_semantics.py tests/test_guards.py tests/test_double_backward.py ;;
models33a|models33b)  # next session: EfficientNet-B0's and Swin-T's steps, untimed in session 29
  # (their calls' budgets ran out: cold compiles 60-73 s a mode), one model a call
  case $1 in models33a) M=efficientnet_b0 ;; models33b) M=swin_t ;; esac
  TAIL=14 step models 575 python bench/models.py --models $M --modes inductor,aotgrad --jobs 1 \
    --budget 60 --timeout 560 --out $OUT/models ;;
sdpa33)  # next session: BERT's traces take SDPA's float32 math path (both doors), eager takes
  # cuDNN attention (session 29, bert/sdpa_choice.log). Does a fake trace of eager's own call
  # take cuDNN, and does transformers' compile-time mask send both to the math path?
  TAIL=20 step sdpa 120 python tools/gpu_sdpa_choice.py bert ;;
spans32)  # next session: GPT-2's and BERT's residual streams (25 values each) are recomputed
  # at the backward's start from up to 102 and 170 saved values (`saved_compare --ops`), and
  # kept alive: saving them would raise the modeled peak. Does saving them pay in kernel time?
  # (Their backward was 1.018x and 1.019x torch's partition's, session 22.)
  TAIL=20 step part 570 python bench/profile_gap.py --models gpt2,bert --steps 5 --timeout 140 \
    --modes aotgrad_dynamo,aotgrad_dynamo_spans_saved --out $OUT/part ;;
hostgap30)  # DeBERTa-v2's backward takes more host time than torch's (session 25: 21.97 vs
  # 18.78 ms, the same calls each slower). Each mode alone: the step split, then the wrapper
  # code Inductor wrote for it, to compare offline (kernel arguments, extern calls' operands)
  for mode in torch_compile aotgrad_dynamo; do
    export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_$mode AOTGRAD_CACHE=0
    step split_$mode 280 python bench/step_split.py --row deberta_v2 $mode --steps 30
    grep -l "def call(" -r /tmp/ind_$mode --include=*.py | xargs tar czf $OUT/wrappers_$mode.tgz
  done ;;
gc30)  # hostgap30 found 3.7 ms of our backward's host time go with the collector off (torch's
  # 0.3): the collections each mode's step starts, and what it leaves in cycles; the wrappers
  for mode in torch_compile aotgrad_dynamo; do
    export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_$mode AOTGRAD_CACHE=0
    TAIL=1 step gc_$mode 280 python tools/gc_probe.py deberta_v2 --modes $mode
    grep -l "def call(" -r /tmp/ind_$mode --include=*.py | xargs tar czf $OUT/wrappers_$mode.tgz
  done ;;
deb30)  # DeBERTa-v2's step once more, the modes taking turns in one process with a control
  # (our mode twice): how much of the gap is the host's speed between rows; then sdpa33
  TAIL=20 step together 420 python bench/step_split.py --models deberta_v2 --together \
    --modes aotgrad_dynamo,torch_compile,aotgrad_dynamo#2 --rounds 8 --steps 48 --out $OUT/together
  TAIL=20 step sdpa 120 python tools/gpu_sdpa_choice.py bert ;;
harness31)  # next session, first: DeBERTa-v2's step is 1.136x torch's by models.py and 0.90x
  # by step_split --together, same machine, minutes apart (session 30, h200-2026-12-01-session30
  # /deberta). Which difference between the two harnesses moves it: steps per turn (models.py
  # 3, step_split 6), zero_grad inside the timed step (models.py), or the harness itself
  S="python bench/step_split.py --models deberta_v2 --together --modes torch_compile,aotgrad_dynamo --profile-steps 1"
  TAIL=2 step split6 200 $S --rounds 8 --steps 48
  TAIL=2 step split3 60 $S --rounds 10 --steps 30
  STEP_SPLIT_ZERO_GRAD_TIMED=1 TAIL=2 step split_zg 60 $S --rounds 8 --steps 48
  TAIL=4 step models6 300 python bench/models.py --models deberta_v2 --modes inductor,aotgrad \
    --jobs 1 --budget 60 --timeout 200 --steps 6 --rounds 8 --out $OUT/models6 ;;
suite)
  # -v: each result as it comes, so that a run cut short still says what failed
  TAIL=3 step pytest_211 560 python -m pytest -n 15 -v -o addopts= -p no:cacheprovider -p no:warnings \
    --durations=20 tests/
  grep -E "(FAILED|ERROR) " $OUT/pytest_211.log | sort | uniq | head -40
  grep -c " PASSED " $OUT/pytest_211.log ;;
esac
