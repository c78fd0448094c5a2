#!/bin/bash
# all.sh [PHASE...] — on the GPU machine: one build of the working tree as sent (every target, CUDA) in /tmp/fw,
# kept between calls while the machine stays warm, then the phases asked for, in order (default: tests):
#   tests    the cuda and runtime suites (meson), then gpu_e2e --verbose with its diagnostics
#   attn     bench_attn --quick (prefill attention, mixed steps, sampler)
#   quant    bench_cuda (the GEMV/GEMM rows per weight type)
#   hybrid   ferry bench --synthetic llama-2-7b --gpu-memory 4GiB, --placement stream/auto/cpu, b=1 and 16
#   sampling the GPU sampler in `ferry serve` against the host's (tests/gpu/gpu_sampling.py, stories260K)
#   e2e      ferry bench fully resident f16 (b=1/16/64, prefill 512): the regression check against run 6h
#   qfiles   random Llama-2-7B-shaped Q4_K_M and Q8_0 GGUFs (tests/gpu/make_quant_gguf.py, kept in /tmp/cmp):
#            ferry bench on each, fully resident and (Q4_K_M) under --gpu-memory 4GiB
#   cpu      the host's cores: topology, bench_host_layer (one 7B layer per type, 16 and 8 threads),
#            bench_cpu_matmul per type at m = 1, and `ferry bench --cpu` on the random 7B Q4_K_M and Q8_0 files
#   spec     ferry bench --spec-oracle 4 on the synthetic F16 7B under 4 GiB and resident: a 5-row verification
#            step against a 1-row step, and tokens/s at acceptance 1, 0.9, 0.7 and 0.5
#   build    nothing more (ALL_TARGETS="server/ferry" limits what ninja builds)
# Each phase prints a short summary to stdout and $OUT/summary.txt; full logs go to $OUT/<phase>.log (at most 8
# files come back). Needs .debs and .gpu-data carried (see tests/gpu/run.sh).
set -u
src=$(pwd)
out=${OUT:-$src/out}
mkdir -p "$out"
t0=$(date +%s)
log() { echo "== [$(($(date +%s) - t0))s] $*" | tee -a "$out/summary.txt"; }
. tests/gpu/deps.sh

W=/tmp/fw
mkdir -p $W
tar -C "$src" --exclude='./build*' --exclude=./.debs --exclude=./out --exclude=./.git --exclude=./.peers \
  --exclude=./.whl --exclude=./.gpu-data -cf - . | tar -C $W -xf -
mkdir -p /tmp/shared && rm -rf /tmp/shared/testdata && cp -r "$src/.gpu-data" /tmp/shared/testdata
cd $W || exit 1
if [ ! -f build/build.ninja ]; then
  meson setup build -Dcuda=enabled -Dnative=true -Dbuildtype=release > "$out/build.log" 2>&1 ||
    { log "meson setup FAILED"; tail -30 "$out/build.log"; exit 1; }
fi
if ! nice ninja -C build ${ALL_TARGETS:-} >> "$out/build.log" 2>&1; then
  log "build FAILED"; grep -E "error" "$out/build.log" | head -40; exit 1
fi
log "build ok ($(nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader))"
export FERRY_SRC=$W FERRY_TESTDATA=/tmp/shared/testdata

