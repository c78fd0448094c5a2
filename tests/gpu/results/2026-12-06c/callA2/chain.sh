#!/bin/bash
# session 20 call A2 (warm machine): test_gpu_e2e again after the forced plan's fix (its resident layers must
# match across step sizes)
set -u
O=/tmp/o; rm -rf $O; mkdir -p $O
. tests/gpu/deps.sh
st() { echo "[$(date +%T)] $*" >> $O/chain.txt; }
st start
(OUT=/tmp/ob ALL_TARGETS="server/ferry tests/runtime/test_gpu_e2e" bash tests/gpu/all.sh build > $O/build.log 2>&1; st "new build rc=$?")
st "tree has the fix: $(grep -c gssssspg /tmp/fw/tests/runtime/test_gpu_e2e.c)"
touch /tmp/fw/tests/runtime/test_gpu_e2e.c && ninja -C /tmp/fw/build tests/runtime/test_gpu_e2e > $O/ninja.log 2>&1; st "ninja rc=$?"
(cd /tmp/fw && FERRY_SRC=/tmp/fw FERRY_TESTDATA=/tmp/shared/testdata timeout 300 ./build/tests/runtime/test_gpu_e2e --jobs 1 --verbose > $O/e2e.txt 2>&1; echo "rc=$?" >> $O/e2e.txt)
st "e2e: $(grep -E 'Synthesis' $O/e2e.txt)"
st done
