#!/bin/bash
# compare_moe.sh [prepare|bench|all] — on the GPU machine: ferry beside llama.cpp lcp0336 (built from the carried
# .peers/ copy of ../shared/peers) on one random-weight Qwen3-30B-A3B-shaped Q4_K_M GGUF (18.6 GB,
# tests/gpu/make_moe_gguf.py), in one run: the Mixture-of-Experts table of docs/benchmarks.md.
#
#   prepare  build ferry (CUDA) and llama.cpp lcp0336 in parallel and write the file into /tmp/moe (about 7
#            minutes, most of it llama.cpp's CUDA build; a build cut short by the call's time limit resumes
#            where it stopped when prepare runs again)
#   bench    the parts named in MOE_PARTS (default all four: "resident cpu 8g 4g"), then the table. The results
#            accumulate across bench calls (in /tmp/moe/res; prepare empties it) and each part's are brought back
#            as soon as it ends, so the parts can run as separate commands of under 10 minutes:
#            MOE_PARTS="resident cpu" (about 4 minutes), MOE_PARTS=8g (about 4), MOE_PARTS=4g (about 4)
# The phases can run as separate commands on the same machine (/tmp/moe survives between them). The builds
# (tests/gpu/peer_build.sh) are those of compare_families.sh: one prepare of either serves both.
#
# Parts, each ferry bench (decode b=1 and b=16 at 32 positions, prefill 512) beside llama-bench (-p 512 -n 64,
# flash attention: b=1 decode and prefill) and llama-batched-bench (-npp 32 -ntg 32 -npl 1,16, one KV pool of
# 1,024 positions (-kvu): b=16), the same thread count on both sides (MOE_THREADS, default all cores):
#   resident  everything on the GPU: ferry's default budget; llama.cpp -ngl 99
#   cpu       the experts of all 48 layers in host memory, computed by the host's cores (long steps may copy them
#             to the GPU on both sides): ferry --cpu-moe 48; llama.cpp -ngl 99 --n-cpu-moe 48
#   8g        an 8 GiB device budget: ferry --gpu-memory 8GiB (its planner decides); llama.cpp at its best
#             --n-cpu-moe N whose device buffers (model + KV + compute, as it logs them) fit 8 GiB: the N that the
#             logged buffers of the cpu part (or a probe) and the file's per-layer expert bytes predict, then
#             down while a smaller N fits (two steps at most) or up until one fits; and llama-bench with
#             --fit-target set so that --fit sizes the model to the same budget
#   4g        the same at 4 GiB
# Results: $OUT/llamacpp-moe/ (meta.json, results.jsonl, table.md, commands.txt, the raw logs; copy the folder
# to tests/gpu/results/ and run docs/make_benchmarks.py), the table also in $OUT/summary.txt.
# Env: MOE_FERRY (a ferry built elsewhere), MOE_COMMIT (the commit measured, when the device's copy has no .git of it), MOE_STEPS (ferry decode steps,
# default 24), MOE_NCMOE_8G / MOE_NCMOE_4G (the --n-cpu-moe values to sweep instead of the predicted ones),
# MOE_WORK (default /tmp/moe), MOE_LLAMA (the llama.cpp build, default /tmp/lln), MOE_REBUILD=1 (prepare
# rebuilds ferry from this tree: otherwise a build already in /tmp/moe/ferry is kept).
set -u
src=$(pwd)
out=${OUT:-$src/out}
mkdir -p "$out"
phase=${1:-all}
W=${MOE_WORK:-/tmp/moe}
mkdir -p $W
. tests/gpu/deps.sh
log() { echo "== $*" | tee -a "$out/summary.txt"; }
M=$W/qwen3-30b-a3b-Q4_K_M.gguf
LLN=${MOE_LLAMA:-/tmp/lln} # llama.cpp lcp0336, CUDA
D=$W/res # the results so far: results.jsonl, the commands and the raw logs (kept across bench calls)
R=$out/llamacpp-moe # what this call brings back: D, meta.json and the table
mkdir -p $D

if [ "$phase" = prepare ] || [ "$phase" = all ]; then
  t0=$(date +%s)
  . tests/gpu/peer_build.sh
  peer_build_start "$src" $W $LLN "${MOE_REBUILD:-0}" "${MOE_BUILD_LIMIT:-500}"
  if [ -s $M ]; then
    log "kept $M"
  else
    python3 tests/gpu/make_moe_gguf.py $M qwen3-30b-a3b Q4_K_M > $W/gguf.log 2>&1 &&
      log "wrote $M in $(($(date +%s) - t0)) s" || { log "make_moe_gguf.py FAILED"; tail -5 $W/gguf.log; }
  fi
  peer_build_wait $t0
  ls -la $M | tee -a "$out/summary.txt"
  rm -rf $D && mkdir -p $D
