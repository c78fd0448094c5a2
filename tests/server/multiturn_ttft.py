#!/usr/bin/env python3
"""multiturn_ttft.py — time to first token of each turn of a multi-turn chat against a running OpenAI-compatible
server (ferry serve, llama-server), and how much of each prompt the server's prompt cache gave back.

The conversation is sent whole at every turn, as OpenAI clients do: turn k's request holds the system prompt,
the k user messages and the k-1 replies the server gave (the text of each reply as streamed back, with its
reasoning dropped, as a client keeps it). Without reuse, turn k's prefill grows with the conversation; with it,
only the new part (the last reply, the new user message and the template's tokens around them) needs computing.

Two variants:
  chat   TURNS user messages of TURN_TOKENS tokens each and a one-line system prompt (8 x 500 by default).
  agent  a long first prompt (a SYSTEM_TOKENS-token system prompt carrying a list of TOOLS tools in text, then a
         TURN_TOKENS-token first user message), then TURNS-1 short user messages of SHORT_TOKENS tokens: the form
         in which later turns can take a small fraction of turn 1's time.

Each turn is one streaming chat completion (temperature 0, MAX_TOKENS tokens, stream_options.include_usage):
TTFT = from sending the request to the first chunk with content or reasoning text. Also recorded: the prompt
and cached token counts of the final usage chunk (usage.prompt_tokens_details.cached_tokens; llama-server
also sends timings.cache_n and timings.prompt_ms, kept as given), the wall time of the whole request and the reply's text. The
prompts are deterministic: seeded random words from a fixed list, sized in tokens with the server's /tokenize
(when it has none, 4 characters a token). A warm-up request with an unrelated prompt comes first.

    python3 tests/server/multiturn_ttft.py --url http://127.0.0.1:8080 --variant chat --label ferry \
        --jsonl out.jsonl
--no-cache-prompt sends cache_prompt: false in each request (llama-server's per-request switch; ferry's server
option is --prompt-cache=false). Prints a table: per turn, prompt tokens, cached tokens, TTFT, TTFT / turn 1.
"""
import argparse
import json
import random
import sys
import time
import urllib.request

from openai import OpenAI

WORDS = ("the of and to in is was for on that with as by at from his her they this which an are be were had not "
         "but have one all their there been has when who will more no if out so said what up its about into than "
         "them can only other new some could time these two may then do first any my now such like our over man "
         "me even most made after also did many before must through back years where much your way well down "
         "should because each just those people how too little state good very make world still own see men work "
         "long get here between both life being under never day same another know while last might us great old "
         "year off come since against go came right used take three river garden window engine market silver "
         "winter harbor signal pocket ladder copper meadow lantern thunder basket feather orbit canyon").split()


