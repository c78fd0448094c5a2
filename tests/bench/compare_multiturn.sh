#!/bin/bash
# compare_multiturn.sh [BUILD_DIR] — time to first token over a multi-turn chat on a model with gated DeltaNet
# layers, ferry serve beside llama.cpp lcp0336's llama-server, CPU only, in one run: what the prompt cache with
# state checkpoints gives each turn. Writes $RESULTS (default tests/bench/results/multiturn-cpu): commands.txt,
# results.jsonl (one record a turn, tests/server/multiturn_ttft.py's), the servers' logs, meta.json and table.md
# (tests/bench/multiturn_table.py, which makes it again from the other two).
#
# The model: a random-weight Qwen3.5-27B-shaped Q4_K_M file divided by SCALE (default 4: 16 layers, 12 of them
# gated DeltaNet, dim 1280; tests/gpu/make_family_gguf.py --scale), written to $WORK (default /tmp/multiturn)
# once. Its vocabulary is synthetic (make_quant_gguf.py's), so the prompts' words are spelled in byte tokens.
# Both servers render the chat with the ChatML template (--chat-template chatml), which is Qwen3.5's without
# its thinking block (a random-weight file carries no template of its own).
#
# Four settings, each a fresh server: ferry (its defaults: prompt cache on, --ctx-checkpoints 32), ferry
# --prompt-cache=false, llama-server (its defaults: cache_prompt on, --ctx-checkpoints 32, --cache-ram 8192)
# and llama-server with cache_prompt false in every request. Each runs two conversations
# (multiturn_ttft.py): "chat", 8 user messages of 500 tokens, and "agent", a 3,000-token system prompt with a
# tool list, a 500-token first message and 7 messages of 50 tokens; max_tokens 16, temperature 0.
# THREADS: the threads of both servers (default 2, or 1 when the load average is 1.5 or more at the start: on
# a shared machine a second thread spins against other work). LLAMA_CPU: a directory with a CPU build of
# llama-server from lcp0336 (default /tmp/fb_lcp/bin; when it has none, lcp0336 is built into /tmp/lcp0336-cpu
# from ../shared/peers/llama.cpp-lcp0336.tar.gz, about 20 minutes on 2 cores).
#
#   bash tests/bench/compare_multiturn.sh [build]
set -u
cd "$(dirname "$0")/../.."
build=${1:-build}
F=$build/server/ferry
[ -x "$F" ] || { echo "no $F: build ferry first"; exit 1; }
R=${RESULTS:-tests/bench/results/multiturn-cpu}
W=${WORK:-/tmp/multiturn}
scale=${SCALE:-4}
turns=${TURNS:-8}
max_tokens=${MAX_TOKENS:-16}
ctx=${CTX:-16384}
load0=$(cut -d' ' -f1 /proc/loadavg)
date0=$(date -u '+%F %T')
if [ -z "${THREADS:-}" ]; then
  THREADS=2
  awk -v l="$load0" 'BEGIN { exit !(l >= 1.5) }' && THREADS=1
fi
mkdir -p "$W" "$R"

L=${LLAMA_CPU:-/tmp/fb_lcp/bin}
if [ ! -x "$L/llama-server" ]; then
  src=/tmp/llama.cpp-lcp0336
  L=/tmp/lcp0336-cpu/bin
  if [ ! -x $L/llama-server ]; then
    [ -f $src/CMakeLists.txt ] ||
      { mkdir -p $src && tar -xzf ../shared/peers/llama.cpp-lcp0336.tar.gz -C $src --strip-components=1; } || exit 1
    echo "building llama-server (lcp0336, CPU) into /tmp/lcp0336-cpu: /tmp/lcp0336-cpu.log"
    nice cmake -S $src -B /tmp/lcp0336-cpu -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release > /tmp/lcp0336-cpu.log 2>&1 &&
      nice cmake --build /tmp/lcp0336-cpu --target llama-server -j "$(nproc)" >> /tmp/lcp0336-cpu.log 2>&1 ||
      { echo "llama.cpp build failed (/tmp/lcp0336-cpu.log)"; exit 1; }
  fi