fi
[ "$phase" = prepare ] && exit 0

F=${MOE_FERRY:-$W/ferry/build/server/ferry}
L=$LLN/bin
nt=${MOE_THREADS:-$(nproc)}
steps=${MOE_STEPS:-24}
res=$D/results.jsonl
touch $res
echo "# $(date -u '+%F %T') UTC; M = $M" >> $D/commands.txt
[ -x "$F" ] || log "no ferry at $F: run prepare"
[ -x $L/llama-bench ] || log "no llama-bench in $L: run prepare"
[ -s $M ] || { log "no $M: run prepare"; exit 1; }
gpu=$(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | head -1)
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
log "device: $gpu; host: $cpu, $(nproc) cores, $(free -g | awk '/^Mem/ {print $2}') GiB; threads $nt"

# rows.py MODE CASE GROUP SETTING FILE [BUDGET_MIB]: one results.jsonl row from a tool's output.
cat > $W/rows.py <<'PY'
import json, re, sys
mode, case, group, setting, path = sys.argv[1:6]
budget = float(sys.argv[6]) if len(sys.argv) > 6 else None
r = {"case": case, "group": group, "setting": setting, "decode": {}}


def vram(text):  # llama.cpp's device buffers as it logs them: the last model load's (--fit may log trial loads
    # before it), each kind once (llama-bench makes one context a test)
    kinds = {}
    for kind, mib in re.findall(r"CUDA0 +(model|KV|compute) buffer size =\s*([\d.]+) MiB", text):
        if kind == "model":
            kinds = {}
        kinds[kind] = max(kinds.get(kind, 0.0), float(mib))
    return round(sum(kinds.values()), 1) if kinds else None


if mode == "ferry":
    d = json.load(open(path))
    r.update(who="ferry", tool="ferry bench", prefill=d.get("prefill_tok_s") or None,
             vram_mib=round(d.get("vram_taken", 0) / 2**20, 1), vram_planned_mib=round(d.get("vram_planned", 0) / 2**20, 1),
             placement=d.get("placement", "")[:600])
    for x in d["decode"]:
        if x["context"] < 4096:
            r["decode"][str(x["batch"])] = x["tok_s"]
            r.setdefault("step_ms", {})[str(x["batch"])] = [x["step_ms"], x.get("predicted_step_ms", 0)]
            r.setdefault("host_layers", {})[str(x["batch"])] = [x.get("cpu_layers", 0), x.get("streamed_layers", 0)]
elif mode == "bench":  # llama-bench -o json on stdout, -v log beside it (path.err)
    for x in json.load(open(path)):
        if x["n_prompt"] > 0: r["prefill"] = x["avg_ts"]
        if x["n_gen"] > 0: r["decode"]["1"] = x["avg_ts"]
        r["n_gpu_layers"], r["n_cpu_moe"] = x.get("n_gpu_layers"), x.get("n_cpu_moe")
    r.update(who="llama.cpp", tool="llama-bench", vram_mib=vram(open(path[:-5] + ".err", errors="replace").read()))
else:  # llama-batched-bench's table and log
    t = open(path, errors="replace").read()
    for m in re.finditer(r"^\|\s*(\d+) \|\s*(\d+) \|\s*(\d+) \|\s*\d+ \|\s*[\d.]+ \|\s*([\d.]+) \|\s*[\d.]+ \|\s*([\d.]+) \|",
                         t, re.M):
        r["decode"][m.group(3)] = float(m.group(5))
    r.update(who="llama.cpp", tool="llama-batched-bench", vram_mib=vram(t))
    if not r["decode"]: raise SystemExit(1)
if budget is not None and r.get("vram_mib") is not None:
    r["fits"] = r["vram_mib"] <= budget
print(json.dumps(r))
PY

ferry() { # case group setting args...: one ferry bench
  local c=$1 g=$2 s=$3; shift 3
  echo "ferry bench --model M --threads $nt $* --json" >> $D/commands.txt
  timeout 300 $F bench --model $M --threads $nt "$@" --json > $W/f-$c.json 2> $W/f-$c.err
  local rc=$?
  python3 $W/rows.py ferry $c $g "$s" $W/f-$c.json >> $res || log "ferry $c rc=$rc: $(tail -2 $W/f-$c.err)"
  { echo "### $c: $*"; cat $W/f-$c.err; } >> $D/ferry.log
}

