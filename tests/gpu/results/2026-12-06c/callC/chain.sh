#!/bin/bash
# session 20 call C: issue 12's served comparison (F16, 4 GiB, 1 and 16 clients) against llama-server -ngl 8
set -u
O=/tmp/o; rm -rf $O; mkdir -p $O
. tests/gpu/deps.sh
st() { echo "[$(date +%T)] $*" >> $O/chain.txt; }
st start
(OUT=/tmp/ob ALL_TARGETS="server/ferry" bash tests/gpu/all.sh build > $O/build.log 2>&1; st "new build rc=$?")
mkdir -p /tmp/cmp/ferry/build/server && ln -sf /tmp/fw/build/server/ferry /tmp/cmp/ferry/build/server/ferry
[ -x /tmp/llb/bin/llama-server ] || { st "no llama-server"; }
OUT=$O/serve FERRY_SERVE_ARGS="--gpu-memory 4GiB --parallel 16 --ctx-size 640" SERVE_BENCH_ARGS="--gpu-memory 4GiB" \
  LLAMA_SERVER_ARGS="-ngl 8 -fa -np 16 -c 10240 -cb" SERVE_LEVELS=1,16 SERVE_REQS=24 bash tests/gpu/serve_compare.sh run > $O/serve.out 2>&1
st "serve rc=$?"
st done