fi
# which source the llama.cpp build came from (its CMake cache names it)
lsrc=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$L/../CMakeCache.txt" 2>/dev/null)

M=$W/qwen35-27b-s$scale.gguf
[ -s "$M" ] || python3 tests/gpu/make_family_gguf.py "$M" qwen35-27b --scale "$scale" || exit 1

res=$R/results.jsonl
: > "$res"
: > "$R/commands.txt"
echo "# $date0 UTC, threads $THREADS, load average $load0" >> "$R/commands.txt"
port=${PORT:-18230}
srv_pid=

wait_up() { # wait_up URL LOG: until /health answers 200
  for _ in $(seq 1 240); do
    curl -sf "$1/health" > /dev/null 2>&1 && return 0
    kill -0 "$srv_pid" 2> /dev/null || { echo "server exited: $(tail -3 "$2")"; return 1; }
    sleep 0.5
  done
  echo "server did not come up: $(tail -3 "$2")"
  return 1
}

stop_srv() {
  [ -n "$srv_pid" ] && kill "$srv_pid" 2> /dev/null && wait "$srv_pid" 2> /dev/null
  srv_pid=
}
trap stop_srv EXIT

# setting NAME LOG CLIENT_ARGS -- SERVER COMMAND...: start the server, run both conversations, stop it
setting() {
  local name=$1 log=$R/$2 cargs=$3
  shift 4
  echo "$*" >> "$R/commands.txt"
  "$@" > "$log" 2>&1 &
  srv_pid=$!
  wait_up "http://127.0.0.1:$port" "$log" || { stop_srv; return 1; }
  for v in chat agent; do
    local c="python3 tests/server/multiturn_ttft.py --url http://127.0.0.1:$port --variant $v --turns $turns"
    c="$c --max-tokens $max_tokens --label $name $cargs --jsonl $res"
    echo "  $c" >> "$R/commands.txt"
    echo "== $name, $v (load $(cut -d' ' -f1 /proc/loadavg))"
    $c || echo "$name $v FAILED"
  done
  stop_srv
}

fargs=(serve --model "$M" --backend cpu --threads "$THREADS" --ctx-size "$ctx" --chat-template chatml
  --host 127.0.0.1 --port "$port")
largs=(-m "$M" -t "$THREADS" -c "$ctx" --chat-template chatml --host 127.0.0.1 --port "$port")
setting ferry ferry.log "" -- "$F" "${fargs[@]}"
setting llama.cpp llama.log "" -- "$L/llama-server" "${largs[@]}"
setting ferry-nocache ferry-nocache.log "" -- "$F" "${fargs[@]}" --prompt-cache=false
setting llama.cpp-nocache llama-nocache.log "--no-cache-prompt" -- "$L/llama-server" "${largs[@]}"
load1=$(cut -d' ' -f1 /proc/loadavg)

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
lver=$("$L/llama-server" --version 2>&1 | grep -m1 version)
python3 - "$R/meta.json" <<PY
import json, sys
json.dump({"title": "Multi-turn chat on the CPU: time to first token with the prompt cache and state checkpoints",
           "command": "bash tests/bench/compare_multiturn.sh", "date": "$date0 UTC",
           "machine": "a $(nproc)-core machine without a GPU ($cpu), load average $load0 at the start, $load1 at the end",
           "threads": $THREADS, "commit": "$(git rev-parse --short HEAD)",
           "model": "random-weight Qwen3.5-27B shape / $scale (tests/gpu/make_family_gguf.py qwen35-27b --scale $scale), Q4_K_M",
           "llama_cpp": "llama-server $lver, built from ${lsrc:-unknown source} (CPU)",
           "max_tokens": $max_tokens, "turns": $turns}, open(sys.argv[1], "w"), indent=2)
PY
python3 tests/bench/multiturn_table.py "$R"
