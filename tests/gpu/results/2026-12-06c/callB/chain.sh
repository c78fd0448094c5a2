#!/bin/bash
# session 20 call B: Q4_K_M 2 GiB auto vs llama.cpp's -ngl sweep; the CPU backend (Q4_K_M, Q8_0) vs llama.cpp -ngl 0
set -u
src=$(pwd); O=/tmp/o; rm -rf $O; mkdir -p $O
. tests/gpu/deps.sh
st() { echo "[$(date +%T)] $*" >> $O/chain.txt; }
st start
(lscpu | grep -E "Model|MHz|^CPU\(s\)"; nvidia-smi --query-gpu=name,memory.total --format=csv) > $O/host.txt 2>&1
(OUT=/tmp/ob ALL_TARGETS="server/ferry" bash tests/gpu/all.sh build > $O/build.log 2>&1; st "new build rc=$?") &
([ -x /tmp/llb/bin/llama-bench ] || bash .peers/build-llama-cpp.sh /tmp/llb > /tmp/llb.log 2>&1; st "llama build rc=$?") &
mkdir -p /tmp/cmp
for t in Q4_K_M Q8_0; do
  [ -s /tmp/cmp/$t.gguf ] || python3 tests/gpu/make_quant_gguf.py /tmp/cmp/$t.gguf $t llama-2-7b > /tmp/mk-$t.log 2>&1
done
st "files: $(ls -la /tmp/cmp | tr '\n' ' ')"
wait
F=/tmp/fw/build/server/ferry
: > /tmp/cmp/results.jsonl
export CMP_FERRY=$F
st "Q4_K_M 2 GiB + CPU backend, with llama.cpp"
OUT=$O/cmp CMP_HYBRID_FILES="Q4_K_M" CMP_MAIN=0 CMP_Q4_4G=0 CMP_INT4=0 bash tests/gpu/compare_llamacpp.sh bench > $O/cmp.out 2>&1
st done
