#!/bin/bash
# session 21 call 1: e2e (parking beside CPU layers, forced plan gpcsccsg/gssssspg); the hybrid part of
# compare_llamacpp.sh with the new one-sequence rows (F16 / Q8_0 4 GiB, Q4_K_M 2 GiB), llama.cpp b4748 beside
set -u
src=$(pwd); O=/tmp/o; rm -rf $O; mkdir -p $O
. tests/gpu/deps.sh
st() { echo "[$(date +%T)] $*" >> $O/chain.txt; }
st start
(lscpu | grep -E "Model|MHz|^CPU\(s\)"; nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv) > $O/host.txt 2>&1
(OUT=/tmp/ob ALL_TARGETS="server/ferry tests/runtime/test_gpu_e2e" bash tests/gpu/all.sh build > $O/build.log 2>&1; st "new build rc=$?") &
([ -x /tmp/llb/bin/llama-bench ] || bash .peers/build-llama-cpp.sh /tmp/llb > /tmp/llb.log 2>&1; st "llama build rc=$?") &
mkdir -p /tmp/cmp
for t in F16 Q8_0 Q4_K_M; do
  [ -s /tmp/cmp/$t.gguf ] || python3 tests/gpu/make_quant_gguf.py /tmp/cmp/$t.gguf $t llama-2-7b > /tmp/mk-$t.log 2>&1
done
st "files: $(ls -la /tmp/cmp/*.gguf | awk '{print $5, $9}' | tr '\n' ' ')"
wait
F=/tmp/fw/build/server/ferry
st "e2e"
(cd /tmp/fw && FERRY_SRC=/tmp/fw FERRY_TESTDATA=/tmp/shared/testdata timeout 300 ./build/tests/runtime/test_gpu_e2e --jobs 1 --verbose > $O/e2e.txt 2>&1; echo "rc=$?" >> $O/e2e.txt)
st "e2e: $(grep -E 'Synthesis' $O/e2e.txt)"
: > /tmp/cmp/results.jsonl
export CMP_FERRY=$F
st "hybrid + one-sequence rows + llama.cpp"
OUT=$O/cmp CMP_MAIN=0 CMP_Q4_4G=0 CMP_CPU=0 CMP_INT4=0 bash tests/gpu/compare_llamacpp.sh bench > $O/cmp.out 2>&1
st "cmp rc=$?"
st done
