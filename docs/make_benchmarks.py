#!/usr/bin/env python3
"""make_benchmarks.py — write docs/benchmarks.md from the results folder (tests/gpu/results).

Each benchmark is one folder holding meta.json (title, date, machine, commit, command, about, kind) and the raw
files its command wrote. Only the latest result of each benchmark is kept there: a new run replaces the folder.
kind "jsonl": results.jsonl of tests/gpu/compare_llamacpp.sh (optional "cases": prefixes of the rows shown);
kind "serve": summary.txt of tests/gpu/serve_compare.sh (a Markdown table); kind "text": the lines of the file named by "show" that match "show_regex";
kind "moe": results.jsonl of tests/gpu/compare_moe.sh (per part, ferry beside each llama.cpp setting, the device
memory each reports, and ferry over llama.cpp's best setting that fits the part's budget);
kind "families": results.jsonl of tests/gpu/compare_families.sh (the same per model and part). The CPU run of
compare_families.sh, when tests/bench/results/families-cpu/ holds it, ends the page.
kind "types": results.jsonl of tests/bench/compare_types.sh (one product per weight type, ferry beside llama.cpp).
kind "spec": results.jsonl of tests/gpu/compare_spec.sh (the oracle drafter's rows against acceptance, then the
served parts: ferry beside llama-server, each with and without speculation, and ferry over llama.cpp's best).
README.md's block between its "measured" markers is the summary of the families and MoE GPU results (readme_block).

    python3 docs/make_benchmarks.py [RESULTS_DIR] [OUT]    (defaults: tests/gpu/results, docs/benchmarks.md)
    python3 docs/make_benchmarks.py --check                 (exit 1 when docs/benchmarks.md or README.md's
                                                             measured block is out of date)
    python3 docs/make_benchmarks.py --moe-table RESULTS_JSONL   (print the "moe" table of one results.jsonl)
    python3 docs/make_benchmarks.py --families-table RESULTS_JSONL   (the "families" table of one)
    python3 docs/make_benchmarks.py --types-table RESULTS_JSONL (print the "types" table of one results.jsonl)
    python3 docs/make_benchmarks.py --spec-table RESULTS_JSONL  (the "spec" tables of one)
"""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIRED = ("title", "date", "machine", "commit", "command", "about", "kind")


def fmt(v):
    if v is None:
        return "—"
    return f"{v:,.1f}"


def jsonl_table(path, cases):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if cases and not any(r.get("case", "").startswith(c) for c in cases):
                continue
            rows.append(r)
    batches = sorted({int(b) for r in rows for b in r.get("decode", {})})
    head = ["who", "case"] + [f"decode b={b}" for b in batches] + ["prefill"]
    out = ["| " + " | ".join(head) + " | (tokens/s)", "|" + "---|" * len(head)]
    for r in rows:
        dec = r.get("decode", {})
        cells = [r.get("who", "?"), f"`{r.get('case', '?')}`"]
        cells += [fmt(dec.get(str(b))) for b in batches]
        cells.append(fmt(r["prefill"]) if r.get("prefill") else "—")
        out.append("| " + " | ".join(cells) + " |")
    out[0] = out[0].replace(" | (tokens/s)", " |")
    return out, "Figures are tokens per second (decode: generated tokens of all sequences together)."


def merge_rows(path, key_of):
    """The rows of a results.jsonl merged per key_of(row) (None: the row is skipped), in first-seen order: each
    figure the best of the rows (llama-bench's b=1 and prefill beside llama-batched-bench's b=1 and b=16), the
    device MiB the largest, fits only when every row fits; the prefill's prompt length (prefill_tokens) kept."""
    merged, order = {}, []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            key = key_of(r)
            if key is None:
                continue
            if key not in merged:
                merged[key] = {"vram": None, "fits": True}
                order.append(key)
            m = merged[key]
            vals = dict(r.get("decode", {}))
            if r.get("prefill"):
                vals["prefill"] = r["prefill"]
                m["pp"] = r.get("prefill_tokens")
            for k, v in vals.items():
                if v is not None:
                    m[k] = max(m.get(k, 0.0), v)
            if r.get("vram_mib") is not None:
                m["vram"] = max(m["vram"] or 0.0, r["vram_mib"])
            m["fits"] = m["fits"] and r.get("fits", True)
    return merged, order


