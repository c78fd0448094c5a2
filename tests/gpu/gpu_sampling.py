#!/usr/bin/env python3
"""gpu_sampling.py BINARY MODEL [BACKEND] — on the GPU machine: `ferry serve --backend cuda` with the GPU sampler
(--gpu-sampling true, the default), with it but one step at a time (--overlap false) and without it (false, every
row sampled on the host) must answer the same requests identically: the same text for seeded sampling (temperature, top-k/p, min-p, penalties, logit_bias),
for greedy, for json_object output (the grammar's mask drawn on the device), and logprobs within 1e-4.
Requests go one at a time, so both servers run the same batches (the engine is deterministic for a batch).
The first two servers' /metrics must count device-drawn tokens (ferry_device_sampled_tokens_total: the GPU sampler
really ran) and the third's none; the first must count overlapped steps (ferry_overlapped_steps_total: a step
began before the last one's tokens were published) and the second none. Prints one line per case and exits 1 on any difference."""
import json
import subprocess
import sys
import time
import urllib.request

BIN, MODEL = sys.argv[1], sys.argv[2]
BACKEND = sys.argv[3] if len(sys.argv) > 3 else "cuda"  # cpu: a dry run of the script itself

CASES = [
    {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0},
    {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0.8, "top_k": 40, "top_p": 0.9, "seed": 11},
    {"prompt": "The little dog", "max_tokens": 48, "temperature": 1.2, "min_p": 0.05, "seed": 5,
     "frequency_penalty": 0.5, "presence_penalty": 0.3, "repetition_penalty": 1.2},
    {"prompt": "Lily went", "max_tokens": 32, "temperature": 1.0, "seed": 3, "logit_bias": {"13": 5, "29": -100}},
    {"prompt": "Tom and", "max_tokens": 24, "temperature": 0.7, "seed": 8, "logprobs": 5},
    {"prompt": "A cat", "max_tokens": 24, "temperature": 0.9, "seed": 2, "n": 3},
    {"messages": [{"role": "user", "content": "Give a JSON object"}], "max_tokens": 40, "temperature": 0.9,
     "seed": 4, "response_format": {"type": "json_object"}},
]


def start(port, gpu_sampling, overlap="true"):
    p = subprocess.Popen([BIN, "serve", "--model", MODEL, "--backend", BACKEND, "--port", str(port), "--parallel", "4",
                          "--gpu-sampling", gpu_sampling, "--overlap", overlap, "--chat-template", "chatml"],
                         stdout=open(f"/tmp/gs-{port}.log", "w"), stderr=subprocess.STDOUT)
    for _ in range(200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return p
        except OSError:
            if p.poll() is not None:
                sys.exit(f"server exited: {open(f'/tmp/gs-{port}.log').read()[-2000:]}")
            time.sleep(0.1)
    sys.exit("server did not start")


def ask(port, case):
    path = "/v1/chat/completions" if "messages" in case else "/v1/completions"
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(case).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def main():
    a, b, c = start(18101, "true"), start(18102, "false"), start(18103, "true", "false")
    bad = 0
    try:
        for i, case in enumerate(CASES):
            ra, rb, rc = ask(18101, case), ask(18102, case), ask(18103, case)
            for ca, cb, cc in zip(ra["choices"], rb["choices"], rc["choices"]):
                tc = cc.get("text", cc.get("message", {}).get("content"))
                ta = ca.get("text", ca.get("message", {}).get("content"))
                tb = cb.get("text", cb.get("message", {}).get("content"))
                ok = ta == tb == tc and ca["finish_reason"] == cb["finish_reason"] == cc["finish_reason"]
                if ok and case.get("logprobs"):
                    la, lb = ca["logprobs"]["token_logprobs"], cb["logprobs"]["token_logprobs"]
                    ok = len(la) == len(lb) and all(abs(x - y) <= 1e-4 for x, y in zip(la, lb))
                if ok and case.get("response_format"):
                    json.loads(ta)
                print(f"case {i}: {'same' if ok else 'DIFFERENT'}: {ta[:60]!r}" +
                      ("" if ok else f" vs {tb[:60]!r} (host) and {tc[:60]!r} (no overlap)"))
                bad += not ok
        drawn, over = {}, {}
        for port in (18101, 18102, 18103):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
                m = dict(l.rsplit(" ", 1) for l in r.read().decode().splitlines() if l and not l.startswith("#"))
            drawn[port] = float(m["ferry_device_sampled_tokens_total"])
            over[port] = float(m["ferry_overlapped_steps_total"])
            print(f"server :{port}: {drawn[port]:.0f} of {float(m['ferry_generated_tokens_total']):.0f} tokens drawn "
                  f"on the device, {float(m['ferry_engine_steps_total']):.0f} steps, {over[port]:.0f} overlapped")
        if BACKEND == "cuda" and (drawn[18101] <= 0 or drawn[18103] <= 0 or drawn[18102] != 0):
            print("the GPU sampler did not run on the --gpu-sampling true servers (or ran on the false one)")
            bad += 1
        if BACKEND == "cuda" and (over[18101] <= 0 or over[18103] != 0 or over[18102] != 0):
            print("no step overlapped on the --overlap true server (or one did with --overlap false)")
            bad += 1
    finally:
        for p in (a, b, c):
            p.terminate()
            p.wait()
    print("gpu_sampling: " + ("FAIL" if bad else "ok"))
    sys.exit(1 if bad else 0)


main()