llama_bench() { # case group setting budget args...: b=1 decode and prefill 512
  local c=$1 g=$2 s=$3 b=$4; shift 4
  echo "llama-bench -m M -t $nt -fa 1 -p 512 -n 64 -r 2 $* -o json -v" >> $D/commands.txt
  timeout 300 $L/llama-bench -m $M -t $nt -fa 1 -p 512 -n 64 -r 2 "$@" -o json -v > $W/l-$c.json 2> $W/l-$c.err
  local rc=$?
  python3 $W/rows.py bench $c $g "$s" $W/l-$c.json $b >> $res || log "llama-bench $c rc=$rc: $(tail -2 $W/l-$c.err)"
  { echo "### llama-bench $c (rc $rc): $*"; grep -E "buffer size|llama_params_fit|fit|n_cpu_moe|error" $W/l-$c.err; } >> $D/llama.log
}

llama_batched() { # case group setting budget args...: b=1 and b=16 at 32 positions
  local c=$1 g=$2 s=$3 b=$4; shift 4
  echo "llama-batched-bench -m M -t $nt -fa on -c 1024 -kvu -npp 32 -ntg 32 -npl 1,16 -lv 4 $*" >> $D/commands.txt
  timeout 300 $L/llama-batched-bench -m $M -t $nt -fa on -c 1024 -kvu -npp 32 -ntg 32 -npl 1,16 -lv 4 "$@" \
    > $W/lb-$c.txt 2>&1
  local rc=$?
  python3 $W/rows.py batched $c $g "$s" $W/lb-$c.txt $b >> $res || log "llama-batched-bench $c rc=$rc: $(tail -3 $W/lb-$c.txt)"
  { echo "### llama-batched-bench $c (rc $rc): $*"; grep -E "buffer size|^\|" $W/lb-$c.txt; } >> $D/llama.log
}

row_vram() { # case tool: the device MiB (rounded up) of the row measured last for them; nothing when none
  python3 - "$1" "$2" $res <<'PY'
import json, math, sys
v = [r["vram_mib"] for r in map(json.loads, open(sys.argv[3])) if r["case"] == sys.argv[1] and r["tool"] == sys.argv[2]
     and r.get("vram_mib")]
if v: print(math.ceil(v[-1]))
PY
}

fits_at() { # N (in budget_part): llama-batched-bench at --n-cpu-moe N; true when its device buffers fit
  llama_batched ${gib}g-ncmoe$1 ${gib}g "--n-cpu-moe $1" $mib -ngl 99 --n-cpu-moe $1
  local v=$(row_vram ${gib}g-ncmoe$1 llama-batched-bench)
  [ -n "$v" ] && [ "$v" -le $mib ]
}

predict_ncmoe() { # (in budget_part) the smallest N predicted to fit: the device MiB with every expert on the
  # host (the cpu part's, or a probe's) plus the file's expert bytes of layers N..47; sets pred
  local base=$(row_vram cpu-moe48 llama-batched-bench)
  if [ -z "$base" ]; then
    llama_batched probe48 probe "--n-cpu-moe 48" $mib -ngl 99 --n-cpu-moe 48
    base=$(row_vram probe48 llama-batched-bench)
  fi
  pred=$(python3 tests/gpu/make_moe_gguf.py --fit-ncmoe "${base:-1500}" $mib qwen3-30b-a3b Q4_K_M)
  log "predicted --n-cpu-moe $pred for ${gib} GiB (all experts on the host: ${base:-?} MiB on the device)"
}

