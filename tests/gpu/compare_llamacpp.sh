#!/bin/bash
# compare_llamacpp.sh [prepare|bench|all] — on the GPU machine: ferry beside llama.cpp (the peer, built from the
# carried .peers/ copy of ../shared/peers) on the same GGUF files, in one run: the table of docs/benchmarks.md.
#
#   prepare  build ferry (CUDA) and llama.cpp in parallel, write the Llama-2-7B-shaped random Q4_K_M and Q8_0
#            files (tests/gpu/make_quant_gguf.py) into /tmp/cmp                         (about 5 minutes)
#   bench    the measurements; a table last, every raw log under $OUT                  (about 5 minutes)
# The two phases can run in two device calls as long as the machine stays warm (/tmp/cmp survives).
# CMP_FILES="F16" (say) writes only those files (CMP_F16=1 adds F16 to the default two); rows whose file is
# missing are left out, and CMP_HYBRID_FILES="F16" (say) limits the hybrid part to those files. bench runs in
# parts: CMP_MAIN=0, CMP_Q4_4G=0, CMP_HYBRID=0, CMP_CPU=0, CMP_INT4=0 leave a part out (results.jsonl
# accumulates); CMP_1SEQ=0 leaves out the hybrid part's one-sequence rows (b=1 with the KV cache sized for one
# sequence on both sides, as a one-user `ferry serve --parallel 1` sizes it); CMP_1SEQ=only runs only those rows
# where the part has them (Q4_K_M).
# CMP_ROUNDS=N runs the parts that involve the host's cores (Q4_4G, HYBRID, CPU) N times, ferry and llama.cpp
# alternating within each round; the table shows medians and their ranges (the host's figures move by 10-30%
# between calls on these machines: runtime/NOTES.md, 2026-12-02c).
# ferry: `ferry bench` (decode b=1/16/64 as tokens/s of all sequences, prefill 512). llama.cpp: llama-bench
# (-p 512 -n 64, flash attention) for b=1 and prefill, llama-batched-bench (-npp 128 -ntg 64) for b=16/64; the
# 4 GiB case sweeps llama.cpp's -ngl and keeps the largest whose device buffers (model + KV + compute, as it
# logs them) fit in 4 GiB.
set -u
src=$(pwd)
out=${OUT:-$src/out}
mkdir -p "$out"
phase=${1:-all}
W=/tmp/cmp
mkdir -p $W
. tests/gpu/deps.sh
log() { echo "== $*" | tee -a "$out/summary.txt"; }