phases=${*:-tests}
for ph in $phases; do
  case $ph in
  build) ;;
  tests)
    meson test -C build --no-rebuild --print-errorlogs --num-processes 2 --suite cuda --suite runtime \
      --suite kernels --suite golden > "$out/tests.log" 2>&1
    log "tests rc=$?: $(grep -E '^(Ok|Fail|Skipped|Timeout):' "$out/tests.log" | tr -s ' ' | tr '\n' ' ')"
    grep -E "^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT)" "$out/tests.log" | head -20
    timeout 400 ./build/tests/runtime/test_gpu_e2e --jobs 1 --verbose > "$out/gpu_e2e.log" 2>&1
    log "gpu_e2e rc=$?"
    grep -E "\[FAIL\]|Assertion|differs|worst|Synthesis" "$out/gpu_e2e.log" | head -40
    grep -E "Assertion|\[FAIL\]" "$out/tests.log" | head -30
    ;;
  attn)
    compute-sanitizer --tool memcheck ./build/tests/cuda/test_cuda_attention --filter='*/mma_first_failure' \
      > "$out/attn.log" 2>&1
    log "memcheck mma_first_failure rc=$?: $(grep -E 'ERROR SUMMARY' "$out/attn.log" | tail -1)"
    timeout 200 ./build/tests/bench_cuda/bench_attn --quick >> "$out/attn.log" 2>&1
    log "bench_attn rc=$?"; tail -40 "$out/attn.log"
    ;;
  quant)
    timeout 240 ./build/tests/bench_cuda/bench_cuda --quant > "$out/quant.log" 2>&1
    log "bench_cuda rc=$?"; sed -n '/^d2d copy/p;/^== best variant/,$p' "$out/quant.log" | head -90
    ;;
  hybrid)
    for pl in "stream" "auto" "auto --cpu-arith int8"; do
      timeout 200 ./build/server/ferry bench --synthetic llama-2-7b --gpu-memory 4GiB --placement $pl \
        --batches 1,16 --prefill 512 --decode-steps 4 >> "$out/hybrid.log" 2>&1
      log "hybrid $pl rc=$?"
    done
    grep -E "^(1|16) |^prefill|^model|cost model" "$out/hybrid.log"
    ;;
  sampling)
    timeout 240 python3 tests/gpu/gpu_sampling.py build/server/ferry "$FERRY_TESTDATA/models/stories260K.gguf" \
      > "$out/sampling.log" 2>&1
    log "gpu_sampling rc=$?"; tail -12 "$out/sampling.log"
    ;;
  spec)
    for a in 1 0.9 0.7 0.5; do
      timeout 200 ./build/server/ferry bench --synthetic llama-2-7b --gpu-memory 4GiB --batches 1 --prefill 0 \
        --decode-steps 12 --spec-oracle 4 --spec-accept $a >> "$out/spec.log" 2>&1
      log "spec 4GiB accept $a rc=$?: $(grep -E '^speculative' "$out/spec.log" | tail -1)"
    done
    timeout 200 ./build/server/ferry bench --synthetic llama-2-7b --batches 1 --prefill 0 --decode-steps 16 \
      --spec-oracle 4 >> "$out/spec.log" 2>&1
    log "spec resident rc=$?: $(grep -E '^speculative' "$out/spec.log" | tail -1)"
    timeout 120 ./build/tests/bench/bench_cpu_matmul -t $(nproc) -m 1,2,5,9 -T Q4_K,Q8_0 -n 11008 -k 4096 \
      --act int8 > "$out/cpu_rows.log" 2>&1
    log "cpu products by rows rc=$?"; tail -9 "$out/cpu_rows.log"
    ;;
  e2e)
    timeout 200 ./build/server/ferry bench --synthetic llama-2-7b --batches 1,16,64 --prefill 512 \
      --decode-steps 16 > "$out/e2e.log" 2>&1
    log "bench f16 resident rc=$?"; grep -vE "^[0-9:.]+ (info|debug)" "$out/e2e.log" | tail -15
    ;;
  qfiles)
    mkdir -p /tmp/cmp
    for t in Q4_K_M Q8_0; do
      [ -s /tmp/cmp/$t.gguf ] || python3 tests/gpu/make_quant_gguf.py /tmp/cmp/$t.gguf $t llama-2-7b || log "make $t failed"
    done
    log "files: $(ls -la /tmp/cmp/*.gguf | awk '{print $5, $9}' | tr '\n' ' ')"
    for c in "Q4_K_M" "Q4_K_M --gpu-memory 4GiB" "Q8_0"; do
      set -- $c
      f=/tmp/cmp/$1.gguf; shift
      timeout 200 ./build/server/ferry bench --model $f "$@" --batches 1,16,64 --prefill 512 --decode-steps 8 \
        >> "$out/qfiles.log" 2>&1
      log "bench $c rc=$?"
    done
    grep -vE "^[0-9:.]+ (info|debug)|^  layers" "$out/qfiles.log" | tail -45
    ;;
  cpu)
    nt=$(nproc)
    { lscpu; echo "nodes: $(ls /sys/devices/system/node 2>/dev/null | tr '\n' ' ')";
      echo "siblings: $(cat /sys/devices/system/cpu/cpu*/topology/thread_siblings_list 2>/dev/null | sort -u | tr '\n' ' ')";
      echo "perf: $(command -v perf)"; } > "$out/cpu.log" 2>&1
    grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA|L2|L3|Flags|nodes:|siblings:|perf:" "$out/cpu.log" | cut -c1-200
    for th in $nt $((nt / 2)); do
      timeout 240 ./build/tests/runtime/bench_host_layer $th >> "$out/cpu.log" 2>&1
      log "bench_host_layer $th rc=$?"
    done
    grep -E "^host|^(F16|BF16|Q8_0|Q4KM)" "$out/cpu.log"
    timeout 200 ./build/tests/bench/bench_cpu_matmul -t 1,$((nt / 2)),$nt -m 1 -T Q8_0,Q4_K,Q6_K -n 11008 -k 4096 \
      --act both > "$out/cpu_matmul.log" 2>&1
    log "bench_cpu_matmul rc=$?"; cat "$out/cpu_matmul.log"
    mkdir -p /tmp/cmp
    for t in Q4_K_M Q8_0; do
      [ -s /tmp/cmp/$t.gguf ] || python3 tests/gpu/make_quant_gguf.py /tmp/cmp/$t.gguf $t llama-2-7b || log "make $t failed"
      for a in int8 f32; do
        timeout 200 ./build/server/ferry bench --model /tmp/cmp/$t.gguf --cpu --threads $nt --cpu-arith $a \
          --batches 1 --prefill 0 --decode-steps 16 >> "$out/cpu_bench.log" 2>&1
        log "ferry bench --cpu $t $a rc=$?: $(grep -E '^1 ' "$out/cpu_bench.log" | tail -1)"
      done
    done
    ;;
  *) log "unknown phase $ph" ;;
  esac
done
log "done"
