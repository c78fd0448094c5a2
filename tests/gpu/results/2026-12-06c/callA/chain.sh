#!/bin/bash
# session 20 call A: parking (4a173df) — e2e; F16 4 GiB park vs FERRY_NO_PARK=1; Q8_0 4 GiB old (8108be5) vs new;
# then the three placements + llama.cpp (F16, Q8_0)
set -u
src=$(pwd); O=/tmp/o; rm -rf $O; mkdir -p $O
. tests/gpu/deps.sh
st() { echo "[$(date +%T)] $*" >> $O/chain.txt; }
st start
(lscpu | grep -E "Model|MHz|^CPU\(s\)"; nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv) > $O/host.txt 2>&1
(OUT=/tmp/ob ALL_TARGETS="server/ferry tests/runtime/test_gpu_e2e" bash tests/gpu/all.sh build > $O/build.log 2>&1; st "new build rc=$?") &
(rm -rf /tmp/fold && mkdir -p /tmp/fold && cp -r .old/. /tmp/fold && cd /tmp/fold &&
  meson setup build -Dcuda=enabled -Dnative=true -Dbuildtype=release -Dtests=disabled > /tmp/fold.log 2>&1 &&
  nice ninja -C build server/ferry >> /tmp/fold.log 2>&1; st "old build rc=$?"; tail -3 /tmp/fold.log > $O/old-build.txt) &
([ -x /tmp/llb/bin/llama-bench ] || bash .peers/build-llama-cpp.sh /tmp/llb > /tmp/llb.log 2>&1; st "llama build rc=$?") &
mkdir -p /tmp/cmp
[ -s /tmp/cmp/F16.gguf ] || python3 tests/gpu/make_quant_gguf.py /tmp/cmp/F16.gguf F16 llama-2-7b > /tmp/mk-F16.log 2>&1
[ -s /tmp/cmp/Q8_0.gguf ] || python3 tests/gpu/make_quant_gguf.py /tmp/cmp/Q8_0.gguf Q8_0 llama-2-7b > /tmp/mk-Q8.log 2>&1
st "files: $(ls -la /tmp/cmp | tr '\n' ' ')"
wait
F=/tmp/fw/build/server/ferry
FO=/tmp/fold/build/server/ferry
st "e2e"
(cd /tmp/fw && FERRY_SRC=/tmp/fw FERRY_TESTDATA=/tmp/shared/testdata timeout 300 ./build/tests/runtime/test_gpu_e2e --jobs 1 --verbose > $O/e2e.txt 2>&1; echo "rc=$?" >> $O/e2e.txt)
st "e2e: $(grep -E 'Synthesis' $O/e2e.txt)"
for r in 1 2; do
  for v in park nopark; do
    if [ $v = nopark ]; then export FERRY_NO_PARK=1; else unset FERRY_NO_PARK; fi
    timeout 200 $F bench --model /tmp/cmp/F16.gguf --gpu-memory 4GiB --batches 1,16 --prefill 512 --decode-steps 16 > $O/f16-4g-$v-r$r.txt 2>&1
    st "f16 $v r$r rc=$? $(grep -E '^prefill' $O/f16-4g-$v-r$r.txt)"
  done
done
unset FERRY_NO_PARK
st "three placements + llama.cpp"
: > /tmp/cmp/results.jsonl
export CMP_FERRY=$F
OUT=$O/cmp CMP_HYBRID_FILES="F16 Q8_0" CMP_MAIN=0 CMP_Q4_4G=0 CMP_CPU=0 CMP_INT4=0 bash tests/gpu/compare_llamacpp.sh bench > $O/cmp.out 2>&1
for r in 1 2; do
  for v in old new; do
    B=$F; [ $v = old ] && B=$FO
    timeout 200 $B bench --model /tmp/cmp/Q8_0.gguf --gpu-memory 4GiB --batches 1,16 --prefill 512 --decode-steps 16 > $O/q8-4g-$v-r$r.txt 2>&1
    st "q8 $v r$r rc=$?"
  done
done
st done
