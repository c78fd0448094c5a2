#!/usr/bin/env python3
"""compare_table.py RESULTS.jsonl — the table of tests/gpu/compare_llamacpp.sh: ferry beside llama.cpp per case,
with the ratio and issue 11's target for it. One JSON object per line: {"who", "case", "decode": {batch: tok/s},
"prefill", "vram_planned" | "vram_mib"}."""
import json
import sys

rows = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
# Records of one (who, case) are merged; the first measurement of a figure wins (llama-bench runs before
# llama-batched-bench, so its b=1 decode is the one shown).
get = {}
for r in rows:
    g = get.setdefault((r["who"], r["case"]), {"decode": {}})
    for k, v in r.items():
        if k == "decode":
            for b, t in v.items():
                g["decode"].setdefault(b, t)
        else:
            g.setdefault(k, v)


def val(who, case, key, batch=None):
    r = get.get((who, case))
    if not r:
        return None
    return r.get("decode", {}).get(str(batch)) if key == "decode" else r.get(key)


def fmt(v):
    return "-" if v is None else f"{v:,.1f}"


out = []


def line(what, f, l, target=""):
    ratio = f"{f / l:.2f}x" if f and l else "-"
    out.append(f"| {what:<44} | {fmt(f):>10} | {fmt(l):>10} | {ratio:>6} | {target} |")


out.append(f"| {'case (tokens/s)':<44} | {'ferry':>10} | {'llama.cpp':>10} | {'ratio':>6} | target |")
out.append("|" + "-" * 46 + "|" + "-" * 12 + "|" + "-" * 12 + "|" + "-" * 8 + "|---|")
for case, name, targets in (("q4-full", "Q4_K_M all on GPU", {1: ">= 1.4x", 16: ">= 2x", "p": ">= 1.2x"}),
                            ("q8-full", "Q8_0 all on GPU", {64: ">= 4,000", "p": ">= 1.2x, >= 13,000"})):
    line(f"{name}, decode b=1", val("ferry", case, "decode", 1), val("llama.cpp", case, "decode", 1),
         targets.get(1, ""))
    for b in (16, 64):
        line(f"{name}, decode b={b}", val("ferry", case, "decode", b), val("llama.cpp", case, "decode", b),
             targets.get(b, ""))
    line(f"{name}, prefill 512", val("ferry", case, "prefill"), val("llama.cpp", case, "prefill"),
         targets.get("p", ""))
line("--quant int4 (f16 weights), decode b=1 vs ferry Q4_K_M", val("ferry", "int4", "decode", 1),
     val("ferry", "q4-full", "decode", 1), "within 10%")
line("--quant int4 (f16 weights), decode b=16 vs ferry Q4_K_M", val("ferry", "int4", "decode", 16),
     val("ferry", "q4-full", "decode", 16))

def best_under(prefix, mib):
    """llama.cpp's record with the fastest b=1 decode among the -ngl sweep whose device buffers fit."""
    b = None
    for r in rows:
        if r["who"] == "llama.cpp" and r["case"].startswith(prefix) and r.get("vram_mib", 1e9) <= mib:
            if b is None or (r["decode"].get("1") or 0) > (b["decode"].get("1") or 0):
                b = r
    return b


# Under a budget: llama.cpp's best -ngl whose device buffers fit it.
for name, fcases, prefix, mib, tgt in (("Q4_K_M 4 GiB", ("q4-4g", "q4-4g-cpu", "q4-4g-int8", "q4-4g-cpu-int8"), "q4-4g-ngl", 4096,
                                        {1: ">= 1.5x, >= 65", 16: ">= 10x"}),
                                       ("Q4_K_M 4 GiB, 1 seq", ("q4-1s-auto", "q4-1s-int8"), "q4-1s-ngl", 4096,
                                        {1: ">= 1.5x, >= 65"}),
                                       ("F16 4 GiB", ("f16-4g-stream", "f16-4g-auto"), "f16-4g-ngl", 4096,
                                        {1: ">= 12, >= 1.5x", 16: ">= 81"}),
                                       ("Q8_0 4 GiB", ("q8-4g-auto", "q8-4g-auto-int8", "q8-4g-cpu-int8"), "q8-4g-ngl", 4096,
                                        {1: ">= 30"}),
                                       ("Q4_K_M 2 GiB", ("q4-2g-auto", "q4-2g-auto-int8", "q4-2g-cpu-int8"), "q4-2g-ngl", 2048,
                                        {1: ">= 1.5x"})):
    b = best_under(prefix, mib)
    ngl = b["case"].split("ngl")[1] if b else "?"
    for fc in fcases:
        if (("ferry", fc)) not in get:
            continue
        for bt in (1, 16) if "1 seq" not in name else (1,):
            line(f"{name} {(fc.split('-', 2) + ['auto'])[2]}, b={bt} (llama.cpp -ngl {ngl})", val("ferry", fc, "decode", bt),
                 b["decode"].get(str(bt)) if b else None, tgt.get(bt, ""))
    if ("ferry", fcases[0]) in get:
        line(f"{name} {(fcases[0].split('-', 2) + ['auto'])[2]}, prefill 512", val("ferry", fcases[0], "prefill"), None)
for t in ("q4-k-m", "q8-0"):
    for fc in (f"cpu-{t}", f"cpu-{t}-int8"):
        if ("ferry", fc) in get:
            line(f"--backend cpu {t.upper().replace('-', '_')}{' int8 x' if fc.endswith('int8') else ''}, b=1 "
                 "(llama.cpp -ngl 0)", val("ferry", fc, "decode", 1), val("llama.cpp", f"cpu-{t}", "decode", 1),
                 ">= 1x")
print("\n".join(out))
for r in rows:
    if r["who"] == "llama.cpp" and "vram_mib" in r:
        print(f"llama.cpp {r['case']}: device buffers {r['vram_mib']:.0f} MiB")
    if r["who"] == "ferry":
        print(f"ferry {r['case']}: planned {r.get('vram_planned', 0) / 2**30:.2f} GiB; {r.get('placement', '')[:160]}")
