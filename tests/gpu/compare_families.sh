#!/bin/bash
# compare_families.sh [prepare|bench|cpu] — ferry beside llama.cpp lcp0336 on random-weight files shaped like the
# model families people run now (tests/gpu/make_family_gguf.py, llama.cpp's Q4_K_M mix), in one run: the
# families table of docs/benchmarks.md.
#
#   prepare  on the GPU machine: build ferry (CUDA) and llama.cpp lcp0336 in parallel (tests/gpu/peer_build.sh:
#            the builds of compare_moe.sh, in /tmp/moe/ferry and /tmp/lln, so that one prepare serves both;
#            about 7 minutes when neither is built, most of it llama.cpp's CUDA build, which resumes where it
#            stopped when prepare runs again) and write the files of FAM_MODELS into /tmp/fam (4.7, 6.8 and
#            15.4 GiB: 26, 29 and 79 s on a 2-core VM's disk, beside the builds). Empties the results so far.
#   bench    on the GPU machine: the parts FAM_PARTS (default "resident budget") of each model of FAM_MODELS
#            (default "qwen3-8b gemma3-12b qwen35-27b"), then the table. Results accumulate across bench calls
#            (in /tmp/fam/res) and are brought back after each part, so that they can run as separate commands
#            of under 10 minutes each; estimated on one H100: qwen3-8b about 3 minutes (resident 1, budget 2),
#            gemma3-12b about 3.5, qwen35-27b about 5 (resident 2, budget 3): FAM_MODELS=qwen3-8b and
#            FAM_MODELS=gemma3-12b in one command, FAM_MODELS=qwen35-27b in another.
#   cpu      here, without a GPU: the same side by side on the CPU backend of both (ferry bench --cpu, a CPU
#            build of llama.cpp lcp0336: FAM_LLAMA_CPU, default /tmp/fb_lcp/bin, e.g. cmake -DGGML_CUDA=OFF
#            -DGGML_NATIVE=ON and the targets llama-bench llama-batched-bench) on the files scaled down by
#            FAM_SCALE (default 4), FAM_THREADS threads (default 1), FAM_REPS llama-bench repetitions (default
#            3): decode b=1 and prefill FAM_CPU_PREFILL (default 128) with llama-bench, b=16 with
#            llama-batched-bench where it is built; all models FAM_PASSES times (default 2), the table keeping
#            each side's best (a shared machine's load comes and goes). About 3 minutes on a 2-core VM.
#            Results in $OUT/families-cpu/ (copy to tests/bench/results/families-cpu/).
#
# Parts per model, ferry bench (decode b=1 and b=16 at 32 positions, FAM_STEPS steps (default 24), prefill 512,
# 2,048 for qwen35-27b) beside llama-bench (-fa 1 -p the same -n 64 -r 2: b=1 decode and prefill) and
# llama-batched-bench (-npp 32 -ntg 32 -npl 1,16, one KV pool of 1,024 positions: b=16), the same threads
# (FAM_THREADS, default all cores):
#   resident  everything on the GPU: ferry's default budget; llama.cpp -ngl 99
#   budget    4 GiB (8 GiB for qwen35-27b; FAM_BUDGET_GIB overrides): ferry --gpu-memory; llama-bench at the
#             largest -ngl whose device buffers (model, KV, recurrent state and compute, as it logs them) fit the
#             budget: predicted from the file's layer sizes (make_family_gguf.py --fit-ngl) and the buffers a
#             first run logs, then run until the largest fitting N is measured (four runs at most; a run over
#             the budget is kept and marked); and llama-bench with --fit-target so that --fit sizes the model
#             to the same budget.
# Results: $OUT/llamacpp-families/ (meta.json, results.jsonl, table.md, commands.txt, raw logs; copy the folder to
# tests/gpu/results/ and run docs/make_benchmarks.py), the table also in $OUT/summary.txt.
# Env: FAM_FERRY (a ferry built elsewhere), FAM_COMMIT (the commit measured when the copy has no .git),
# FAM_WORK (files and results, default /tmp/fam), FAM_BUILD (where ferry is built, default /tmp/moe),
# FAM_LLAMA (the llama.cpp CUDA build, default MOE_LLAMA or /tmp/lln), FAM_REBUILD=1 (prepare rebuilds ferry).
set -u
src=$(pwd)
out=${OUT:-$src/out}
mkdir -p "$out"
phase=${1:-bench}
W=${FAM_WORK:-/tmp/fam}
mkdir -p $W
[ -f tests/gpu/deps.sh ] && . tests/gpu/deps.sh
log() { echo "== $*" | tee -a "$out/summary.txt"; }
models=" ${FAM_MODELS:-qwen3-8b gemma3-12b qwen35-27b} "
parts=" ${FAM_PARTS:-resident budget} "
commit=${FAM_COMMIT:-$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)}
if [ "$phase" = cpu ]; then
  W=$W/cpu
  D=$W/res
  R=$out/families-cpu
  F=${FAM_FERRY:-$src/build/server/ferry}
  L=${FAM_LLAMA_CPU:-/tmp/fb_lcp/bin}
  export LD_LIBRARY_PATH=$L${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  nt=${FAM_THREADS:-1}
  scale=${FAM_SCALE:-4}
  steps=${FAM_STEPS:-16}
  reps=${FAM_REPS:-3}
  rm -rf $D
else
  D=$W/res
  R=$out/llamacpp-families
  B=${FAM_BUILD:-/tmp/moe}
  LLN=${FAM_LLAMA:-${MOE_LLAMA:-/tmp/lln}}
  F=${FAM_FERRY:-$B/ferry/build/server/ferry}
  L=$LLN/bin
  nt=${FAM_THREADS:-$(nproc)}
  scale=1
  steps=${FAM_STEPS:-24}
  reps=${FAM_REPS:-2}
fi
mkdir -p $D $W
model_file() { echo $W/$1$([ $scale = 1 ] || echo -s$scale).gguf; }
write_models() {
  local m
  for m in $models; do
    if [ -s $(model_file $m) ]; then
      log "kept $(model_file $m)"
    else
      python3 tests/gpu/make_family_gguf.py $(model_file $m) $m --scale $scale > $W/gguf-$m.log 2>&1 &&
        log "$(cat $W/gguf-$m.log)" ||
        { log "make_family_gguf.py $m FAILED"; tail -5 $W/gguf-$m.log; }
    fi
  done
}

if [ "$phase" = prepare ]; then
  t0=$(date +%s)
  mkdir -p $B
  . tests/gpu/peer_build.sh
  peer_build_start "$src" $B $LLN "${FAM_REBUILD:-${MOE_REBUILD:-0}}" "${MOE_BUILD_LIMIT:-500}"
  write_models
  peer_build_wait $t0
  df -h $W | tail -1 | tee -a "$out/summary.txt"
  rm -rf $D && mkdir -p $D
  exit 0
fi
[ "$phase" = cpu ] && write_models

res=$D/results.jsonl
touch $res
echo "# $(date -u '+%F %T') UTC" >> $D/commands.txt
[ -x "$F" ] || log "no ferry at $F: run prepare (or build it)"
[ -x $L/llama-bench ] || log "no llama-bench in $L: run prepare (or build it)"
if [ "$phase" = cpu ]; then # the machine may be shared: its load beside the figures
  dev="a $(nproc)-core machine without a GPU (load average $(cut -d' ' -f1 /proc/loadavg) at the start)"
else
  dev=$(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | head -1)
fi
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
log "device: $dev; host: $cpu, $(nproc) cores, $(free -g | awk '/^Mem/ {print $2}') GiB; threads $nt"

# rows.py MODE MODEL PART SETTING FILE [BUDGET_MIB]: one results.jsonl row from a tool's output.
cat > $W/rows.py <<'PY'
import json, re, sys
mode, model, part, setting, path = sys.argv[1:6]
budget = float(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[6] else None
r = {"model": model, "part": part, "setting": setting, "decode": {}}


def device_mib(text):
    """llama.cpp's device buffers as it logs them: the last model load's (--fit may log trial loads before it)
    model buffer, plus the largest of its contexts' KV, recurrent-state and compute buffers (a context may log
    two KV caches: the sliding-window layers' and the others')."""
    model, ctxs = 0.0, []
    for line in text.splitlines():
        if "constructing llama_context" in line:
            ctxs.append(0.0)
        m = re.search(r"CUDA0 +(model|KV|RS|compute) buffer size =\s*([\d.]+) MiB", line)
        if not m:
            continue
        if m.group(1) == "model":  # a load (one device buffer each): the last one counts
            model, ctxs = float(m.group(2)), []
        elif ctxs:
            ctxs[-1] += float(m.group(2))
    return round(model + max(ctxs, default=0.0), 1) or None


if mode == "ferry":
    d = json.load(open(path))
    r.update(who="ferry", tool="ferry bench", prefill=d.get("prefill_tok_s") or None,
             prefill_tokens=d.get("prefill_tokens"), vram_mib=round(d.get("vram_taken", 0) / 2**20, 1) or None,
             placement=d.get("placement", "")[:600])
    for x in d["decode"]:
        r["decode"][str(x["batch"])] = x["tok_s"]
        r.setdefault("step_ms", {})[str(x["batch"])] = x["step_ms"]
        r.setdefault("host_layers", {})[str(x["batch"])] = [x.get("cpu_layers", 0), x.get("streamed_layers", 0)]
elif mode == "bench":  # llama-bench -o json on stdout, its -v log beside it (path without .json, .err)
    for x in json.load(open(path)):
        if x["n_prompt"] > 0:
            r["prefill"], r["prefill_tokens"] = x["avg_ts"], x["n_prompt"]
        if x["n_gen"] > 0:
            r["decode"]["1"] = x["avg_ts"]
        r["n_gpu_layers"] = x.get("n_gpu_layers")
    r.update(who="llama.cpp", tool="llama-bench", vram_mib=device_mib(open(path[:-5] + ".err", errors="replace").read()))
else:  # llama-batched-bench's table and log
    t = open(path, errors="replace").read()
    for m in re.finditer(r"^\|\s*(\d+) \|\s*(\d+) \|\s*(\d+) \|\s*\d+ \|\s*[\d.]+ \|\s*([\d.]+) \|\s*[\d.]+ \|\s*([\d.]+) \|",
                         t, re.M):
        r["decode"][m.group(3)] = float(m.group(5))
    r.update(who="llama.cpp", tool="llama-batched-bench", vram_mib=device_mib(t))
    if not r["decode"]:
        raise SystemExit(1)
if budget is not None:
    r["budget_mib"] = budget
    if r.get("vram_mib") is not None:
        r["fits"] = r["vram_mib"] <= budget
print(json.dumps(r))
PY

ferry() { # model part setting args...: one ferry bench
  local m=$1 p=$2 s=$3 c=$1-$2; shift 3
  echo "ferry bench --model $m --threads $nt $* --json" >> $D/commands.txt
  local t=$(date +%s)
  timeout 300 $F bench --model $(model_file $m) --threads $nt "$@" --json > $W/f-$c.json 2> $W/f-$c.err
  local rc=$?
  python3 $W/rows.py ferry $m $p "$s" $W/f-$c.json "${budget_mib:-}" >> $res ||
    log "ferry $c rc=$rc: $(tail -2 $W/f-$c.err)"
  { echo "### $c ($(($(date +%s) - t)) s, rc $rc): $*"; cat $W/f-$c.err; } >> $D/ferry.log
}

llama_bench() { # model part setting tag args...: b=1 decode and prefill; prints the row's device MiB
  local m=$1 p=$2 s=$3 c=$1-$2-$4; shift 4
  echo "llama-bench -m $m -t $nt -fa 1 -p $pp -n 64 -r $reps $* -o json -v" >> $D/commands.txt
  local t=$(date +%s)
  timeout 300 $L/llama-bench -m $(model_file $m) -t $nt -fa 1 -p $pp -n 64 -r $reps "$@" -o json -v \
    > $W/l-$c.json 2> $W/l-$c.err
  local rc=$?
  local row
  row=$(python3 $W/rows.py bench $m $p "$s" $W/l-$c.json "${budget_mib:-}") &&
    echo "$row" >> $res || log "llama-bench $c rc=$rc: $(tail -2 $W/l-$c.err)" >&2
  { echo "### llama-bench $c ($(($(date +%s) - t)) s, rc $rc): $*"
    grep -E "buffer size|llama_params_fit|error" $W/l-$c.err; } >> $D/llama.log
  [ -n "$row" ] && echo "$row" |
    python3 -c 'import json, math, sys; v = json.load(sys.stdin).get("vram_mib"); print(math.ceil(v) if v else "")'
}

llama_batched() { # model part setting args...: b=1 and b=16 at 32 positions
  local m=$1 p=$2 s=$3 c=$1-$2; shift 3
  [ -x $L/llama-batched-bench ] || return 0
  echo "llama-batched-bench -m $m -t $nt -fa on -c 1024 -kvu -npp 32 -ntg 32 -npl 1,16 $*" >> $D/commands.txt
  local t=$(date +%s)
  timeout 300 $L/llama-batched-bench -m $(model_file $m) -t $nt -fa on -c 1024 -kvu -npp 32 -ntg 32 -npl 1,16 "$@" \
    > $W/lb-$c.txt 2>&1
  local rc=$?
  python3 $W/rows.py batched $m $p "$s" $W/lb-$c.txt >> $res || log "llama-batched-bench $c rc=$rc: $(tail -3 $W/lb-$c.txt)"
  { echo "### llama-batched-bench $c ($(($(date +%s) - t)) s, rc $rc): $*"; grep -E "buffer size|^\|" $W/lb-$c.txt; } >> $D/llama.log
}

budget_part() { # model GiB: ferry under the budget; llama-bench at the largest -ngl that fits, and --fit
  local m=$1 gib=$2 budget_mib=$(($2 * 1024))
  log "$m, ${gib} GiB: ferry --gpu-memory ${gib}GiB; llama.cpp at its largest -ngl that fits, and --fit"
  ferry $m ${gib}g "--gpu-memory ${gib}GiB" --gpu-memory ${gib}GiB --batches 1,16 --prefill $pp --decode-steps $steps
  local over=600 n v best= tried=" " i wmib
  n=$(python3 tests/gpu/make_family_gguf.py --fit-ngl $over $budget_mib $m)
  for i in 1 2 3 4; do # run N; from its logged buffers, the overhead beside the weights; the next N to run
    [ "$n" -ge 1 ] || n=1
    tried="$tried$n "
    v=$(llama_bench $m ${gib}g "-ngl $n" ngl$n -ngl $n)
    [ -n "$v" ] || { log "llama-bench -ngl $n logged no device buffers (or failed)"; break; }
    wmib=$(python3 tests/gpu/make_family_gguf.py --fit-ngl-weights $n $m)
    over=$((v - wmib))
    if [ "$v" -le $budget_mib ]; then
      { [ -z "$best" ] || [ "$n" -gt "$best" ]; } && best=$n
    fi
    local next=$(python3 tests/gpu/make_family_gguf.py --fit-ngl $over $budget_mib $m)
    if [ "$v" -le $budget_mib ]; then # fits: one more layer when the measured overhead predicts it fits
      [ "$next" -gt "$n" ] && next=$((n + 1)) || break
    else
      [ "$next" -lt "$n" ] || next=$((n - 1))
    fi
    [[ $tried == *" $next "* ]] && break
    n=$next
  done
  log "$m ${gib} GiB: -ngl tried:$tried-> largest fitting: ${best:-none}"
  local free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
  if [ -n "$free" ] && [ "$free" -gt $budget_mib ]; then # --fit leaves this margin free: the model gets the budget
    llama_bench $m ${gib}g "--fit-target $((free - budget_mib))" fit -fitt $((free - budget_mib)) > /dev/null
  fi
}

publish() { # the results so far into $R (after each part: a call cut short still brings back the parts done)
  mkdir -p "$R" && cp $D/* "$R/"
  python3 - "$R/meta.json" "$dev" "$cpu" "$commit" "$nt" "$phase" "$scale" <<'PY'
import json, sys, time
path, dev, cpu, commit, nt, phase, scale = sys.argv[1:8]
threads = f"{nt} thread" + ("" if nt == "1" else "s")
shapes = ("Qwen3-8B (qwen3: 36 layers, QK-norm), Gemma-3-12B (gemma3: 48 layers, 5 of 6 sliding-window, "
          "sandwich norms, tied 262k vocabulary) and Qwen3.5-27B (qwen35: 64 layers, 3 of 4 gated DeltaNet)")
if phase == "cpu":
    meta = {"title": "Model families on the CPU: small files of the families' structure, beside llama.cpp",
            "command": "bash tests/gpu/compare_families.sh cpu",
            "about": f"Random-weight files with the structure of {shapes}, every width, head count, layer count "
                     f"and the vocabulary divided by {scale} (tests/gpu/make_family_gguf.py --scale {scale}), in "
                     "llama.cpp's Q4_K_M mix. ferry bench --cpu beside a CPU build of llama.cpp lcp0336 "
                     f"(llama-bench -fa 1, llama-batched-bench), {threads} each. On a machine shared with "
                     "other work (its load is given with it) the figures are rough; with more threads than "
                     "free cores, llama.cpp's spinning thread barriers lose the most, so one thread is the "
                     "default here."}
else:
    meta = {"title": "Model families: Qwen3-8B, Gemma-3-12B and Qwen3.5-27B-shaped Q4_K_M beside llama.cpp",
            "command": "bash tests/gpu/compare_families.sh prepare, then bash tests/gpu/compare_families.sh bench "
                       "with FAM_MODELS=\"qwen3-8b gemma3-12b\" and qwen35-27b in turn",
            "about": f"Random-weight files of the shapes of {shapes} in llama.cpp's Q4_K_M mix (4.7, 6.8 and "
                     "15.4 GiB; tests/gpu/make_family_gguf.py). ferry bench (decode at 32 positions, prefill 512, "
                     "2,048 for Qwen3.5) beside llama.cpp lcp0336: llama-bench (-fa 1) for b=1 and prefill, "
                     "llama-batched-bench for b=16, the same threads. All on the GPU: ferry's default budget, "
                     "llama.cpp -ngl 99. Under a budget (4 GiB, 8 GiB for Qwen3.5-27B): ferry --gpu-memory, "
                     "llama.cpp at the largest -ngl whose device buffers (as it logs them) fit, and with --fit "
                     "sized to the budget. The ratio is ferry over llama.cpp's best setting that fits."}
meta.update(date=time.strftime("%Y-%m-%d", time.gmtime()), machine=f"{dev}; host {cpu}, {threads}",
            commit=commit, kind="families")
json.dump(meta, open(path, "w"), indent=2)
PY
  python3 docs/make_benchmarks.py --families-table "$R/results.jsonl" > "$R/table.md"
}

passes=1
[ "$phase" = cpu ] && passes=${FAM_PASSES:-2} # the table keeps each side's best of the passes
for m in $(for i in $(seq $passes); do echo $models; done); do
  pp=512
  [ $m = qwen35-27b ] && pp=2048
  [ "$phase" = cpu ] && pp=${FAM_CPU_PREFILL:-128}
  [ -s $(model_file $m) ] || { log "no $(model_file $m): run prepare"; continue; }
  budget_mib=
  if [ "$phase" = cpu ]; then
    log "$m (1/$scale), CPU backends, -t $nt"
    ferry $m cpu-t$nt "--cpu" --cpu --batches 1,16 --prefill $pp --decode-steps $steps
    llama_bench $m cpu-t$nt "CPU build" cpu > /dev/null
    llama_batched $m cpu-t$nt "CPU build"
    publish
    continue
  fi
  if [[ $parts == *" resident "* ]]; then
    log "$m: everything on the GPU"
    ferry $m resident "default budget" --batches 1,16 --prefill $pp --decode-steps $steps
    llama_bench $m resident "-ngl 99" ngl99 -ngl 99 > /dev/null
    llama_batched $m resident "-ngl 99" -ngl 99
    publish
  fi
  if [[ $parts == *" budget "* ]]; then
    gib=${FAM_BUDGET_GIB:-4}
    [ $m = qwen35-27b ] && gib=${FAM_BUDGET_GIB:-8}
    budget_part $m $gib
    publish
  fi
done
publish
tee -a "$out/summary.txt" < "$R/table.md"
cp "$out/summary.txt" "$R/summary.txt"
