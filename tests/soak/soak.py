#!/usr/bin/env python3
"""soak — run `ferry serve` under mixed load, a disconnect storm and a connection flood for a given time, then check
that nothing was lost and nothing grew. Not part of CI (it runs for minutes or hours).

Three loads at once, for --minutes:
  mixed       --workers clients on keep-alive connections: completions (n, logprobs, echo, stop strings), chat
              completions, streamed and not, /tokenize, /v1/models, /health; every answer is checked (a 200 has the
              tokens asked for and a well-formed body; 503 + Retry-After is allowed when the queue is full)
  disconnect  clients that start a stream or a long request and vanish at a random moment (before the head, mid
              body, mid stream), or stop reading
  flood       --flood idle and slowloris connections from 127.0.0.2, churned all the time (some get 503 at the cap)
Every --sample seconds the server's RSS, open descriptors, threads and /metrics are recorded. At the end the loads
stop, the server must come back to idle (no running or queued sequence, no open connection but ours; then 11 s, so
that its periodic heap trim has run), and the final sample is compared with the one taken after warm-up: the run
fails if any answer was lost or wrong, or if the descriptors or threads grew, or RSS grew by more than --rss-slack
MiB after the first quarter of the run (the plateau: by then the flood has filled libmicrohttpd's per-connection
pools, 32 KiB each, and the allocator its high-water mark; growth after it is what a leak looks like). RSS here is
the anonymous part (heap, pinned buffers: RssAnon + RssShmem); the file-backed part (RssFile: pages of the memory-
mapped model, such as rows of the token embedding faulted in as new token ids appear) is printed beside it, since
the kernel can drop it at will.
With --vram-budget (a server on a GPU) each sample also reads the process's device memory from nvidia-smi. The
engine reports what it took at load (ferry_vram_used_bytes, measured with cudaMemGetInfo after the CUDA context
existed); the process's figure is that plus the context. The run fails if the engine's figure exceeds the budget,
or if at any sample the process holds more than the context plus the budget (what it took while serving must fit
in the headroom the plan left).

  tests/soak/soak.py --minutes 30 [--model PATH] [--binary build/server/ferry] [--workers 8] [--flood 500]
  tests/soak/soak.py --minutes 10 --model big.gguf --serve-args "--gpu-memory 2GiB ..." --vram-budget 2048
  tests/soak/soak.py --minutes 5 --url http://127.0.0.1:8080 --pid 1234     (a server already running)
Prints a summary table; exit status 0 when the run passed.
"""
import argparse
import http.client
import json
import os
import random
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.errors = []

    def add(self, key, n=1):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + n

    def error(self, what):
        with self.lock:
            self.counts["ERROR"] = self.counts.get("ERROR", 0) + 1
            if len(self.errors) < 50:
                self.errors.append(f"{time.strftime('%H:%M:%S')} {what}")


