#!/usr/bin/env python3
"""spec_client.py URL PROMPT_FILE MAX_TOKENS REQUESTS IGNORE_EOS [LABEL] — one streaming client of a
llama-server-style /completion endpoint (ferry serve and llama-server both answer it), for compare_spec.sh:
REQUESTS greedy requests of one prompt, one after another, the first a warm-up. PROMPT_FILE: text, or (*.json)
a list of token ids, which both servers take as they are. IGNORE_EOS 1: every request runs to MAX_TOKENS.
Prints one JSON object: per request the decode rate the client saw ((tokens - 1) / (time of the last chunk -
time of the first), so prefill is not in it), the server's own timings (predicted_n, predicted_per_second;
llama-server's draft_n and draft_n_accepted when it speculates) and the text; for a server with /metrics
(ferry), the change of its ferry_spec_* counters over the timed requests and its ferry_vram_* gauges.
Standard library only: the GPU machine's Python may have nothing else.
"""
import json
import sys
import time
import urllib.request


def metrics(url):
    """The ferry_spec_*, ferry_generated_tokens_total and ferry_vram_* figures of a ferry /metrics page ({}
    elsewhere)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith(("ferry_spec_", "ferry_generated_tokens_total", "ferry_vram_")) and " " in line:
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = float(value)
    return out


def one(url, prompt, max_tokens, ignore_eos):
    """One streaming greedy request: the client's timings, the final chunk's timings and the whole text."""
    body = json.dumps({"prompt": prompt, "n_predict": max_tokens, "temperature": 0, "top_k": 1, "stream": True,
                       "ignore_eos": ignore_eos, "cache_prompt": False}).encode()
    req = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
    t0 = time.monotonic()
    t_first = t_last = None
    text, final = [], {}
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            ev = json.loads(data)
            now = time.monotonic()
            if ev.get("content"):
                text.append(ev["content"])
                t_first = t_first or now
                t_last = now
            if ev.get("stop"):
                final = ev
                break
    tim = final.get("timings", {})
    n = tim.get("predicted_n") or final.get("tokens_predicted") or 0
    span = (t_last - t_first) if t_first and t_last else 0.0
    return {"tokens": n, "ttft_s": round((t_first or time.monotonic()) - t0, 4), "decode_s": round(span, 4),
            "client_tok_s": round((n - 1) / span, 2) if span > 0 and n > 1 else None,
            "server_tok_s": tim.get("predicted_per_second"), "draft_n": tim.get("draft_n"),
            "draft_n_accepted": tim.get("draft_n_accepted"), "text": "".join(text)}


def main(argv):
    url, prompt_file, max_tokens, n_req = argv[1].rstrip("/"), argv[2], int(argv[3]), int(argv[4])
    ignore_eos, label = argv[5] == "1", argv[6] if len(argv) > 6 else ""
    prompt = json.load(open(prompt_file)) if prompt_file.endswith(".json") else open(prompt_file).read()
    runs = [one(url, prompt, max_tokens, ignore_eos)]  # warm-up: not in the figures
    m0 = metrics(url)
    runs += [one(url, prompt, max_tokens, ignore_eos) for _ in range(n_req - 1)]
    m1 = metrics(url)
    timed = runs[1:] or runs
    rates = sorted(r["client_tok_s"] for r in timed if r["client_tok_s"])
    out = {"label": label, "requests": len(timed), "max_tokens": max_tokens,
           "client_tok_s": rates[len(rates) // 2] if rates else None,
           "server_tok_s": sorted(r["server_tok_s"] or 0 for r in timed)[len(timed) // 2] or None,
           "same_text": len({r["text"] for r in runs}) == 1, "text": timed[-1]["text"], "runs": runs}
    drafted = [r["draft_n"] for r in timed if r["draft_n"] is not None]
    if drafted:  # llama-server's own counts, summed over the timed requests
        out["drafted"] = sum(drafted)
        out["accepted"] = sum(r["draft_n_accepted"] or 0 for r in timed)
    if m1:
        d = {k: m1[k] - m0.get(k, 0.0) for k in m1 if not k.startswith("ferry_vram_")}
        out["metrics"] = d
        out["gauges"] = {k: v for k, v in m1.items() if k.startswith("ferry_vram_")}
        if d.get("ferry_spec_drafted_tokens_total"):
            out["drafted"] = int(d["ferry_spec_drafted_tokens_total"])
            out["accepted"] = int(d.get("ferry_spec_accepted_tokens_total", 0))
            out["verifications"] = int(d.get("ferry_spec_verifications_total", 0))
    if out.get("drafted"):
        out["acceptance"] = round(out["accepted"] / out["drafted"], 3)
    print(json.dumps(out))
    return 0 if out["client_tok_s"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