def ratio_cells(ferry, peers, cols):
    """ferry's figure over the best peer's, column by column (bold); [] when either side is missing."""
    if not ferry or not peers:
        return []
    cells = []
    for c in cols:
        best = max((p.get(c) or 0.0 for p in peers), default=0.0)
        cells.append(f"**{ferry[0][c] / best:.2f}x**" if ferry[0].get(c) and best else "—")
    return cells


MOE_PARTS = {"resident": "all on the GPU", "cpu": "experts on the host", "8g": "8 GiB budget",
             "4g": "4 GiB budget"}
MOE_COLS = (("1", "decode b=1"), ("16", "decode b=16"), ("prefill", "prefill 512"))


def moe_table(path):
    """Rows of compare_moe.sh merged per (part, who, setting): llama-bench gives b=1 and prefill, llama-batched-bench
    b=16 (and b=1: the better of the two is shown), the device MiB is the larger of the two tools' (each context's
    KV and compute buffers). A llama.cpp setting whose device memory passes a part's budget is marked and left out
    of the best."""
    merged, order = merge_rows(path, lambda r: None if r.get("group", "?") == "probe" else
                               (r.get("group", "?"), r.get("who", "?"), r.get("setting", "")))
    parts = sorted({k[0] for k in order}, key=lambda p: (list(MOE_PARTS).index(p) if p in MOE_PARTS else 99, p))
    out = ["| part | who | setting | device MiB | " + " | ".join(c[1] for c in MOE_COLS) + " |",
           "|" + "---|" * (4 + len(MOE_COLS))]
    for part in parts:
        keys = [k for k in order if k[0] == part]
        for k in keys:
            m = merged[k]
            vram = fmt(m["vram"]) + ("" if m["fits"] else " (over the budget)")
            out.append(f"| {MOE_PARTS.get(part, part)} | {k[1]} | `{k[2]}` | {vram} | " +
                       " | ".join(fmt(m.get(c)) for c, _ in MOE_COLS) + " |")
        cells = ratio_cells([merged[k] for k in keys if k[1] == "ferry"],
                            [merged[k] for k in keys if k[1] != "ferry" and merged[k]["fits"]], [c for c, _ in MOE_COLS])
        if cells:
            out.append(f"| {MOE_PARTS.get(part, part)} | ferry / llama.cpp's best | | | " + " | ".join(cells) + " |")
    return out, ("Figures are tokens per second (decode: generated tokens of all sequences together); device MiB is "
                 "ferry's device memory in use and llama.cpp's logged model, KV and compute buffers.")


FAMILY_PARTS = {"resident": "all on the GPU"}


def families_table(path):
    """Rows of compare_families.sh, per model and part: ferry beside each llama.cpp setting (llama-bench's b=1
    and prefill merged with llama-batched-bench's b=16 of the same setting; the device MiB the larger of the
    two), then ferry over llama.cpp's best setting that fits the part's budget. A setting whose device memory
    passes the budget is marked and left out of the best."""
    merged, order = merge_rows(path, lambda r: (r.get("model", "?"), r.get("part", "?"), r.get("who", "?"),
                                                r.get("setting", "")))
    out = ["| model | part | who | setting | device MiB | decode b=1 | decode b=16 | prefill (tokens) |",
           "|" + "---|" * 8]
    for model, part in dict.fromkeys(k[:2] for k in order):
        keys = [k for k in order if k[:2] == (model, part)]
        label = (part.replace("g", " GiB budget") if part[:-1].isdigit() else
                 f"CPU backends, {part[5:]} thread{'s' if part[5:] != '1' else ''}" if part.startswith("cpu-t") else
                 FAMILY_PARTS.get(part, part))
        for k in keys:
            m = merged[k]
            pp = f"{fmt(m.get('prefill'))} ({m['pp']})" if m.get("prefill") and m.get("pp") else fmt(m.get("prefill"))
            vram = fmt(m["vram"]) + ("" if m["fits"] else " (over the budget)")
            out.append(f"| {model} | {label} | {k[2]} | `{k[3]}` | {vram} | {fmt(m.get('1'))} | "
                       f"{fmt(m.get('16'))} | {pp} |")
        cells = ratio_cells([merged[k] for k in keys if k[2] == "ferry"],
                            [merged[k] for k in keys if k[2] != "ferry" and merged[k]["fits"]], ("1", "16", "prefill"))
        if cells:
            out.append(f"| {model} | {label} | ferry / llama.cpp's best | | | " + " | ".join(cells) + " |")
    return out, ("Figures are tokens per second (decode: generated tokens of all sequences together); device MiB is "
                 "ferry's device memory in use and llama.cpp's logged model, KV, recurrent-state and compute "
                 "buffers.")


