#!/usr/bin/env python3
"""compare_table.py RESULTS.jsonl — the table of tests/gpu/compare_llamacpp.sh: ferry beside llama.cpp per case,
with the ratio and the target for it. One JSON object per line: {"who", "case", "tool", "decode": {batch:
tok/s}, "prefill", "vram_planned" | "vram_mib"}. Figures measured in several rounds are medians; the lines
after the table give their ranges."""
import json
import sys

rows = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
# Records of one (who, case) are merged per tool in the order the tools first ran; the first tool's figure wins
# (llama-bench runs before llama-batched-bench, so its b=1 decode is the one shown). Records of the same tool
# and case (rounds: CMP_ROUNDS) give the median of their figures; spread[(who, case, batch)] keeps their range.
# Records without a "tool" (files before rounds) are each a tool of their own, so the first one wins.
pooled = {}  # (who, case) -> {tool: {"decode": {batch: [values]}, key: [values]}}, tools in first-run order
for i, r in enumerate(rows):
    tools = pooled.setdefault((r["who"], r["case"]), {})
    t = tools.setdefault(r.get("tool", i), {"decode": {}})
    for k, v in r.items():
        if k == "decode":
            for b, x in v.items():
                t["decode"].setdefault(b, []).append(x)
        elif k not in ("who", "case", "tool"):
            t.setdefault(k, []).append(v)


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


get, spread = {}, {}
for key, tools in pooled.items():
    g = get.setdefault(key, {"decode": {}})
    for t in tools.values():
        for b, xs in t["decode"].items():
            if b not in g["decode"]:
                g["decode"][b] = median(xs)
                if len(xs) > 1:
                    spread[key + (b,)] = (min(xs), max(xs), len(xs))
        for k, xs in t.items():
            if k != "decode" and k not in g:
                g[k] = median(xs) if all(isinstance(x, (int, float)) or x is None for x in xs) else xs[0]


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
    for (who, case), r in get.items():
        if who == "llama.cpp" and case.startswith(prefix) and (r.get("vram_mib") or 1e9) <= mib:
            if b is None or (r["decode"].get("1") or 0) > (b["decode"].get("1") or 0):
                b = dict(r, case=case)
    return b


# Under a budget: llama.cpp's best -ngl whose device buffers fit it.
for name, fcases, prefix, mib, tgt in (("Q4_K_M 4 GiB", ("q4-4g", "q4-4g-cpu", "q4-4g-int8", "q4-4g-cpu-int8"), "q4-4g-ngl", 4096,
                                        {1: ">= 1.5x, >= 65", 16: ">= 10x"}),
                                       ("Q4_K_M 4 GiB, 1 seq", ("q4-1s-auto", "q4-1s-int8"), "q4-1s-ngl", 4096,
                                        {1: ">= 1.5x, >= 65"}),
                                       ("F16 4 GiB", ("f16-4g-stream", "f16-4g-auto", "f16-4g-cpu"), "f16-4g-ngl", 4096,
                                        {1: ">= 12, >= 1.5x", 16: ">= 81"}),
                                       ("F16 4 GiB, 1 seq", ("f16-1s-auto",), "f16-1s-ngl", 4096,
                                        {1: ">= 12, >= 1.5x"}),
                                       ("Q8_0 4 GiB", ("q8-4g-auto", "q8-4g-auto-int8", "q8-4g-cpu-int8"), "q8-4g-ngl", 4096,
                                        {1: ">= 30"}),
                                       ("Q8_0 4 GiB, 1 seq", ("q8-1s-auto",), "q8-1s-ngl", 4096, {1: ">= 30"}),
                                       ("Q4_K_M 2 GiB", ("q4-2g-auto", "q4-2g-auto-int8", "q4-2g-cpu-int8"), "q4-2g-ngl", 2048,
                                        {1: ">= 1.5x"}),
                                       ("Q4_K_M 2 GiB, 1 seq", ("q4-2g1s-auto",), "q4-2g1s-ngl", 2048,
                                        {1: ">= 1.5x"})):
    b = best_under(prefix, mib)
    ngl = b["case"].split("ngl")[1] if b else "?"
    for fc in fcases:
        if (("ferry", fc)) not in get:
            continue
        for bt in (1, 16) if "1 seq" not in name else (1,):
            line(f"{name} {(fc.split('-', 2) + ['auto'])[2]}, b={bt} (llama.cpp -ngl {ngl})", val("ferry", fc, "decode", bt),
                 b["decode"].get(str(bt)) if b else None, tgt.get(bt, ""))
    for fc in fcases:
        if val("ferry", fc, "prefill"):
            line(f"{name} {(fc.split('-', 2) + ['auto'])[2]}, prefill 512", val("ferry", fc, "prefill"), None,
                 ">= 2,700" if name.startswith("F16") else "")
for t in ("q4-k-m", "q8-0"):
    for fc in (f"cpu-{t}", f"cpu-{t}-int8", f"cpu-{t}-f32"):
        if ("ferry", fc) in get:
            x = " int8 x" if fc.endswith("int8") else " f32 x" if fc.endswith("f32") else " (default x)"
            line(f"--backend cpu {t.upper().replace('-', '_')}{x}, b=1 "
                 "(llama.cpp -ngl 0)", val("ferry", fc, "decode", 1), val("llama.cpp", f"cpu-{t}", "decode", 1),
                 ">= 1x")
print("\n".join(out))
for (who, case, b), (lo, hi, n) in sorted(spread.items()):
    print(f"{who} {case} b={b}: median of {n} rounds, range {lo:,.1f}-{hi:,.1f}")
for (who, case), r in get.items():
    if who == "llama.cpp" and r.get("vram_mib") is not None:
        print(f"llama.cpp {case}: device buffers {r['vram_mib']:.0f} MiB")
    if who == "ferry":
        print(f"ferry {case}: planned {(r.get('vram_planned') or 0) / 2**30:.2f} GiB; {(r.get('placement') or '')[:160]}")
# The step planner's prediction beside each measured step, every round (target: within 15%).
for r in rows:
    for bt, (ms, pred) in sorted((r.get("step_ms") or {}).items(), key=lambda kv: int(kv[0])):
        if pred and ms:
            print(f"ferry {r['case']} b={bt}: step {ms:.2f} ms, predicted {pred:.2f} ({(pred - ms) / ms * 100:+.0f}%)")
