#!/bin/bash
# session 21 call 2: Q4_K_M under 2 GiB beside llama.cpp in 3 alternating rounds (one sequence), after
# F16 4 GiB auto: the host's pace old / new / not followed
set -u
src=$(pwd); O=/tmp/o; rm -rf $O; mkdir -p $O
. tests/gpu/deps.sh
st() { echo "[$(date +%T)] $*" >> $O/chain.txt; }
st start
(lscpu | grep -E "Model|MHz|^CPU\(s\)"; nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv) > $O/host.txt 2>&1
(OUT=/tmp/ob ALL_TARGETS="server/ferry" bash tests/gpu/all.sh build > $O/build.log 2>&1; st "new build rc=$?") &
(rm -rf /tmp/fold && mkdir -p /tmp/fold && cp -r .old/. /tmp/fold && cd /tmp/fold &&
  meson setup build -Dcuda=enabled -Dnative=true -Dbuildtype=release -Dtests=disabled > /tmp/fold.log 2>&1 &&
  nice ninja -C build server/ferry >> /tmp/fold.log 2>&1; st "old build rc=$?") &
mkdir -p /tmp/cmp
for t in Q4_K_M F16; do
  [ -s /tmp/cmp/$t.gguf ] || python3 tests/gpu/make_quant_gguf.py /tmp/cmp/$t.gguf $t llama-2-7b > /tmp/mk-$t.log 2>&1
done
wait
F=/tmp/fw/build/server/ferry
st "F16 4 GiB auto: old pace (35a2e8a), new pace (d716c4f), new with FERRY_PLAN_ADAPT=0, alternating"
for r in 1 2; do
  for v in old new fixed; do
    B=$F; [ $v = old ] && B=/tmp/fold/build/server/ferry
    if [ $v = fixed ]; then export FERRY_PLAN_ADAPT=0; else unset FERRY_PLAN_ADAPT; fi
    timeout 200 $B bench --model /tmp/cmp/F16.gguf --gpu-memory 4GiB --batches 1,16 --prefill 0 --decode-steps 24 > $O/f16-$v-r$r.txt 2>&1
    st "f16 $v r$r rc=$? $(grep -E 'ran at|^1 ' $O/f16-$v-r$r.txt | tr '\n' ' ' | cut -c1-400)"
  done
done
unset FERRY_PLAN_ADAPT
[ -x /tmp/llb/bin/llama-bench ] || bash .peers/build-llama-cpp.sh /tmp/llb > /tmp/llb.log 2>&1; st "llama build rc=$?"
: > /tmp/cmp/results.jsonl
export CMP_FERRY=$F
st "Q4_K_M 2 GiB one sequence, 3 rounds"
OUT=$O/cmp CMP_HYBRID_FILES="Q4_K_M" CMP_1SEQ=only CMP_ROUNDS=3 CMP_MAIN=0 CMP_Q4_4G=0 CMP_CPU=0 CMP_INT4=0 bash tests/gpu/compare_llamacpp.sh bench > $O/cmp.out 2>&1
st "cmp rc=$?"
st done