def families_cpu_section(results=os.path.join(ROOT, "tests", "bench", "results", "families-cpu")):
    """The CPU side-by-side of compare_families.sh cpu, when its results are in the repository."""
    if not os.path.isfile(os.path.join(results, "meta.json")):
        return []
    meta = json.load(open(os.path.join(results, "meta.json")))
    table, note = families_table(os.path.join(results, "results.jsonl"))
    rel = os.path.relpath(results, os.path.join(ROOT, "docs"))
    files = sorted(f for f in os.listdir(results) if f != "meta.json")
    return ['<a id="families-cpu"></a>', f"## {meta['title']}", "",
            f"Measured {meta['date']} on {meta['machine']}, commit `{meta['commit']}`.", "",
            f"    {meta['command']}", "", meta["about"], ""] + table + ["", note, "",
            "Raw files: " + ", ".join(f"[`{f}`]({rel}/{f})" for f in files) + ".", ""]
def multiturn_cpu_section(results=os.path.join(ROOT, "tests", "bench", "results", "multiturn-cpu")):
    """tests/bench/compare_multiturn.sh's table (written by tests/bench/multiturn_table.py), when in the
    repository: its headings one level down, its raw files linked."""
    table = os.path.join(results, "table.md")
    if not os.path.isfile(table):
        return []
    rel = os.path.relpath(results, os.path.join(ROOT, "docs"))
    out = ['<a id="multiturn-cpu"></a>']
    with open(table) as f:
        out += [("#" + l if l.startswith("#") else l).rstrip() for l in f]
    files = sorted(f for f in os.listdir(results) if f != "table.md")
    return out + ["", "Raw files: " + ", ".join(f"[`{f}`]({rel}/{f})" for f in files) + ".", ""]


def types_rows(path):
    """compare_types.sh's rows reduced to each side's best round per (type, m, arithmetic): {(who, type, act, m):
    row}, the ferry arithmetics in order, the types in order, and the range of the rounds' load averages."""
    best, acts, types, loads = {}, [], [], []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            key = (r["who"], r["type"], r["act"], r["m"])
            if key not in best or r["us"] < best[key]["us"]:
                best[key] = r
            if r["who"] == "ferry" and r["act"] not in acts and r["type"] not in ("F16", "BF16"):
                acts.append(r["act"])
            if r["type"] not in types:
                types.append(r["type"])
            loads.append(r["load"])
    return best, acts or ["f32"], types, (min(loads), max(loads)) if loads else (0, 0)


def types_ratio(best, acts, t, m):
    """llama.cpp's time over ferry's for type t at m rows, one per ferry arithmetic in acts' order, e.g. "1.85 /
    2.10"."""
    peer = next((r for k, r in best.items() if k[0] != "ferry" and k[1] == t and k[3] == m), None)
    mine = [best[("ferry", t, a, m)] for a in acts if ("ferry", t, a, m) in best]
    return " / ".join(f"{peer['us'] / r['us']:.2f}" for r in mine) if peer else "—"


