#!/bin/bash
# session 17's device chain: prepare, then the parts in priority order; each part's output under /tmp/o/<part>.
set -u
src=$(pwd); O=/tmp/o; mkdir -p $O
. tests/gpu/deps.sh
st() { echo "[$(date +%T)] $*" >> $O/chain.txt; }
st start
(lscpu; head -3 /proc/meminfo; grep -o 'amx[a-z_0-9]*' /proc/cpuinfo | sort -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv) > $O/host.txt 2>&1
(OUT=/tmp/o/build ALL_TARGETS="server/ferry tests/bench/bench_cpu_matmul" bash tests/gpu/all.sh build > /tmp/fwb.log 2>&1; st "ferry build rc=$?") &
(bash .peers/build-llama-cpp.sh /tmp/llb > /tmp/llb.log 2>&1; st "llama build rc=$?") &
mkdir -p /tmp/cmp
for t in F16 Q8_0 Q4_K_M; do (python3 tests/gpu/make_quant_gguf.py /tmp/cmp/$t.gguf $t llama-2-7b > /tmp/mk-$t.log 2>&1; st "$t rc=$?") & done
wait
ls -la /tmp/cmp >> $O/chain.txt
export CMP_FERRY=/tmp/fw/build/server/ferry
: > /tmp/cmp/results.jsonl
st "f16 hybrid"
OUT=$O/f16 CMP_HYBRID_FILES=F16 CMP_MAIN=0 CMP_Q4_4G=0 CMP_CPU=0 CMP_INT4=0 bash tests/gpu/compare_llamacpp.sh bench > $O/f16.out 2>&1
st "offload"
OUT=$O/off OFFLOAD_TYPES="Q8_0 F16" OFFLOAD_ARGS="--kv-type q8_0" OFFLOAD_TIME=60 bash tests/gpu/offload_kv.sh > $O/off.out 2>&1
cd "$src"
st "cpu"
: > /tmp/cmp/results.jsonl
OUT=$O/cpu CMP_HYBRID=0 CMP_MAIN=0 CMP_Q4_4G=0 CMP_INT4=0 CMP_ROUNDS=2 bash tests/gpu/compare_llamacpp.sh bench > $O/cpu.out 2>&1
st done