def proc_sample(pid):
    out = {"rss_kib": 0, "anon_kib": 0, "file_kib": 0, "fds": 0, "threads": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    out["rss_kib"] = int(line.split()[1])
                elif line.startswith(("RssAnon:", "RssShmem:")):
                    out["anon_kib"] += int(line.split()[1])
                elif line.startswith("RssFile:"):
                    out["file_kib"] = int(line.split()[1])
                elif line.startswith("Threads:"):
                    out["threads"] = int(line.split()[1])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    return out


def anon_maps(pid):
    """Anonymous KiB per mapping ("start perms name" -> KiB; the start, as the heap's end moves) from
    /proc/pid/smaps: where growth happened."""
    out, key = {}, None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split(None, 5)
                if "-" in head[0] and not head[0].endswith(":"):
                    key = f"{head[0].split('-')[0]} {head[1]} {head[5].strip() if len(head) > 5 else ''}"
                elif head[0] == "Anonymous:" and key:
                    out[key] = out.get(key, 0) + int(head[1])
    except OSError:
        pass
    return out


def gpu_mib(pid):
    """The device memory (MiB) nvidia-smi attributes to pid. In a container nvidia-smi may list processes under
    the host's pids (or none): then the one process it lists, else the device's whole used memory, stands in."""
    def query(what):
        try:
            return subprocess.run(["nvidia-smi", "--query-" + what, "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""
    apps = [[x.strip() for x in line.split(",")] for line in query("compute-apps=pid,used_memory").splitlines()]
    apps = [a for a in apps if len(a) == 2 and a[1].isdigit()]
    for a in apps:
        if a[0] == str(pid):
            return int(a[1])
    if len(apps) == 1:
        return int(apps[0][1])
    used = query("gpu=memory.used").split()
    return int(used[0]) if used and used[0].isdigit() and not apps else None


def metrics(base):
    for attempt in range(40):  # the flood may hold the connection cap: 503 + Retry-After, then a retry
        try:
            with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
                text = r.read().decode()
            break
        except urllib.error.HTTPError as e:
            if e.code != 503 or attempt == 39:
                raise
            time.sleep(0.25)
    m = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            m[k] = float(v)
    return m


# ---- the mixed load ----------------------------------------------------------------------------------------


PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went to the park", "One day, a big bird",
           "Sam had a red ball. He", "The sun was hot and"]


def mixed_request(rng):
    kind = rng.choice(["completion", "completion", "chat", "stream", "stream_chat", "tokenize", "models", "health"])
    mt = rng.randint(1, 48)
    if kind == "completion":
        body = {"prompt": rng.choice(PROMPTS), "max_tokens": mt, "temperature": rng.choice([0, 0.7, 1.0]),
                "n": rng.choice([1, 1, 2]), "seed": rng.randint(0, 1 << 30)}
        if rng.random() < 0.3:
            body["logprobs"] = rng.randint(0, 3)
        if rng.random() < 0.2:
            body["echo"] = True
        if rng.random() < 0.2:
            body["stop"] = ["."]
        return kind, "POST", "/v1/completions", body
    if kind in ("chat", "stream_chat"):
        body = {"messages": [{"role": "user", "content": rng.choice(PROMPTS)}], "max_tokens": mt,
                "temperature": 0.8, "stream": kind == "stream_chat"}
        return kind, "POST", "/v1/chat/completions", body
    if kind == "stream":
        return kind, "POST", "/v1/completions", {"prompt": rng.choice(PROMPTS), "max_tokens": mt, "stream": True,
                                                 "stream_options": {"include_usage": True}}
    if kind == "tokenize":
        return kind, "POST", "/tokenize", {"content": rng.choice(PROMPTS) * rng.randint(1, 20)}
    return kind, "GET", "/v1/models" if kind == "models" else "/health", None


def check_answer(kind, body, status, hdrs, raw):
    """None when the answer is right, else what is wrong."""
    if status == 503:
        if hdrs.get("Retry-After") != "1":
            return "503 without Retry-After"
        j = json.loads(raw)
        return None if "error" in j else "503 without an error object"
    if status != 200:
        return f"status {status}: {raw[:200]!r}"
    if kind in ("stream", "stream_chat"):
        events = [e[6:] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
        if not events or events[-1] != b"[DONE]":
            return "stream without [DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        if any("error" in c for c in chunks):
            return f"stream error event {chunks}"
        if kind == "stream":
            usage = chunks[-1].get("usage")
            if not usage or usage["completion_tokens"] > body["max_tokens"]:
                return f"stream usage {usage}"
        return None
    j = json.loads(raw)
    if kind in ("completion", "chat"):
        n = body.get("n", 1)
        if len(j["choices"]) != n:
            return f"{len(j['choices'])} choices for n={n}"
        if j["usage"]["completion_tokens"] > n * body["max_tokens"] or j["usage"]["completion_tokens"] < 1:
            return f"usage {j['usage']} for max_tokens {body['max_tokens']}"
        for ch in j["choices"]:
            if ch["finish_reason"] not in ("stop", "length"):
                return f"finish_reason {ch['finish_reason']}"
    elif kind == "tokenize":
        if not j["tokens"]:
            return "no tokens"
    elif kind == "models":
        if not j["data"]:
            return "no models"
    elif kind == "health":
        if j != {"status": "ok"}:
            return f"health {j}"
    return None


def mixed_worker(host, port, stop, stats, seed, key):
    rng = random.Random(seed)
    conn = None
    while not stop.is_set():
        kind, method, path, body = mixed_request(rng)
        try:
            if conn is None:
                conn = http.client.HTTPConnection(host, port, timeout=120)
            hdrs = {"Content-Type": "application/json"}
            if key:
                hdrs["Authorization"] = "Bearer " + key
            conn.request(method, path, json.dumps(body) if body is not None else None, hdrs)
            r = conn.getresponse()
            raw = r.read()
            problem = check_answer(kind, body, r.status, r.headers, raw)
            if r.headers.get("Connection") == "close":
                conn.close()
                conn = None
        except (OSError, http.client.HTTPException, ValueError) as e:
            problem = f"{type(e).__name__}: {e}"
            conn = None
        if problem:
            stats.error(f"mixed {kind}: {problem}")
        else:
            stats.add(f"mixed {kind}")


# ---- the disconnect storm ----------------------------------------------------------------------------------


def disconnect_worker(host, port, stop, stats, seed):
    rng = random.Random(seed)
    while not stop.is_set():
        mode = rng.choice(["mid-head", "mid-body", "mid-stream", "mid-wait", "no-read"])
        body = json.dumps({"prompt": rng.choice(PROMPTS), "max_tokens": rng.randint(50, 400),
                           "stream": mode != "mid-wait", "temperature": 1}).encode()
        req = (b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body)) + body
        try:
            s = socket.create_connection((host, port), timeout=30)
            if mode == "mid-head":
                s.sendall(req[:rng.randint(1, 60)])
            elif mode == "mid-body":
                s.sendall(req[:len(req) - rng.randint(1, 10)])
            else:
                s.sendall(req)
                if mode == "mid-stream":  # leave after a random number of bytes (or at the end of a short one)
                    got, want = b"", rng.randint(1, 3000)
                    while len(got) < want and b"[DONE]" not in got:
                        d = s.recv(4096)
                        if not d:
                            break
                        got += d
                elif mode == "no-read":
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            time.sleep(rng.uniform(0, 0.3))
            s.close()
            stats.add(f"disconnect {mode}")
        except OSError as e:
            stats.error(f"disconnect {mode}: {e}")
        time.sleep(rng.uniform(0, 0.05))


# ---- the connection flood ------------------------------------------------------------------------------------


def flood_worker(port, stop, stats, n_target, seed):
    rng = random.Random(seed)
    held = []
    while not stop.is_set():
        while len(held) < n_target and not stop.is_set():
            try:
                s = socket.socket()
                s.bind(("127.0.0.2", 0))
                s.settimeout(2)
                s.connect(("127.0.0.1", port))
                if rng.random() < 0.5:
                    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n")
                held.append(s)
                stats.add("flood opened")
            except OSError:
                stats.add("flood refused")  # 503 at the cap, or the backlog full: both expected
                time.sleep(0.05)
                break
        for s in rng.sample(held, min(len(held), max(1, n_target // 20))):  # churn 5%, trickle a few
            if rng.random() < 0.5:
                try:
                    s.sendall(b"X")
                    continue
                except OSError:
                    pass
            s.close()
            held.remove(s)
        time.sleep(0.2)
    for s in held:
        s.close()


# ---- the run ---------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--url", help="a server already running (then --pid too)")
    ap.add_argument("--pid", type=int)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "server", "ferry"))
    ap.add_argument("--model", default=os.path.join(ROOT, "..", "shared", "testdata", "models", "stories260K.gguf"))
    ap.add_argument("--serve-args", default="--parallel 8 --max-queue 64 --threads 1 --max-connections 450 "
                    "--max-connections-per-ip 0")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--disconnectors", type=int, default=4)
    ap.add_argument("--flood", type=int, default=500)
    ap.add_argument("--sample", type=float, default=30)
    ap.add_argument("--rss-slack", type=float, default=4, help="MiB of RSS growth allowed after the first quarter")
    ap.add_argument("--api-key")
    ap.add_argument("--vram-budget", type=float, help="MiB: the server's --gpu-memory; sample its device memory")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.flood + 1024)), hard))

    proc = None
    if args.url:
        base, pid = args.url.rstrip("/"), args.pid
        if not pid:
            sys.exit("--url needs --pid (the server's process, for RSS, descriptors and threads)")
    else:
        log = open("/tmp/ferry-soak.log", "w")
        cmd = ["nice", args.binary, "serve", "--model", args.model, "--port", "0"] + args.serve_args.split()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        pid = proc.pid  # nice execs the server in its own process
        for _ in range(600):
            m = re.search(r"listening on http://[^ ]*:(\d+)[/ ]", open("/tmp/ferry-soak.log").read())
            if m:
                base = f"http://127.0.0.1:{m.group(1)}"
                break
            time.sleep(0.05)
        else:
            sys.exit("the server did not start: " + open("/tmp/ferry-soak.log").read()[-2000:])
    host, port = base.split("//")[1].split(":")
    port = int(port)
    for _ in range(600):
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        time.sleep(0.1)
    stats = Stats()
    # warm-up: every slot and buffer touched once, then the baseline
    stop = threading.Event()
    warm = [threading.Thread(target=mixed_worker, args=(host, port, stop, stats, 1000 + i, args.api_key))
            for i in range(args.workers)]
    for t in warm:
        t.start()
    time.sleep(15)
    stop.set()
    for t in warm:
        t.join()
    stats = Stats()
    time.sleep(1)
    start = proc_sample(pid)
    m0 = metrics(base)
    print(f"start: RSS {start['rss_kib']} KiB, fds {start['fds']}, threads {start['threads']}", flush=True)
    vram = []  # (seconds, process MiB)
    if args.vram_budget:
        engine_mib = m0.get("ferry_vram_used_bytes", 0) / 1048576
        p0 = gpu_mib(pid)
        if p0 is None:
            sys.exit("--vram-budget: nvidia-smi lists no device memory for the server's process")
        context_mib = p0 - engine_mib
        vram.append((0.0, p0))
        print(f"vram: engine took {engine_mib:.0f} MiB at load (budget {args.vram_budget:g}), process holds {p0} MiB "
              f"(CUDA context {context_mib:.0f} MiB)", flush=True)

    stop = threading.Event()
    threads = [threading.Thread(target=mixed_worker, args=(host, port, stop, stats, i, args.api_key))
               for i in range(args.workers)]
    threads += [threading.Thread(target=disconnect_worker, args=(host, port, stop, stats, 100 + i))
                for i in range(args.disconnectors)]
    if args.flood:
        threads.append(threading.Thread(target=flood_worker, args=(port, stop, stats, args.flood, 7)))
    for t in threads:
        t.start()
    t0 = time.time()
    samples = []
    plateau_maps = None
    while time.time() - t0 < args.minutes * 60:
        time.sleep(min(args.sample, max(0.1, args.minutes * 60 - (time.time() - t0))))
        s = proc_sample(pid)
        try:
            m = metrics(base)
        except OSError as e:
            stats.error(f"/metrics: {e}")
            m = {}
        samples.append((time.time() - t0, s, m))
        if plateau_maps is None and time.time() - t0 >= args.minutes * 60 / 4:
            plateau_maps = anon_maps(pid)
        g = gpu_mib(pid) if args.vram_budget else None
        if args.vram_budget:
            vram.append((time.time() - t0, g if g is not None else -1))
        with stats.lock:
            served = sum(v for k, v in stats.counts.items() if k.startswith("mixed"))
            errs = stats.counts.get("ERROR", 0)
        print(f"  {time.time() - t0:7.0f}s RSS {s['rss_kib']:7d} KiB anon {s['anon_kib']:7d} fds {s['fds']:5d} threads {s['threads']:3d} "
              f"conns {m.get('ferry_http_connections_open', 0):5.0f} running {m.get('ferry_running_sequences', 0):3.0f} "
              f"served {served} errors {errs}" + (f" vram {g} MiB" if args.vram_budget else ""), flush=True)
    stop.set()
    for t in threads:
        t.join()
    # back to idle: nothing running, nothing queued, only our /metrics connection open
    deadline = time.time() + 60
    while time.time() < deadline:
        m1 = metrics(base)
        if (m1["ferry_running_sequences"] == 0 and m1["ferry_queue_depth"] == 0 and
                m1.get("ferry_http_connections_open", 1) <= 1):
            break
        time.sleep(0.5)
    time.sleep(11)  # refused connections linger up to 2 s; the server trims its heaps every 10 s
    end = proc_sample(pid)
    end_maps = anon_maps(pid)
    m1 = metrics(base)
    problems = []
    if m1["ferry_running_sequences"] or m1["ferry_queue_depth"]:
        problems.append(f"not idle: {m1['ferry_running_sequences']} running, {m1['ferry_queue_depth']} queued")
    if m1.get("ferry_http_connections_open", 0) > 1:
        problems.append(f"{m1['ferry_http_connections_open']:.0f} connections still open")
    if end["fds"] > start["fds"]:
        problems.append(f"descriptors grew {start['fds']} -> {end['fds']}")
    if end["threads"] > start["threads"]:
        problems.append(f"threads grew {start['threads']} -> {end['threads']}")
    plateau = next((smp for t, smp, _ in samples if t >= args.minutes * 60 / 4), start)
    if end["anon_kib"] - plateau["anon_kib"] > args.rss_slack * 1024:
        problems.append(f"anonymous RSS grew {plateau['anon_kib']} -> {end['anon_kib']} KiB after the first quarter")
    if args.vram_budget:
        if engine_mib > args.vram_budget:
            problems.append(f"the engine took {engine_mib:.0f} MiB for a budget of {args.vram_budget:g}")
        over = [(t, v) for t, v in vram if v < 0 or v > context_mib + args.vram_budget]
        if over:
            problems.append(f"device memory over context + budget ({context_mib + args.vram_budget:.0f} MiB) at "
                            f"{len(over)} of {len(vram)} samples, first {over[0][1]} MiB at {over[0][0]:.0f} s")
    if stats.counts.get("ERROR"):
        problems.append(f"{stats.counts['ERROR']} errors")
    print(f"\nsoak: {args.minutes:g} min, {args.workers} mixed clients, {args.disconnectors} disconnecting, "
          f"flood of {args.flood}")
    for k in sorted(stats.counts):
        print(f"  {k:28s} {stats.counts[k]}")
    d = lambda k: m1.get(k, 0) - m0.get(k, 0)  # noqa: E731
    capped = (d('ferry_http_connections_rejected_total{limit="max_connections"}') +
              d('ferry_http_connections_rejected_total{limit="per_ip"}'))
    print(f"  server: {d('ferry_generated_tokens_total'):.0f} tokens generated, "
          f"{d('ferry_requests_cancelled_total'):.0f} sequences cancelled, "
          f"{d('ferry_requests_rejected_total'):.0f} requests refused (queue full), "
          f"{d('ferry_http_connections_total'):.0f} connections, "
          f"{capped:.0f} refused at the cap, {d('ferry_http_request_timeouts_total'):.0f} request timeouts, "
          f"{d('ferry_http_stalled_readers_total'):.0f} stalled readers dropped, peak {m1.get('ferry_http_connections_peak', 0):.0f} open")
    rss = lambda s: f"RSS {s['rss_kib']} KiB (anonymous {s['anon_kib']}, file {s['file_kib']})"  # noqa: E731
    print(f"  start: {rss(start)}, fds {start['fds']}, threads {start['threads']}")
    print(f"  plateau (a quarter in): {rss(plateau)}")
    print(f"  end:   {rss(end)}, fds {end['fds']}, threads {end['threads']}")
    if args.vram_budget:
        print(f"  vram: {len(vram)} samples, process {min(v for _, v in vram)}-{max(v for _, v in vram)} MiB, "
              f"limit {context_mib + args.vram_budget:.0f} (context {context_mib:.0f} + budget {args.vram_budget:g})")
    before = plateau_maps or {}
    grew = sorted(((end_maps.get(k, 0) - before.get(k, 0), k) for k in set(end_maps) | set(before)), reverse=True)
    if grew and grew[0][0] > 0:
        print("  anonymous growth after the quarter, by mapping (KiB, mapping): " +
              "; ".join(f"{g:+d} {k}" for g, k in grew[:6] if g))
    for e in stats.errors[:20]:
        print("  error: " + e)
    if proc:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        if rc != 0:
            problems.append(f"exit {rc} on SIGTERM")
    print("soak " + ("PASSED" if not problems else "FAILED: " + "; ".join(problems)))
    sys.exit(0 if not problems else 1)


if __name__ == "__main__":
    main()