budget_part() { # GiB: ferry under the budget; llama.cpp's --n-cpu-moe sweep and --fit at the same budget
  local gib=$1 mib=$(($1 * 1024)) list
  log "${gib} GiB: ferry --gpu-memory ${gib}GiB; llama.cpp --n-cpu-moe N swept, and --fit"
  ferry ${gib}g ${gib}g "--gpu-memory ${gib}GiB" --gpu-memory ${gib}GiB --batches 1,16 --prefill 512 \
    --decode-steps $steps
  local var=MOE_NCMOE_${gib}G
  list=${!var:-}
  local best= n
  if [ -n "$list" ]; then
    for n in $list; do fits_at $n && { [ -z "$best" ] || [ "$n" -lt "$best" ]; } && best=$n; done
  else # the predicted N, then down while a smaller one fits, or up until one fits (a few steps each)
    predict_ncmoe
    n=$pred
    if fits_at $n; then
      best=$n
      while [ $n -gt 0 ] && [ $n -gt $((pred - 2)) ] && fits_at $((n - 1)); do n=$((n - 1)) best=$n; done
    else
      while [ $n -lt 48 ] && [ -z "$best" ] && [ $n -lt $((pred + 3)) ]; do
        n=$((n + 1))
        fits_at $n && best=$n
      done
    fi
  fi
  if [ -n "$best" ]; then # the fitting N with the most experts on the GPU; b=1 and prefill with llama-bench
    llama_bench ${gib}g-ncmoe$best ${gib}g "--n-cpu-moe $best" $mib -ngl 99 -ncmoe $best
    local v=$(row_vram ${gib}g-ncmoe$best llama-bench)
    if [ -n "$v" ] && [ "$v" -gt $mib ] && [ "$best" -lt 48 ]; then # (its buffers differ from batched-bench's)
      best=$((best + 1))
      llama_bench ${gib}g-ncmoe$best ${gib}g "--n-cpu-moe $best" $mib -ngl 99 -ncmoe $best
    fi
  else
    log "no --n-cpu-moe tried fits ${gib} GiB"
  fi
  local free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
  if [ -n "$free" ] && [ "$free" -gt $mib ]; then # --fit leaves this margin free: the model gets the budget
    llama_bench ${gib}g-fit ${gib}g "--fit-target $((free - mib))" $mib -fitt $((free - mib))
  fi
}

commit=${MOE_COMMIT:-$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)}
publish() { # the results so far into $R (after each part: a call cut short still brings back the parts done)
  mkdir -p "$R" && cp $D/* "$R/"
  python3 - "$R/meta.json" "$gpu" "$cpu" "$commit" "$nt" <<'PY'
import json, sys, time
path, gpu, cpu, commit, nt = sys.argv[1:6]
json.dump({
    "title": "Mixture of Experts: Qwen3-30B-A3B-shaped Q4_K_M, beside llama.cpp's --n-cpu-moe and --fit",
    "date": time.strftime("%Y-%m-%d", time.gmtime()),
    "machine": f"{gpu}; host {cpu}, {nt} threads",
    "commit": commit,
    "command": "bash tests/gpu/compare_moe.sh prepare, then bash tests/gpu/compare_moe.sh bench with MOE_PARTS="
               "\"resident cpu\", 8g and 4g in turn",
    "about": "A random-weight file of Qwen3-30B-A3B's shape (48 layers, 128 experts of which 8 per token, expert "
             "FFN 768) in llama.cpp's Q4_K_M mix, 18.6 GB (tests/gpu/make_moe_gguf.py). ferry bench (decode at "
             "32 positions, prefill 512) beside llama.cpp lcp0336: llama-bench for b=1 and prefill 512, "
             "llama-batched-bench for b=16, the same threads. All on the GPU: ferry's default budget, llama.cpp "
             "-ngl 99. Experts on the host: every layer's experts in host memory (ferry --cpu-moe 48, llama.cpp "
             "--n-cpu-moe 48). Under a budget: ferry --gpu-memory, llama.cpp at the --n-cpu-moe N around the "
             "largest share of experts on the GPU whose device buffers (as it logs them) fit, and with --fit "
             "sized to the budget. The ratio is ferry over llama.cpp's best setting that fits, column by column.",
    "kind": "moe",
}, open(path, "w"), indent=2)
PY
  python3 docs/make_benchmarks.py --moe-table "$R/results.jsonl" > "$R/table.md"
}

parts=" ${MOE_PARTS:-resident cpu 8g 4g} "
if [[ $parts == *" resident "* ]]; then
  log "everything on the GPU"
  ferry resident resident "default budget" --batches 1,16 --prefill 512 --decode-steps $steps
  llama_bench resident resident "-ngl 99" "" -ngl 99
  llama_batched resident resident "-ngl 99" "" -ngl 99
  publish
fi
if [[ $parts == *" cpu "* ]]; then
  log "the experts of all 48 layers on the host's cores"
  ferry cpu-moe48 cpu "--cpu-moe 48" --cpu-moe 48 --batches 1,16 --prefill 512 --decode-steps $steps
  llama_bench cpu-moe48 cpu "--n-cpu-moe 48" "" -ngl 99 -ncmoe 48
  llama_batched cpu-moe48 cpu "--n-cpu-moe 48" "" -ngl 99 --n-cpu-moe 48
  publish
fi
for gib in 8 4; do
  if [[ $parts == *" ${gib}g "* ]]; then budget_part $gib; publish; fi
done
publish
tee -a "$out/summary.txt" < "$R/table.md"
cp "$out/summary.txt" "$R/summary.txt"
