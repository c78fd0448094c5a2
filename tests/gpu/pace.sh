#!/bin/bash
# pace.sh — on the GPU machine, after `compare_llamacpp.sh prepare` (ferry in /tmp/cmp/ferry, the random 7B
# files in /tmp/cmp): does `--placement auto` recover from a wrong start-up timing of the host? Per round, in
# turn, `ferry bench` decode b=1 (PACE_STEPS steps, median) under --gpu-memory PACE_BUDGET on PACE_FILE with
#   default         the start-up timing as measured, the pace followed
#   slow2           the timing taken 2x (FERRY_HOST_COST_SCALE=2: a host that was busy while it was timed)
#   slow2-fixed     the same with the pace not followed (FERRY_PLAN_ADAPT=0): the plan of the slow timing
#   fast2           the timing taken 0.5x (a host that gets busier after start-up)
#   fast2-fixed     the same, not followed
# Prints each run's b=1 row, its start-up cost line and any plan revision; raw logs under $OUT/pace/.
set -u
out=${OUT:-$(pwd)/out}
mkdir -p "$out/pace"
W=/tmp/cmp
F=$W/ferry/build/server/ferry
file=$W/${PACE_FILE:-Q8_0}.gguf
budget=${PACE_BUDGET:-4GiB}
steps=${PACE_STEPS:-48}
for r in $(seq 1 ${PACE_ROUNDS:-2}); do
  for cfg in default slow2 slow2-fixed fast2 fast2-fixed; do
    envs=()
    case $cfg in
    slow2*) envs+=(FERRY_HOST_COST_SCALE=2) ;;
    fast2*) envs+=(FERRY_HOST_COST_SCALE=0.5) ;;
    esac
    case $cfg in *-fixed) envs+=(FERRY_PLAN_ADAPT=0) ;; esac
    log=$out/pace/$cfg-$r.txt
    env "${envs[@]}" timeout 200 $F bench --model $file --gpu-memory $budget --batches 1 --prefill 0 \
      --decode-steps $steps > $log 2>&1
    rc=$?
    row=$(grep -E "^1 +[0-9]" $log | head -1 | tr -s ' ')
    echo "round $r $cfg: rc=$rc b=1 [$row]"
    grep -oE "host layer at 1 token [0-9.]+ ms alone, [0-9.]+ ms while" $log | head -1 | sed 's/^/    /'
    grep -E "1 tokens: +[0-9]+ cpu" $log | head -1 | sed 's/^ */    start-up plan: /'
    grep -oE "host layers ran at .*" $log | sed 's/^/    /'
  done
done
