#!/bin/bash
# check.sh — on the GPU machine, in one short call: build only the CUDA tests of the kernels and the engine and
# the ferry binary (sm_90), run them, then the speculative-decoding oracle on the synthetic F16 7B under 4 GiB
# and resident. Each step has its own time limit; a summary goes to stdout and $OUT/summary.txt, logs to $OUT.
# Needs .debs and .gpu-data carried (tests/gpu/run.sh says how they are made). CHECK_STEPS="gpu_e2e ops" (say)
# runs only the named steps (the names of the summary lines; bench_moe, bench_stream, bench_deltanet and spec
# included; "moe bench_moe stream bench_stream gpu_vram gpu_dn_stream gpu_expert_cache": the tiled MoE kernel,
# the stream GEMV, device memory against the budget, streamed DeltaNet layers and the expert cache) and
# CHECK_TARGETS="..." builds only those ninja targets; E2E_FILTER narrows the gpu_e2e step's test filter.
set -u
src=$(pwd)
out=${OUT:-$src/out}
mkdir -p "$out"
t0=$(date +%s)
log() { echo "== [$(($(date +%s) - t0))s] $*" | tee -a "$out/summary.txt"; }
. tests/gpu/deps.sh

W=/tmp/fc
mkdir -p $W
tar -C "$src" --exclude='./build*' --exclude=./.debs --exclude=./out --exclude=./.git --exclude=./.whl \
  --exclude=./.gpu-data -cf - . | tar -C $W -xf -
mkdir -p /tmp/shared && rm -rf /tmp/shared/testdata && cp -r "$src/.gpu-data" /tmp/shared/testdata
cd $W || exit 1
export FERRY_SRC=$W FERRY_TESTDATA=/tmp/shared/testdata
log "$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader)"
meson setup build -Dcuda=enabled -Dgpu_arch=90 -Dbuildtype=release > "$out/build.log" 2>&1 ||
  { log "meson setup FAILED"; tail -30 "$out/build.log"; exit 1; }
targets=${CHECK_TARGETS:-"server/ferry tests/cuda/test_qblock tests/cuda/test_cuda_qk_norm tests/cuda/test_cuda_ops
  tests/cuda/test_cuda_attention tests/cuda/test_cuda_matmul_q tests/runtime/test_gpu_e2e tests/cuda/test_cuda_moe
  tests/bench_cuda/bench_moe tests/cuda/test_cuda_deltanet tests/bench_cuda/bench_deltanet tests/bench_cuda/bench_cuda
  tests/runtime/test_gpu_vram tests/runtime/test_gpu_dn_stream tests/runtime/test_gpu_expert_cache"}
if ! ninja -C build $targets >> "$out/build.log" 2>&1; then
  log "build FAILED"; grep -E "error" "$out/build.log" | head -30; exit 1
fi
log "build ok"
want() { [ -z "${CHECK_STEPS:-}" ] || [[ " $CHECK_STEPS " == *" $1 "* ]]; }
run() { # name limit command...
  local name=$1 lim=$2; shift 2
  want "$name" || return 0
  timeout "$lim" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  log "$name rc=$rc: $(grep -E 'Synthesis' "$out/$name.log" | tail -1)"
  grep -E "\[FAIL\]|Assertion|differs" "$out/$name.log" | head -12
}
run qk_norm 30 ./build/tests/cuda/test_cuda_qk_norm
run matmul_q 60 ./build/tests/cuda/test_cuda_matmul_q --jobs 4
run moe 120 ./build/tests/cuda/test_cuda_moe --jobs 2
run gpu_e2e_moe 120 ./build/tests/runtime/test_gpu_e2e --jobs 1 --filter '*moe*'
# the stream GEMV (KERN_QV_STREAM, not in the automatic choice until measured) and its bench beside the others
run stream 120 ./build/tests/cuda/test_cuda_matmul_q --jobs 8 --filter 'cuda_matmul_q/stream*'
if want bench_stream; then
  timeout 150 ./build/tests/bench_cuda/bench_cuda --stream > "$out/bench_stream.log" 2>&1
  log "bench_stream rc=$?"; tail -24 "$out/bench_stream.log"
fi
run gpu_vram 120 ./build/tests/runtime/test_gpu_vram --jobs 1
run gpu_dn_stream 120 ./build/tests/runtime/test_gpu_dn_stream --jobs 1
run gpu_expert_cache 90 ./build/tests/runtime/test_gpu_expert_cache --jobs 1
if want bench_moe; then
  timeout 120 ./build/tests/bench_cuda/bench_moe > "$out/bench_moe.log" 2>&1; log "bench_moe rc=$?: $(tail -3 "$out/bench_moe.log" | tr '\n' ' ')"
fi
run gpu_e2e 420 ./build/tests/runtime/test_gpu_e2e --jobs 1 --filter "${E2E_FILTER:-*matches_cpu*}"
run gpu_e2e_gemma4_placements 120 ./build/tests/runtime/test_gpu_e2e --jobs 1 --filter '*gemma4_placements*'
run attention 240 ./build/tests/cuda/test_cuda_attention --jobs 2
run deltanet 60 ./build/tests/cuda/test_cuda_deltanet --verbose
if want bench_deltanet; then
  timeout 60 ./build/tests/bench_cuda/bench_deltanet > "$out/bench_deltanet.log" 2>&1; log "bench_deltanet rc=$?"
fi
run ops 40 ./build/tests/cuda/test_cuda_ops
[ -n "${CHECK_SHORT:-}" ] && { log "done (short)"; exit 0; }
run qblock 30 ./build/tests/cuda/test_qblock --jobs 4
want spec && for a in ${SPEC_ACCEPT:-1}; do
  timeout 90 ./build/server/ferry bench --synthetic llama-2-7b --gpu-memory 4GiB --batches 1 --prefill 0 \
    --decode-steps 8 --spec-oracle 4 --spec-accept $a >> "$out/spec.log" 2>&1
  log "spec 4GiB accept $a rc=$?: $(grep -E '^speculative' "$out/spec.log" | tail -1)"
done
if want spec && [ -n "${SPEC_RESIDENT:-}" ]; then
  timeout 90 ./build/server/ferry bench --synthetic llama-2-7b --batches 1 --prefill 0 --decode-steps 16 \
    --spec-oracle 4 >> "$out/spec.log" 2>&1
  log "spec resident rc=$?: $(grep -E '^speculative' "$out/spec.log" | tail -1)"
fi
log "done"