def types_cell(r):
    us = r["us"]
    return f"{us:,.0f} µs ({r.get('gbs', 0):,.1f} GB/s)" if us >= 100 else f"{us:.1f} µs ({r.get('gbs', 0):,.0f} GB/s)"


def types_table(path):
    best, acts, types, loads = types_rows(path)
    plain = "f32" if "f32" in acts else acts[0]
    head = ["type", "m"] + ([f"ferry, x {a}" for a in acts] if len(acts) > 1 else ["ferry"]) + ["llama.cpp",
                                                                                       "llama.cpp / ferry time"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in types:
        for m in sorted({k[3] for k in best if k[1] == t}):
            cells = [t, str(m)]
            for a in acts:
                r = best.get(("ferry", t, plain if t in ("F16", "BF16") else a, m))
                show = r and (a == plain or t not in ("F16", "BF16"))
                cells.append(types_cell(r) if show else "—")
            peer = next((r for k, r in best.items() if k[0] != "ferry" and k[1] == t and k[3] == m), None)
            cells.append(types_cell(peer) if peer else "not run")
            cells.append(types_ratio(best, acts, t, m))
            out.append("| " + " | ".join(cells) + " |")
    note = (f"Each cell is one product's time and its weight bytes per second (best round of each side; load "
            f"average {loads[0]:.2f}-{loads[1]:.2f}). The last column is llama.cpp's time over ferry's (above 1: "
            f"ferry is faster), one figure per ferry arithmetic in the order of the columns"
            + ("; ferry's F16 and BF16 multiply in f32." if len(acts) > 1 else "."))
    return out, note


SPEC_PARTS = {"draft": "draft model", "lookup": "prompt lookup"}


def spec_rows(path):
    """compare_spec.sh's rows: the oracle rows by (model, acceptance) and the served rows by (part, who,
    setting), each key's last row kept (a part run again replaces its figures), in first-seen order."""
    oracle, served = {}, {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("part") == "oracle":
                oracle[(r["model"], r["accept"])] = r
            else:
                served[(r.get("part", "?"), r.get("who", "?"), r.get("setting", ""))] = r
    return oracle, served


def spec_oracle_table(oracle):
    out = ["| model | setting | device MiB | acceptance | step of K+1 rows / 1 row | tokens a step | tokens/s with / "
           "without | with / without | with / plain b=1 decode |", "|" + "---|" * 9]
    for (model, accept), r in oracle.items():
        k1 = r["k"] + 1
        step = f"{r['spec_step_ms']:,.2f} / {r['plain_step_ms']:,.2f} ms ({r['spec_step_ms'] / r['plain_step_ms']:.2f}x, K+1 = {k1})"
        gain = f"**{r['spec_tok_s'] / r['plain_tok_s']:.2f}x**" if r.get("plain_tok_s") else "—"
        b1 = f"{r['spec_tok_s'] / r['b1_tok_s']:.2f}x (b=1: {fmt(r['b1_tok_s'])})" if r.get("b1_tok_s") else "—"
        out.append(f"| {model} | {r['setting']} | {fmt(r.get('vram_mib'))} | {accept:g} | {step} | {r['tokens_per_step']:.2f} | "
                   f"{fmt(r['spec_tok_s'])} / {fmt(r['plain_tok_s'])} | {gain} | {b1} |")
    return out


def spec_served_table(served):
    """Per part: each server and setting (device MiB, drafts, tokens/s, whether the output equals the same
    server's without speculation), then ferry over llama.cpp's best setting that fits, with and without."""
    out = ["| part | who | setting | device MiB | drafted | accepted | tokens/s (client) | tokens/s (server's) "
           "| output |", "|" + "---|" * 9]
    for part in dict.fromkeys(k[0] for k in served):
        keys = [k for k in served if k[0] == part]
        plain_sha = {k[1]: served[k].get("text_sha1") for k in keys if not served[k].get("spec")}
        for k in keys:
            r = served[k]
            vram = fmt(r.get("vram_mib")) + ("" if r.get("fits", True) else " (over the budget)")
            acc = (f"{r['accepted']} ({r['accepted'] / r['drafted']:.0%})" if r.get("drafted") else
                   "—" if not r.get("spec") else "0")
            same = ("—" if not r.get("spec") or k[1] not in plain_sha else
                    "same as without" if r.get("text_sha1") == plain_sha[k[1]] else "differs from without")
            if r.get("same_text") is False:  # the requests of one server start did not all answer alike
                same += ", varied between requests"
            out.append(f"| {SPEC_PARTS.get(part, part)} | {k[1]} | `{k[2]}` | {vram} | {r.get('drafted', '—')} | "
                       f"{acc} | {fmt(r.get('client_tok_s'))} | {fmt(r.get('server_tok_s'))} | {same} |")
        for spec, what in ((True, "with speculation"), (False, "without"), (None, "any setting")):
            pick = lambda r: spec is None or r.get("spec") == spec
            mine = [served[k]["client_tok_s"] or 0 for k in keys if k[1] == "ferry" and pick(served[k])]
            peer = [served[k]["client_tok_s"] or 0 for k in keys if k[1] != "ferry"
                    and pick(served[k]) and served[k].get("fits", True)]
            if mine and peer and max(peer) > 0:
                who = "ferry's best / llama.cpp's best" if spec is None else "ferry / llama.cpp's best"
                out.append(f"| {SPEC_PARTS.get(part, part)} | {who}, {what} | | | | | "
                           f"**{max(mine) / max(peer):.2f}x** | | |")
    return out


def spec_table(path):
    oracle, served = spec_rows(path)
    out = []
    if oracle:
        out += spec_oracle_table(oracle)
    if served:
        out += ([""] if out else []) + spec_served_table(served)
    return out, ("Oracle rows: ferry bench --spec-oracle, one sequence; a step verifies K drafts and the pending "
                 "token as K+1 rows, each draft kept with the given probability until the first rejection; "
                 "tokens/s with speculation over the same sequence's one-row steps, and over the plain b=1 "
                 "decode of the same run. Served rows: one streaming client, greedy; tokens/s after the first "
                 "token as the client saw them and as the server reports them; device MiB is ferry's device "
                 "memory in use (with the draft model's allotment) and llama.cpp's logged weights, KV and "
                 "compute buffers of both models; a setting over the part's budget is left out of the best. Output: the "
                 "last request's text beside the same server's without speculation (greedy, so equal unless "
                 "numerics differ at a near-tie), and whether one start's requests answered alike.")


def render(results):
    lines = ["# Benchmarks", "",
             "Generated by `python3 docs/make_benchmarks.py` from `tests/gpu/results/` (one folder per benchmark, the",
             "latest run of each, with its raw output). Do not edit by hand: rerun the benchmark, replace its folder,",
             "and regenerate. The test models are random weights in the shape of Llama-2-7B written with llama.cpp's",
             "type mixes (`tests/gpu/make_quant_gguf.py`), and of Qwen3-30B-A3B for the Mixture-of-Experts table",
             "(`tests/gpu/make_moe_gguf.py`), so the figures measure speed, not answers.", ""]
    names = sorted(d for d in os.listdir(results) if os.path.isfile(os.path.join(results, d, "meta.json")))
    lines += [f"- [{json.load(open(os.path.join(results, n, 'meta.json')))['title']}](#{n})" for n in names]
    lines.append("")
    for n in names:
        d = os.path.join(results, n)
        meta = json.load(open(os.path.join(d, "meta.json")))
        missing = [k for k in REQUIRED if k not in meta]
        if missing:
            raise SystemExit(f"{d}/meta.json: missing {', '.join(missing)}")
        lines += [f'<a id="{n}"></a>', f"## {meta['title']}", "",
                  f"Measured {meta['date']} on {meta['machine']}, commit `{meta['commit']}`.", "",
                  f"    {meta['command']}", "", meta["about"], ""]
        if meta["kind"] == "jsonl":
            table, note = jsonl_table(os.path.join(d, "results.jsonl"), meta.get("cases"))
            lines += table + ["", note, ""]
        elif meta["kind"] == "moe":
            table, note = moe_table(os.path.join(d, "results.jsonl"))
            lines += table + ["", note, ""]
        elif meta["kind"] == "families":
            table, note = families_table(os.path.join(d, "results.jsonl"))
            lines += table + ["", note, ""]
        elif meta["kind"] == "types":
            table, note = types_table(os.path.join(d, "results.jsonl"))
            lines += table + ["", note, ""]
        elif meta["kind"] == "spec":
            table, note = spec_table(os.path.join(d, "results.jsonl"))
            lines += table + ["", note, ""]
        elif meta["kind"] == "serve":
            with open(os.path.join(d, "summary.txt")) as f:
                lines += [l.rstrip() for l in f if l.startswith("|")] + [""]
        elif meta["kind"] == "text":
            keep = re.compile(meta.get("show_regex", ""))
            with open(os.path.join(d, meta["show"])) as f:
                lines += ["```"] + [l.rstrip() for l in f if keep.search(l)] + ["```", ""]
        else:
            raise SystemExit(f"{d}/meta.json: unknown kind {meta['kind']}")
        files = sorted(f for f in os.listdir(d) if f != "meta.json")
        lines += ["Raw files: " + ", ".join(f"[`{f}`](../tests/gpu/results/{n}/{f})" for f in files) + ".", ""]
    lines += families_cpu_section()
    lines += multiturn_cpu_section()
    return "\n".join(lines)


def ratio_rows(path, key_of, label_of):
    """(label, [b=1, b=16, prefill] ratio cells) per group of a results.jsonl: ferry over llama.cpp's best
    setting that fits (ratio_cells); groups without both sides are left out."""
    merged, order = merge_rows(path, key_of)
    rows = []
    for group in dict.fromkeys(k[:-2] for k in order):
        keys = [k for k in order if k[:-2] == group]
        cells = ratio_cells([merged[k] for k in keys if k[-2] == "ferry"],
                            [merged[k] for k in keys if k[-2] != "ferry" and merged[k]["fits"]], ("1", "16", "prefill"))
        if cells:
            rows.append((label_of(group), cells))
        elif not any(k[-2] == "ferry" for k in keys):
            rows.append((label_of(group), ["no ferry figure (docs/benchmarks.md says why)", "", ""]))
    return rows


def readme_block(results):
    """The README's summary (between its `measured` markers): ferry over llama.cpp per model and budget, from the
    families and MoE results (GPU parts only)."""
    rows, metas = [], []
    fam = os.path.join(results, "llamacpp-families")
    if os.path.isfile(os.path.join(fam, "meta.json")):
        metas.append(json.load(open(os.path.join(fam, "meta.json"))))
        rows += ratio_rows(os.path.join(fam, "results.jsonl"),
                           lambda r: None if r.get("part", "").startswith("cpu") else
                           (r.get("model", "?"), r.get("part", "?"), r.get("who", "?"), r.get("setting", "")),
                           lambda g: f"{g[0]}, " + ("all on the GPU" if g[1] == "resident" else
                                                    g[1].replace("g", " GiB budget")))
    moe = os.path.join(results, "llamacpp-moe")
    if os.path.isfile(os.path.join(moe, "meta.json")):
        metas.append(json.load(open(os.path.join(moe, "meta.json"))))
        rows += ratio_rows(os.path.join(moe, "results.jsonl"),
                           lambda r: None if r.get("group", "?") == "probe" else
                           (r.get("group", "?"), r.get("who", "?"), r.get("setting", "")),
                           lambda g: "qwen3-30b-a3b (MoE), " + MOE_PARTS.get(g[0], g[0]).replace(
                               "experts on the host", "every expert on the host's cores"))
    if not rows:
        return []
    spec = readme_spec_line(results)
    when = sorted({f"{m['date']} on {m['machine'].split(',')[0]}, commit `{m['commit']}`" for m in metas})
    out = ["| model shape (random weights, Q4_K_M mix) | decode b=1 | decode b=16 | prefill |", "|---|---|---|---|"]
    out += [f"| {label} | " + " | ".join(c.replace("**", "") for c in cells) + " |" for label, cells in rows]
    out += ["", "ferry's tokens per second over llama.cpp lcp0336's at its best setting that fits the same budget "
            "(`-ngl` or `--n-cpu-moe` swept, and `--fit`), one run each: " + "; ".join(when) +
            ". Absolute figures, plans and commands: [docs/benchmarks.md](docs/benchmarks.md)."]
    return out + (["", spec] if spec else [])


def readme_spec_line(results):
    """One sentence of the GPU speculative-decoding run: per oracle model, the gain with every draft right and
    with 70% of them right (over the same sequence's one-row steps); empty without that run."""
    d = os.path.join(results, "llamacpp-spec")
    if not os.path.isfile(os.path.join(d, "meta.json")):
        return ""
    meta = json.load(open(os.path.join(d, "meta.json")))
    oracle, _ = spec_rows(os.path.join(d, "results.jsonl"))
    parts = []
    for model in dict.fromkeys(k[0] for k in oracle):
        full = oracle.get((model, 1)) or oracle.get((model, 1.0))
        if not full or not full.get("plain_tok_s"):
            continue
        text = (f"{full['setting'].replace(', --gpu-memory ', ' under ')} {full['spec_tok_s']:,.1f} tokens/s, "
                f"{full['spec_tok_s'] / full['plain_tok_s']:.2f}x its one-row rate")
        curve = [(p, oracle[(model, p)]) for p in (0.9, 0.7, 0.5) if oracle.get((model, p), {}).get("plain_tok_s")]
        if curve:
            text += (" (" + " / ".join(f"{r['spec_tok_s'] / r['plain_tok_s']:.2f}x" for _, r in curve) + " with " +
                     " / ".join(f"{round(p * 100)}%" for p, _ in curve) + " of drafts right)")
        parts.append(text)
    if not parts:
        return ""
    return ("Speculative decoding pays where one or a few sequences decode, above all with layers in host memory: "
            "a step reads the weights once for all its rows ([docs/speculative.md](docs/speculative.md)). One "
            "sequence, each step verifying 4 drafts (the oracle drafter, the mechanism's ceiling): " +
            "; ".join(parts) +
            f" ({meta['date']}, {meta['machine'].split(',')[0]}, commit `{meta['commit']}`).")


README_BEGIN = "<!-- measured: begin (generated by docs/make_benchmarks.py from tests/gpu/results/) -->"
README_END = "<!-- measured: end -->"


def readme_text(results, readme):
    """readme with its block between the markers replaced (unchanged when it has no markers)."""
    with open(readme) as f:
        text = f.read()
    if README_BEGIN not in text or README_END not in text:
        return text
    head, rest = text.split(README_BEGIN, 1)
    tail = rest.split(README_END, 1)[1]
    return head + "\n".join([README_BEGIN] + readme_block(results) + [README_END]) + tail


def main(argv):
    if argv[:1] == ["--types-table"] and len(argv) == 2:
        table, note = types_table(argv[1])
        print("\n".join(table + ["", note]))
        return 0
    if argv[:1] == ["--moe-table"] and len(argv) == 2:
        table, note = moe_table(argv[1])
        print("\n".join(table + ["", note]))
        return 0
    if argv[:1] == ["--spec-table"] and len(argv) == 2:
        table, note = spec_table(argv[1])
        print("\n".join(table + ["", note]))
        return 0
    if argv[:1] == ["--families-table"] and len(argv) == 2:
        table, note = families_table(argv[1])
        print("\n".join(table + ["", note]))
        return 0
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    results = args[0] if args else os.path.join(ROOT, "tests", "gpu", "results")
    out = args[1] if len(args) > 1 else os.path.join(ROOT, "docs", "benchmarks.md")
    readme = os.path.join(ROOT, "README.md")
    for path, text in ((out, render(results)), (readme, readme_text(results, readme))):
        if check:
            with open(path) as f:
                if f.read() != text:
                    print(f"{path} is out of date: run python3 docs/make_benchmarks.py", file=sys.stderr)
                    return 1
        else:
            with open(path, "w") as f:
                f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
