#!/bin/bash
# compare_types.sh [--cuda] [BUILD_DIR] — ferry's matrix products per stored weight type beside llama.cpp lcp0336's
# on the same shape, threads and device: the README's "Quantization types" rates and docs/benchmarks.md's "Weight
# types" table. One product y (m, 4096) = x (m, 14336) · Wᵀ, W 4096 x 14336 in each type (Llama-3-8B's FFN down
# projection; the MUL_MAT shape of test-backend-ops' perf mode, whose cases are picked with -p), m = 1 (decode)
# and 8. Both sides re-read one weight matrix, as test-backend-ops does (types under the last-level cache size,
# 32 MiB on small CPUs and 50 MB of L2 on an H100, are read partly from it); the rate is µs per product and GB/s
# of weight bytes.
#   CPU (default): tests/bench/bench_cpu_matmul --hot (median of 20 calls, m = 1; of 8, m = 8; x in f32 and in
#     int8) beside test-backend-ops perf -b CPU (the mean of >= 1 s of runs). test-backend-ops runs
#     nproc / 2 threads, and so does ferry here. Build: llama.cpp's ggml (CPU, GGML_NATIVE) into $LCP_BUILD and
#     test-backend-ops compiled against it (about 10 minutes on 2 cores, once); each round about 11 minutes on a
#     busy 2-core machine.
#   --cuda: tests/bench_cuda/bench_cuda --types (kern_cuda_matmul's automatic choice, graph-timed, one weight
#     copy) beside test-backend-ops perf -b CUDA0, on the GPU machine from the repository root with .debs and
#     .peers carried (tests/gpu/deps.sh, tests/gpu/compare_llamacpp.sh). BUILD_DIR is configured here when it is
#     not yet (meson setup -Dcuda=enabled -Dgpu_arch=90; only bench_cuda is built); llama.cpp's ggml (CUDA sm_90, no
#     FlashAttention) is built beside it in parallel, and test-backend-ops compiled meanwhile (estimated 4-7
#     minutes on a 16-core host, not measured; give LCP_BUILD an existing lcp0336 build, e.g. the one
#     .peers/build-llama-cpp.sh makes, to skip ggml). Commands there are limited to 10 minutes, so build in one
#     call and measure in the next on the same warm machine (each round an estimated 2-4 minutes: most of
#     test-backend-ops' time is quantizing its random 4096 x 14336 matrices on the host, twice per type):
#       ROUNDS=0 bash tests/bench/compare_types.sh --cuda build-cuda          (builds llama.cpp's ggml and bench_cuda)
#       ROUNDS=2 RESULTS=$OUT/types-cuda bash tests/bench/compare_types.sh --cuda build-cuda
#     The measuring call reuses the bench_cuda the first call built (REBUILD=1 runs ninja again), and writes
#     results.jsonl and meta.json after every round, so a call cut short keeps the rounds it finished. Then copy
#     types-cuda into tests/gpu/results/ and run docs/make_benchmarks.py.
# ROUNDS rounds (default 3) alternate the two sides, each logging the load average; results.jsonl keeps every
# round and the table shows each side's best. Writes $RESULTS (default tests/gpu/results/types-cpu or
# types-cuda): meta.json, results.jsonl and the raw logs; then run python3 docs/make_benchmarks.py.
#
#   bash tests/bench/compare_types.sh [build]            (TYPES="Q4_0 Q8_0" to measure fewer types)
set -u
cd "$(dirname "$0")/../.."
dev=cpu
[ "${1:-}" = --cuda ] && { dev=cuda; shift; }
build=${1:-build}
script_args="$*" # (for meta.json's command)
rounds=${ROUNDS:-3}
types=${TYPES:-"F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4 NVFP4 IQ3_S IQ3_XXS IQ2_S IQ2_XS IQ2_XXS IQ1_M IQ1_S"}
threads=$(($(nproc) / 2))
[ $threads -ge 1 ] || threads=1
R=${RESULTS:-tests/gpu/results/types-$dev}
L=${LCP_BUILD:-/tmp/lcp0336-ops-$dev}
src=${LCP_SRC:-/tmp/llama.cpp-lcp0336}
export PATH=$PATH:/usr/local/cuda/bin
[ -f tests/gpu/deps.sh ] && . tests/gpu/deps.sh # the carried .debs on a machine without package access
t0=$(date +%s)
el() { echo "$(($(date +%s) - t0))s"; }

if [ $dev = cuda ]; then
  F="$build/tests/bench_cuda/bench_cuda --types"
  backend=CUDA0
else
  F="$build/tests/bench/bench_cpu_matmul -t $threads -m 1,8 -n 4096 -k 14336 --hot --no-ceiling --act both --plain f32"
  backend=CPU
fi
bin=${F%% *}