if [ "$phase" = prepare ] || [ "$phase" = all ]; then
  rm -rf $W/ferry && mkdir -p $W/ferry
  tar -C "$src" --exclude='./build*' --exclude=./.debs --exclude=./.git --exclude=./.peers --exclude=./.gpu-data \
    --exclude=./.whl -cf - . | tar -C $W/ferry -xf -
  (cd $W/ferry && meson setup build -Dcuda=enabled -Dtests=disabled -Dnative=true && ninja -C build server/ferry) \
    > $W/ferry-build.log 2>&1 &
  fb=$!
  bash .peers/build-llama-cpp.sh /tmp/llb > $W/llb-build.log 2>&1 &
  lb=$!
  for t in ${CMP_FILES:-Q4_K_M Q8_0 ${CMP_F16:+F16}}; do
    [ -s $W/$t.gguf ] || python3 tests/gpu/make_quant_gguf.py $W/$t.gguf $t llama-2-7b &
  done
  wait $fb && log "ferry built" || { log "ferry build FAILED"; tail -30 $W/ferry-build.log; cp $W/ferry-build.log "$out/"; }
  wait $lb && log "llama.cpp built" || { log "llama.cpp build FAILED"; tail -20 $W/llb-build.log; }
  wait
  ls -la $W/*.gguf | tee -a "$out/summary.txt"
  : > $W/results.jsonl
fi
[ "$phase" = prepare ] && exit 0

F=${CMP_FERRY:-$W/ferry/build/server/ferry} # (CMP_FERRY: a build made elsewhere, e.g. all.sh's)
L=/tmp/llb/bin
res=$W/results.jsonl # kept across bench calls (prepare empties it): CMP_MAIN=0 / CMP_HYBRID=0 / CMP_INT4=0 split
touch $res
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$out/summary.txt"

ferry() { # name, args...: one ferry bench, its JSON appended to the results
  local name=$1; shift
  timeout 300 $F bench "$@" --json > $W/f-$name.json 2> $W/f-$name.err
  local rc=$?
  python3 - "$name" "$W/f-$name.json" >> $res <<'PY' || log "ferry $name rc=$rc: $(tail -2 $W/f-$name.err)"
import json, sys
d = json.load(open(sys.argv[2]))
print(json.dumps({"who": "ferry", "case": sys.argv[1], "tool": "ferry-bench", "prefill": d.get("prefill_tok_s"),
                  "decode": {str(x["batch"]): x["tok_s"] for x in d["decode"] if x["context"] < 4096},
                  "step_ms": {str(x["batch"]): [x["step_ms"], x.get("predicted_step_ms", 0)]
                              for x in d["decode"] if x["context"] < 4096},
                  "host_pace": d.get("host_pace"), "plan_revisions": d.get("plan_revisions"),
                  "vram_planned": d.get("vram_planned"), "weight_bytes": d.get("weight_bytes"),
                  "placement": d.get("placement", "")[:200]}))
PY
  cat $W/f-$name.err >> "$out/ferry.log"
}

llama_bench() { # name, model, ngl: b=1 decode and prefill 512
  local name=$1 m=$2 ngl=$3
  timeout 300 $L/llama-bench -m $m -ngl $ngl -fa 1 -p 512 -n 64 -r 2 -o json > $W/l-$name.json 2> $W/l-$name.err
  python3 - "$name" "$W/l-$name.json" >> $res <<'PY' || log "llama-bench $name failed: $(tail -2 $W/l-$name.err)"
import json, sys
rows = json.load(open(sys.argv[2]))
r = {"who": "llama.cpp", "case": sys.argv[1], "tool": "llama-bench", "decode": {}}
for x in rows:
    if x["n_prompt"] > 0: r["prefill"] = x["avg_ts"]
    if x["n_gen"] > 0: r["decode"]["1"] = x["avg_ts"]
print(json.dumps(r))
PY
}

llama_batched() { # name, model, ngl, npl list [npp ntg]: generated tokens/s of all sequences, device buffers
  local name=$1 m=$2 ngl=$3 npl=$4 npp=${5:-128} ntg=${6:-64}
  local maxb=${npl##*,}
  timeout 300 $L/llama-batched-bench -m $m -ngl $ngl -fa -c $(((npp + ntg) * maxb)) -npp $npp -ntg $ntg \
    -npl $npl > $W/lb-$name.txt 2>&1
  python3 - "$name" "$W/lb-$name.txt" >> $res <<'PY' || log "llama-batched-bench $name failed: $(tail -3 $W/lb-$name.txt)"
import json, re, sys
t = open(sys.argv[2]).read()
r = {"who": "llama.cpp", "case": sys.argv[1], "tool": "llama-batched-bench", "decode": {}}
for m in re.finditer(r"^\|\s*(\d+) \|\s*(\d+) \|\s*(\d+) \|\s*\d+ \|\s*[\d.]+ \|\s*([\d.]+) \|\s*[\d.]+ \|\s*([\d.]+) \|", t, re.M):
    r["decode"][m.group(3)] = float(m.group(5))
mib = sum(float(x) for x in re.findall(r"CUDA0 (?:model|KV|compute) buffer size =\s*([\d.]+) MiB", t))
r["vram_mib"] = mib
if not r["decode"]: raise SystemExit(1)
print(json.dumps(r))
PY
  cat $W/lb-$name.txt >> "$out/llama.log"
}

Q4=$W/Q4_K_M.gguf Q8=$W/Q8_0.gguf
if [ "${CMP_MAIN:-1}" = 1 ]; then
log "Q4_K_M, all layers on the GPU"
ferry q4-full --model $Q4 --batches 1,16,64 --prefill 512 --decode-steps 16
llama_bench q4-full $Q4 99
llama_batched q4-full $Q4 99 1,16,64
log "Q8_0, all layers on the GPU"
ferry q8-full --model $Q8 --batches 1,16,64 --prefill 512 --decode-steps 16
llama_bench q8-full $Q8 99
llama_batched q8-full $Q8 99 1,16,64
fi
for round in $(seq 1 "${CMP_ROUNDS:-1}"); do
[ "${CMP_ROUNDS:-1}" -gt 1 ] && log "round $round of $CMP_ROUNDS"
if [ "${CMP_Q4_4G:-1}" = 1 ]; then
  # Most of a Q4_K_M 7B fits in 4 GiB. ferry: auto (host layers streamed or on the CPU per step size), cpu (no
  # ring: its two slots become resident layers), both with f32 host arithmetic, and auto with int8 (the
  # default since 2026-12-01c: --cpu-arith auto); llama.cpp: the -ngl sweep
  # up to the largest that fits (both KV pools hold 16 x 48 positions).
  log "Q4_K_M, 4 GiB"
  ferry q4-4g --model $Q4 --cpu-arith f32 --gpu-memory 4GiB --batches 1,16 --prefill 512 --decode-steps 24
  ferry q4-4g-cpu --model $Q4 --cpu-arith f32 --gpu-memory 4GiB --placement cpu --batches 1,16 --prefill 0 --decode-steps 24
  ferry q4-4g-int8 --model $Q4 --gpu-memory 4GiB --cpu-arith int8 --batches 1,16 --prefill 0 --decode-steps 24
  ferry q4-4g-cpu-int8 --model $Q4 --cpu-arith int8 --gpu-memory 4GiB --placement cpu --batches 1,16 --prefill 0 --decode-steps 24
  for ngl in 28 30 31; do llama_batched q4-4g-ngl$ngl $Q4 $ngl 1,16 32 16; done
  # One sequence (a KV pool of 48 positions on both sides): auto weighs the ring against more resident layers.
  ferry q4-1s-auto --model $Q4 --cpu-arith f32 --gpu-memory 4GiB --batches 1 --prefill 0 --decode-steps 24
  ferry q4-1s-int8 --model $Q4 --gpu-memory 4GiB --cpu-arith int8 --batches 1 --prefill 0 --decode-steps 24
  for ngl in 31 32 33; do llama_batched q4-1s-ngl$ngl $Q4 $ngl 1 32 16; done
fi
if [ "${CMP_HYBRID:-1}" = 1 ]; then
  # Under a budget: layers that do not fit, computed by the host's cores or streamed. llama.cpp computes them on the
  # CPU (-ngl: the last N layers on the GPU); its best -ngl whose device buffers fit the budget is the peer.
  # ferry's budget rows decode 24 steps (the median step): auto re-plans after 9 steps when the host runs at
  # another pace than its start-up timing (runtime/step_plan.h); the median step mostly runs the last plan.
  F16=$W/F16.gguf
  hf=" ${CMP_HYBRID_FILES:-F16 Q8_0 Q4_K_M} "
  if [ -s $F16 ] && [[ $hf == *" F16 "* ]]; then
    log "F16, 4 GiB: stream / auto / cpu, and llama.cpp's -ngl sweep"
    ferry f16-4g-stream --model $F16 --gpu-memory 4GiB --placement stream --batches 1,16 --prefill 512 --decode-steps 24
    ferry f16-4g-auto --model $F16 --gpu-memory 4GiB --placement auto --batches 1,16 --prefill 512 --decode-steps 24
    ferry f16-4g-cpu --model $F16 --gpu-memory 4GiB --placement cpu --batches 1,16 --prefill 0 --decode-steps 24
    for ngl in 6 8 10; do llama_batched f16-4g-ngl$ngl $F16 $ngl 1,16 32 16; done
    if [ "${CMP_1SEQ:-1}" != 0 ]; then # one sequence: both sides size their KV for it alone
      ferry f16-1s-auto --model $F16 --gpu-memory 4GiB --batches 1 --prefill 0 --decode-steps 24
      for ngl in 10 11; do llama_batched f16-1s-ngl$ngl $F16 $ngl 1 32 16; done
    fi
  fi
  if [ -s $Q8 ] && [[ $hf == *" Q8_0 "* ]]; then
    log "Q8_0, 4 GiB: auto, and llama.cpp's -ngl sweep"
    ferry q8-4g-auto --model $Q8 --cpu-arith f32 --gpu-memory 4GiB --batches 1,16 --prefill 512 --decode-steps 24
    ferry q8-4g-auto-int8 --model $Q8 --gpu-memory 4GiB --cpu-arith int8 --batches 1,16 --prefill 0 --decode-steps 24
    ferry q8-4g-cpu-int8 --model $Q8 --gpu-memory 4GiB --cpu-arith int8 --placement cpu --batches 1,16 --prefill 0 --decode-steps 24
    for ngl in 15 16 17 18; do llama_batched q8-4g-ngl$ngl $Q8 $ngl 1,16 32 16; done
    if [ "${CMP_1SEQ:-1}" != 0 ]; then
      ferry q8-1s-auto --model $Q8 --gpu-memory 4GiB --batches 1 --prefill 0 --decode-steps 24
      for ngl in 18 19 20; do llama_batched q8-1s-ngl$ngl $Q8 $ngl 1 32 16; done
    fi
  fi
  if [ -s $Q4 ] && [[ $hf == *" Q4_K_M "* ]]; then
    log "Q4_K_M, 2 GiB: auto, and llama.cpp's -ngl sweep"
    if [ "${CMP_1SEQ:-1}" != only ]; then
      ferry q4-2g-auto --model $Q4 --cpu-arith f32 --gpu-memory 2GiB --batches 1,16 --prefill 512 --decode-steps 24
      ferry q4-2g-auto-int8 --model $Q4 --gpu-memory 2GiB --cpu-arith int8 --batches 1,16 --prefill 0 --decode-steps 24
      ferry q4-2g-cpu-int8 --model $Q4 --gpu-memory 2GiB --cpu-arith int8 --placement cpu --batches 1,16 --prefill 0 --decode-steps 24
      for ngl in 13 14 15 16; do llama_batched q4-2g-ngl$ngl $Q4 $ngl 1,16 32 16; done
    fi
    if [ "${CMP_1SEQ:-1}" != 0 ]; then # (-ngl 17 took 2,085 MiB on 2026-12-06: past the budget)
      ferry q4-2g1s-auto --model $Q4 --gpu-memory 2GiB --batches 1 --prefill 0 --decode-steps 24
      for ngl in 15 16; do llama_batched q4-2g1s-ngl$ngl $Q4 $ngl 1 32 16; done
    fi
  fi
fi
if [ "${CMP_CPU:-1}" = 1 ]; then
  # The CPU backend on the host's cores against llama.cpp -ngl 0, the same thread count (decode b=1;
  # ferry with its default x (--cpu-arith auto: int8 on both files since 2026-12-06) and with f32 x).
  nt=$(nproc)
  log "CPU backend, $nt threads: Q4_K_M and Q8_0"
  for t in Q4_K_M Q8_0; do
    c=cpu-$(echo $t | tr 'A-Z_' 'a-z-')
    other=f32
    ferry $c --model $W/$t.gguf --cpu --threads $nt --batches 1 --prefill 0 --decode-steps 16
    ferry $c-$other --model $W/$t.gguf --cpu --threads $nt --cpu-arith $other --batches 1 --prefill 0 \
      --decode-steps 16
    timeout 300 $L/llama-bench -m $W/$t.gguf -ngl 0 -t $nt -p 0 -n 32 -r 2 -o json > $W/l-$c.json 2> $W/l-$c.err
    python3 - "$c" "$W/l-$c.json" >> $res <<'PY' || log "llama-bench $c failed: $(tail -2 $W/l-$c.err)"
import json, sys
rows = json.load(open(sys.argv[2]))
print(json.dumps({"who": "llama.cpp", "case": sys.argv[1], "tool": "llama-bench", "decode": {"1": rows[0]["avg_ts"]}}))
PY
  done
fi
done
if [ "${CMP_INT4:-1}" = 1 ]; then
  log "--quant int4 on random f16 weights of the same shape"
  ferry int4 --synthetic llama-2-7b --quant int4 --batches 1,16 --prefill 512 --decode-steps 16
fi
cp $res "$out/results.jsonl"
cp "$out/summary.txt" /dev/null 2>&1
python3 tests/gpu/compare_table.py $res | tee -a "$out/summary.txt"
