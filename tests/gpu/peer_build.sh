# peer_build.sh — sourced by compare_moe.sh and compare_families.sh on the GPU machine: build ferry (CUDA) and
# llama.cpp lcp0336 (from the carried .peers/ copy of ../shared/peers) in parallel, each kept when already built,
# so that one prepare call serves both scripts (the same directories: ferry in /tmp/moe/ferry, llama.cpp in
# /tmp/lln unless told otherwise).
#
#   peer_build_start SRC FERRY_WORK LLAMA_DIR REBUILD LIMIT_S
#       ferry from the tree SRC into FERRY_WORK/ferry (kept when built, unless REBUILD is 1), llama.cpp into
#       LLAMA_DIR (kept when its llama-bench and llama-batched-bench are there; a build cut short by LIMIT_S
#       resumes where it stopped on the next call). Both run in the background.
#   peer_build_wait T0
#       waits for them and logs how long each took since T0 (seconds since the epoch).
# The caller defines log() (a line to its summary) and $out (where a failed ferry build's log is copied).
peer_build_start() {
  local src=$1 fw=$2 lln=$3 rebuild=$4 limit=$5
  peer_fb= peer_lb= peer_fw=$fw peer_lln=$lln
  if [ -x $fw/ferry/build/server/ferry ] && [ "$rebuild" = 0 ]; then
    log "ferry: kept the build in $fw/ferry (rebuild to replace it)"
  else
    rm -rf $fw/ferry && mkdir -p $fw/ferry
    tar -C "$src" --exclude='./build*' --exclude=./.debs --exclude=./.git --exclude=./.peers --exclude=./.gpu-data \
      --exclude=./.whl --exclude=./out -cf - . | tar -C $fw/ferry -xf -
    (cd $fw/ferry && meson setup build -Dcuda=enabled -Dtests=disabled -Dnative=true && ninja -C build server/ferry) \
      > $fw/ferry-build.log 2>&1 &
    peer_fb=$!
  fi
  if [ -x $lln/bin/llama-bench ] && [ -x $lln/bin/llama-batched-bench ]; then
    log "llama.cpp: kept the build in $lln"
  else # bounded so that this call still reports: a second prepare resumes the build
    [ -f .peers/build-llama-cpp.sh ] || log "no .peers/build-llama-cpp.sh: carry a copy of ../shared/peers as .peers"
    timeout "$limit" bash .peers/build-llama-cpp.sh $lln lcp0336 > $peer_fw/lln-build.log 2>&1 &
    peer_lb=$!
  fi
}

peer_build_wait() {
  local t0=$1
  if [ -n "$peer_fb" ]; then
    wait $peer_fb && log "ferry built ($(($(date +%s) - t0)) s)" ||
      { log "ferry build FAILED"; tail -30 $peer_fw/ferry-build.log; cp $peer_fw/ferry-build.log "$out/"; }
  fi
  if [ -n "$peer_lb" ]; then
    wait $peer_lb && log "llama.cpp lcp0336 built ($(($(date +%s) - t0)) s)" ||
      { log "llama.cpp build not done (rc $?): run prepare again to resume"; tail -5 $peer_fw/lln-build.log; }
  fi
}