# ferry: configure BUILD_DIR when needed and build the bench, in the background (the GPU machine builds both sides
# at once); a measuring --cuda call keeps the bench the build call made.
build_ferry() {
  if [ ! -f "$build/build.ninja" ]; then
    local opts=(-Dbuildtype=release)
    [ $dev = cuda ] && opts+=(-Dcuda=enabled -Dgpu_arch=90 -Dtests=disabled -Dserver=disabled) # H100, H200
    meson setup "$build" "${opts[@]}" > /tmp/compare_types.setup.log 2>&1 ||
      { tail -20 /tmp/compare_types.setup.log; echo "meson setup $build failed"; return 1; }
  fi
  nice ninja -C "$build" "${bin#"$build"/}" > /tmp/compare_types.ninja.log 2>&1 ||
    { tail -20 /tmp/compare_types.ninja.log; echo "building $bin failed"; return 1; }
}
fb=
if [ $dev = cuda ] && [ "$rounds" -gt 0 ] && [ -x "$bin" ] && [ -z "${REBUILD:-}" ]; then
  echo "using $bin as built $(date -r "$bin" '+%F %T')"
else
  build_ferry &
  fb=$!
fi

# llama.cpp: ggml (the CPU backend, or CPU and CUDA) and test-backend-ops, which needs nothing else of llama.cpp:
# its object compiles while ggml builds, and is linked against it.
if [ ! -x "$L/bin/test-backend-ops" ]; then
  tarball=$(ls ../shared/peers/llama.cpp-lcp0336.tar.gz .peers/llama.cpp-lcp0336.tar.gz 2> /dev/null | head -1)
  [ -f $src/CMakeLists.txt ] || { mkdir -p $src && tar -xzf "$tarball" -C $src; } ||
    { echo "no llama.cpp-lcp0336.tar.gz in ../shared/peers or .peers"; exit 1; }
  mkdir -p "$L/bin"
  nice g++ -O2 -std=c++17 -I$src/ggml/include -c $src/tests/test-backend-ops.cpp -o "$L/test-backend-ops.o" \
    > "$L.tbo.log" 2>&1 &
  tb=$!
  if ! ls "$L"/bin/libggml.so > /dev/null 2>&1; then
    cuda=(-DGGML_CUDA=OFF)
    [ $dev = cuda ] && cuda=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF)  # no attention
    nice cmake -S $src -B "$L" "${cuda[@]}" -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release > "$L.cmake.log" 2>&1 &&
      nice cmake --build "$L" --target ggml -j "$(nproc)" > "$L.build.log" 2>&1 ||
      { tail -20 "$L.build.log"; echo "llama.cpp ggml build failed ($L.build.log)"; exit 1; }
    echo "llama.cpp ggml built ($(el))"
  fi
  wait $tb || { tail -20 "$L.tbo.log"; echo "test-backend-ops build failed"; exit 1; }
  nice g++ "$L/test-backend-ops.o" -o "$L/bin/test-backend-ops" -L"$L/bin" -lggml -lggml-base \
    -Wl,-rpath,"$L/bin" -lpthread || { echo "test-backend-ops link failed"; exit 1; }
fi
if [ -n "$fb" ]; then
  wait $fb || exit 1
  echo "$bin built ($(el))"
fi
[ "$rounds" -gt 0 ] || { echo "built; ROUNDS=0: nothing measured"; exit 0; }

# test-backend-ops' names: lower case but the K of the K-quants.
alt=$(echo $types | tr 'A-Z ' 'a-z|' | sed 's/_k/_K/g')
pattern="type_a=($alt),type_b=f32,m=4096,n=(1|8),k=14336,bs=\[1,1\],nr=\[1,1\],per=\[0,1,2,3\],k_v=0,o=1,"

