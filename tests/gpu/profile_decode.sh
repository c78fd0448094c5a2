#!/bin/bash
# profile_decode.sh — on a GPU machine, after tests/gpu/run.sh has built /tmp/ferry-e2e: time every kernel of
# decode steps of `ferry bench --synthetic MODEL` with Nsight Compute (one metric, gpu__time_duration; kernels
# run serialized, so the sum is kernel time without launch gaps) and print the time per kernel name per step,
# next to the step time the bench itself measures (graphs, no profiler).
#   tests/gpu/profile_decode.sh [MODEL] [BATCH]     (defaults: llama-2-7b 1)
set -u
model=${1:-llama-2-7b} batch=${2:-1}
out=${OUT:-$(pwd)/out}
mkdir -p "$out"
B=/tmp/ferry-e2e/build/server/ferry
[ -x $B ] || { echo "profile_decode.sh: build first (tests/gpu/run.sh)"; exit 1; }
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "profile_decode.sh: no ncu"; exit 1; }
args="bench --synthetic $model --batches $batch --prefill 0 --decode-steps 3"
# Every kernel of the run is profiled (a few thousand); a decode step starts at the one plain norm (layer 0's
# norm; later norms are fused with the residual add), and the last two complete steps are summarised.
timeout 500 "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 8000 $B $args \
  > /tmp/ncu.csv 2> /tmp/ncu.err
echo "ncu rc=$?"; tail -3 /tmp/ncu.err
python3 - /tmp/ncu.csv <<'PY' | tee "$out/profile_b$batch.txt"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if len(rows) < 2: print("no ncu rows"); sys.exit(0)
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
gi = h.index("Grid Size") if "Grid Size" in h else None
seq = []
for r in rows[1:]:
    v = float(r[vi].replace(",", "")); u = r[ui]
    us = v / 1000 if u in ("nsecond", "ns") else v if u in ("usecond", "us") else v * 1000
    seq.append((r[ki].split("(")[0].replace("void ", "").strip(), us, r[gi] if gi is not None else ""))
starts = [i for i, (k, _, _) in enumerate(seq) if k.startswith("norm_") and "<false" in k]
if len(starts) < 3: print("fewer than 3 steps found; kernels:", len(seq)); starts = [0, len(seq)]
segs = [seq[a:b] for a, b in zip(starts[-3:-1], starts[-2:])] + [seq[starts[-1]:]]
segs = segs[-2:]
for si, sg in enumerate(segs):
    t = collections.OrderedDict(); n = collections.Counter(); grid = {}
    for k, us, g in sg:
        t[k] = t.get(k, 0) + us; n[k] += 1; grid.setdefault(k, set()).add(g)
    print(f"step {si}: {len(sg)} kernels, kernel time {sum(t.values())/1000:.3f} ms")
    for k, v in sorted(t.items(), key=lambda kv: -kv[1]):
        print(f"  {v:9.1f} us  {n[k]:4d} x {v/n[k]:7.2f} us  {k}  grids {sorted(grid[k])[:4]}")
PY
