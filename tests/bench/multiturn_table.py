#!/usr/bin/env python3
"""multiturn_table.py RESULTS_DIR — table.md of a tests/bench/compare_multiturn.sh run, from its meta.json and
results.jsonl (one record a turn, tests/server/multiturn_ttft.py's, labelled ferry, llama.cpp, ferry-nocache and
llama.cpp-nocache). Per conversation and turn: each server's prompt tokens, the tokens its prompt cache gave
back, those it computed, its TTFT, TTFT over its turn 1's and over the same turn with the prompt cache off."""
import json
import os
import sys

ABOUT = {
    "chat": "user messages of 500 tokens, the whole conversation sent again each turn",
    "agent": "a 3,000-token system prompt with a tool list and a 500-token first message, then messages of "
             "50 tokens",
}


def table(meta, rows):
    by = {(r["label"], r["variant"], r["turn"]): r for r in rows}
    turns = max(r["turn"] for r in rows)
    out = ["# " + meta["title"], "",
           f"{meta['date']}, commit {meta['commit']}; {meta['machine']}; both servers {meta['threads']} "
           f"thread(s), max_tokens {meta['max_tokens']}, temperature 0.", "",
           f"Model: {meta['model']}. llama.cpp: {meta['llama_cpp']}.", "",
           f"Command: `{meta['command']}` (every server command line and client call: commands.txt).", "",
           "How to read it. Each request carries the whole conversation, as OpenAI clients send it, so without "
           "reuse turn k computes all k turns again. With the prompt cache a turn continues from the recurrent "
           "state the server saved at the end of the turn before, so it computes only the last reply, the new "
           "message and the template's tokens around them (the reply is computed again here because the "
           "file's synthetic vocabulary spells the text sent back in byte tokens, not in the word tokens the "
           "model generated; where the text re-tokenizes the same, a slot continues past the reply too). In the chat form every later turn "
           "brings at least as many new tokens as turn 1 did (a 500-token message), so its TTFT cannot fall to "
           "a fraction of turn 1's: there the measure is the same turn with the cache off. In the agent form, "
           "a long first prompt then short turns, later turns at 0.2x turn 1's TTFT or below is the meaningful "
           "target.", ""]
    summary = []
    for v in ("chat", "agent"):
        if not any(k[1] == v for k in by):
            continue
        out += [f"## {v}: {ABOUT[v]}", "",
                "| turn | server | prompt tokens | cached | computed | TTFT s | / turn 1 | TTFT s, cache off "
                "| / cache off |",
                "|---|---|---|---|---|---|---|---|---|"]
        for k in range(1, turns + 1):
            for who in ("ferry", "llama.cpp"):
                r, off, t1 = by.get((who, v, k)), by.get((who + "-nocache", v, k)), by.get((who, v, 1))
                if not r or not t1:
                    continue
                cached = r["cached_tokens"] or 0
                out.append(f"| {k} | {who} | {r['prompt_tokens']} | {cached} | {r['prompt_tokens'] - cached} | "
                           f"{r['ttft_s']:.3f} | {r['ttft_s'] / t1['ttft_s']:.2f}x | "
                           + (f"{off['ttft_s']:.3f} | {r['ttft_s'] / off['ttft_s']:.2f}x |" if off else "— | — |"))
        out.append("")
        for who in ("ferry", "llama.cpp"):
            later = [by[(who, v, k)] for k in range(2, turns + 1) if (who, v, k) in by]
            if not later or (who, v, 1) not in by:
                continue
            t1 = by[(who, v, 1)]["ttft_s"]
            s = f"{who}, {v}, turns 2-{turns}: TTFT {min(r['ttft_s'] for r in later) / t1:.2f}x to " \
                f"{max(r['ttft_s'] for r in later) / t1:.2f}x of turn 1's"
            offs = [(r["ttft_s"], by[(who + "-nocache", v, r["turn"])]["ttft_s"]) for r in later
                    if (who + "-nocache", v, r["turn"]) in by]
            if offs:
                s += f"; {min(a / b for a, b in offs):.2f}x to {max(a / b for a, b in offs):.2f}x of the same " \
                     f"turn's with the prompt cache off"
            s += f"; cached tokens of turns 2-{turns}: {', '.join(str(r['cached_tokens']) for r in later)}."
            if v == "agent":
                worst = max(r["ttft_s"] for r in later) / t1
                s += f" Turns 2-{turns} at 0.2x turn 1's or below: {'yes' if worst <= 0.2 else 'no'}."
            out.append(s)
            summary.append(s)
        out.append("")
    out += ["TTFT: from sending the request to the first streamed token, measured by the client (Python, openai). "
            "cached: the final usage chunk's prompt_tokens_details.cached_tokens; computed: prompt tokens minus "
            "cached. Cache off: ferry --prompt-cache=false; llama-server with cache_prompt false in each request. "
            "The replies (and so the later prompts) are each server's own greedy tokens, so the two servers' "
            "prompt token counts differ slightly.", ""]
    return "\n".join(out)


def main():
    d = sys.argv[1]
    meta = json.load(open(os.path.join(d, "meta.json")))
    rows = [json.loads(x) for x in open(os.path.join(d, "results.jsonl")) if x.strip()]
    text = table(meta, rows)
    with open(os.path.join(d, "table.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