# results.jsonl and meta.json from the rounds done so far (summarize N): rewritten after every round.
summarize() {
# One row per round, side, type, arithmetic and m: µs per product, GB/s of weight bytes (ferry's bytes per
# matrix for both: the same type and shape), the load average at the start of the side's round.
python3 - "$R" "$1" "$dev" << 'EOF'
import json, re, sys
R, rounds, dev = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows, wbytes = [], {}
for r in range(1, rounds + 1):
    for who in ("ferry", "llamacpp"):
        text = open(f"{R}/{who}.r{r}.txt").read()
        load = float(re.search(r"# load ([\d.]+)", text).group(1))
        if who == "ferry" and dev == "cpu":
            # type act m n k thr ms/call GB/s(W) %ceil GFLOP/s t/t1 load med-GB/s: the median call's time
            for l in text.splitlines():
                f = l.split()
                if len(f) == 13 and f[2].isdigit():
                    ms, gbs, med = float(f[6]), float(f[7]), float(f[12])
                    wbytes[f[0]] = ms * 1e-3 * gbs * 1e9
                    rows.append(dict(round=r, who="ferry", type=f[0], act=f[1], m=int(f[2]), n=int(f[3]),
                                     k=int(f[4]), threads=int(f[5]), us=round(ms * 1e3 * gbs / med, 1), load=load))
        elif who == "ferry":
            # bench_cuda --types: "type T m M n N k K us U bytes B"
            for m in re.finditer(r"^type (\S+) m (\d+) n (\d+) k (\d+) us ([\d.]+) bytes (\d+)", text, re.M):
                wbytes[m[1]] = float(m[6])
                rows.append(dict(round=r, who="ferry", type=m[1], act="auto", m=int(m[2]), n=int(m[3]),
                                 k=int(m[4]), us=float(m[5]), load=load))
        else:
            for m in re.finditer(r"MUL_MAT\(type_a=(\w+),type_b=f32,m=(\d+),n=(\d+),k=(\d+),[^)]*\):\s+\d+ runs -\s+([\d.]+) us/run",
                                 text):
                t = m[1].upper()  # x as ggml's vec_dot type: int8 blocks for the quantized types, else W's type
                rows.append(dict(round=r, who="llama.cpp", type=t, act=t.lower() if t in ("F16", "BF16") else "int8", m=int(m[3]), n=int(m[2]),
                                 k=int(m[4]), us=float(m[5]), load=load))
for x in rows:
    if x["who"] == "llama.cpp" and dev == "cpu":
        x["threads"] = next(y["threads"] for y in rows if y["who"] == "ferry")
    if x["type"] in wbytes:
        x["gbs"] = round(wbytes[x["type"]] / x["us"] * 1e-3, 2)
with open(f"{R}/results.jsonl", "w") as f:
    for x in rows:
        f.write(json.dumps(x) + "\n")
print(f"{len(rows)} rows in {R}/results.jsonl")
EOF

if [ $dev = cuda ]; then
  machine="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(nproc)-core host"
else
  machine="$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
fi
python3 - "$R" "$dev" "$machine" "$threads" "$rounds" "$script_args" << 'EOF'
import json, subprocess, sys, time
R, dev, machine, threads, rounds, args = sys.argv[1:]
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
where = f"the CPU, {threads} thread{'s' if threads != '1' else ''}" if dev == "cpu" else "the GPU"
# On x86 CPUs with AVX2 llama.cpp's model loader repacks these types into interleaved rows (ggml-cpu/repack.cpp);
# test-backend-ops multiplies from the plain layout.
repack = (" llama.cpp's model loader (not test-backend-ops) repacks Q4_0, Q4_K, IQ4_NL, MXFP4 and, with AVX-512, "
          "Q2_K into interleaved rows on x86 CPUs, a path these figures leave out." if dev == "cpu" else "")
json.dump({
    "title": f"Weight types on {'the CPU' if dev == 'cpu' else 'the GPU'}, one product beside llama.cpp",
    "date": time.strftime("%Y-%m-%d"), "machine": machine, "commit": commit, "kind": "types",
    "peer": "llama.cpp lcp0336 (October 2026), tests/test-backend-ops perf -o MUL_MAT",
    "command": f"ROUNDS={rounds} bash tests/bench/compare_types.sh" + (" --cuda" if dev == "cuda" else "") +
               (f" {args}" if args else ""),
    "about": (f"y (m, 4096) = x (m, 14336) · Wᵀ on {where}: ferry's "
              + ("bench_cpu_matmul --hot (median call; x in f32 and in int8)" if dev == "cpu" else
                 "bench_cuda --types (kern_cuda_matmul's automatic choice)")
              + " beside llama.cpp lcp0336's test-backend-ops perf (mean of >= 1 s of runs), each re-reading one "
              "weight matrix. Best of the rounds for each side; the load average of every round is in results.jsonl."
              + repack)
}, open(f"{R}/meta.json", "w"), indent=2, ensure_ascii=False)
open(f"{R}/meta.json", "a").write("\n")
EOF
}

rm -rf "$R" && mkdir -p "$R"
for r in $(seq 1 "$rounds"); do
  echo "round $r: ferry (load $(cut -d' ' -f1 /proc/loadavg))"
  echo "# load $(cut -d' ' -f1 /proc/loadavg)" > "$R/ferry.r$r.txt"
  $F -T "$(echo $types | tr ' ' ,)" >> "$R/ferry.r$r.txt" 2>&1 || { echo "ferry failed: $R/ferry.r$r.txt"; exit 1; }
  echo "round $r: llama.cpp (load $(cut -d' ' -f1 /proc/loadavg))"
  echo "# load $(cut -d' ' -f1 /proc/loadavg)" > "$R/llamacpp.r$r.txt"
  "$L/bin/test-backend-ops" perf -b $backend -o MUL_MAT -p "$pattern" >> "$R/llamacpp.r$r.txt" 2>&1 ||
    { echo "test-backend-ops failed: $R/llamacpp.r$r.txt"; exit 1; }
  summarize "$r"
  echo "round $r done ($(el))"
done

echo "wrote $R; now: python3 docs/make_benchmarks.py"