def tokens_of(url, text):
    """The server's token count of text (its /tokenize), or None when it has none."""
    try:
        req = urllib.request.Request(url.rstrip("/") + "/tokenize", data=json.dumps({"content": text}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return len(json.load(r)["tokens"])
    except Exception:
        return None


def text_of(url, rng, n_tokens):
    """Seeded random words whose text is about n_tokens tokens long by the server's tokenizer."""
    words = [rng.choice(WORDS) for _ in range(4 * n_tokens + 16)]
    full = tokens_of(url, " ".join(words))
    if full is None:  # no /tokenize: about 4 characters a token
        out, n = [], 0
        while n < 4 * n_tokens:
            out.append(words[len(out)])
            n += len(out[-1]) + 1
        return " ".join(out)
    k = max(1, min(len(words), round(len(words) * n_tokens / max(1, full))))
    for _ in range(6):  # proportional steps, then one word at a time
        t = tokens_of(url, " ".join(words[:k]))
        if t == n_tokens or t is None:
            break
        step = round(k * (n_tokens - t) / max(1, t))
        step = step if step else (1 if t < n_tokens else -1)
        k = max(1, min(len(words), k + step))
    return " ".join(words[:k])


def system_prompt(url, rng, variant, n_tokens, n_tools):
    if variant == "chat":
        return "You are a helpful assistant."
    tools = [{"type": "function", "function": {
        "name": f"tool_{i}", "description": " ".join(rng.choice(WORDS) for _ in range(12)),
        "parameters": {"type": "object", "properties": {f"arg_{j}": {"type": "string"} for j in range(3)},
                       "required": ["arg_0"]}}} for i in range(n_tools)]
    head = ("You are a coding agent. You can call these tools; answer with a tool call when one helps.\n"
            "# Tools\n" + "\n".join(json.dumps(t) for t in tools) + "\n# Instructions\n")
    used = tokens_of(url, head) or len(head) // 4
    return head + text_of(url, rng, max(16, n_tokens - used))


def run_turn(client, model, messages, max_tokens, no_cache):
    """One streaming request: (TTFT s, total s, reply text, usage dict, llama-server timings or None)."""
    extra = {"cache_prompt": False} if no_cache else None
    t0 = time.perf_counter()
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body=extra)
    ttft, text, usage, timings = None, [], None, None
    for chunk in stream:
        extra_fields = chunk.model_extra or {}
        if extra_fields.get("timings"):
            timings = extra_fields["timings"]
        if chunk.usage:
            usage = chunk.usage.model_dump()
        for ch in chunk.choices:
            d = ch.delta
            reasoning = (d.model_extra or {}).get("reasoning_content") if d else None
            if d and (d.content or reasoning) and ttft is None:
                ttft = time.perf_counter() - t0
            if d and d.content:
                text.append(d.content)
    total = time.perf_counter() - t0
    return ttft if ttft is not None else total, total, "".join(text), usage or {}, timings


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080", help="the server (without /v1)")
    ap.add_argument("--model", help="the model name to send (default: the first of /v1/models)")
    ap.add_argument("--variant", choices=("chat", "agent"), default="chat")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--turn-tokens", type=int, default=500, help="tokens of each user message (chat), of the "
                    "first one (agent)")
    ap.add_argument("--system-tokens", type=int, default=3000, help="agent: the system prompt's tokens")
    ap.add_argument("--tools", type=int, default=8, help="agent: tools described in the system prompt")
    ap.add_argument("--short-tokens", type=int, default=50, help="agent: tokens of the user messages after the first")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-cache-prompt", action="store_true", help="send cache_prompt: false with each request")
    ap.add_argument("--label", default="", help="a name for the server and its setting, kept in each record")
    ap.add_argument("--jsonl", help="append one JSON record per turn here")
    ap.add_argument("--timeout", type=float, default=1800)
    a = ap.parse_args()

    client = OpenAI(base_url=a.url.rstrip("/") + "/v1", api_key="none", timeout=a.timeout, max_retries=0)
    if not a.model:
        a.model = client.models.list().data[0].id
    rng = random.Random(a.seed)
    system = system_prompt(a.url, rng, a.variant, a.system_tokens, a.tools)
    users = [text_of(a.url, rng, a.turn_tokens if a.variant == "chat" or k == 0 else a.short_tokens)
             for k in range(a.turns)]
    # warm-up: a short unrelated prompt, so turn 1 does not pay for the server's first request
    run_turn(client, a.model, [{"role": "user", "content": "warm up " + text_of(a.url, random.Random(-1), 32)}],
             4, a.no_cache_prompt)

    messages = [{"role": "system", "content": system}]
    rows = []
    out = open(a.jsonl, "a") if a.jsonl else None
    print(f"# {a.label or a.url}: {a.variant}, {a.turns} turns, max_tokens {a.max_tokens}"
          f"{', cache_prompt false' if a.no_cache_prompt else ''}")
    print("| turn | prompt tokens | cached tokens | TTFT s | TTFT / turn 1 | request s |")
    print("|---|---|---|---|---|---|")
    for k, u in enumerate(users):
        messages.append({"role": "user", "content": u})
        ttft, total, reply, usage, timings = run_turn(client, a.model, messages, a.max_tokens, a.no_cache_prompt)
        messages.append({"role": "assistant", "content": reply})
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        rec = {"label": a.label, "variant": a.variant, "turn": k + 1, "ttft_s": round(ttft, 4),
               "request_s": round(total, 4), "prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": cached,
               "completion_tokens": usage.get("completion_tokens"), "no_cache_prompt": a.no_cache_prompt,
               "max_tokens": a.max_tokens, "seed": a.seed, "reply": reply}
        if timings:
            rec["server_timings"] = {x: timings.get(x) for x in ("cache_n", "prompt_n", "prompt_ms")}
        rows.append(rec)
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()
        ratio = ttft / rows[0]["ttft_s"] if rows[0]["ttft_s"] > 0 else float("nan")
        print(f"| {k + 1} | {rec['prompt_tokens']} | {cached} | {ttft:.3f} | {ratio:.2f} | {total:.3f} |",
              flush=True)
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
