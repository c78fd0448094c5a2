#!/usr/bin/env python3
"""loadgen — a streaming load generator for OpenAI-compatible servers (ferry serve, llama-server, vLLM).

Each of C workers holds one keep-alive HTTP/1.1 connection (raw asyncio streams, no dependencies) and sends
streamed /v1/completions requests (SSE) until N requests are done or the time limit passes. It measures,
per request, time to first token (first non-empty text chunk) and the gaps between text chunks, and counts
completion tokens from the final usage chunk (stream_options.include_usage).

Usage:  loadgen.py --url http://127.0.0.1:8080 --concurrency 1,8,32 --requests 64 --max-tokens 128 \
                   [--time-limit 60] [--api-key KEY] [--model NAME] [--json]
Prints one line per concurrency: requests, errors, tokens, wall time, tokens/s, TTFT p50/p99, ITL p50/p99.
"""
import argparse
import asyncio
import json
import sys
import time
import urllib.parse

WORDS = ("Once upon a time there was a little girl named Lily who loved to play in the park with her red ball and "
         "her best friend Tom . One sunny day they found a big box under the old tree and wondered what was "
         "inside it so they opened it slowly and saw a tiny dog that looked very hungry and sad").split()


def make_prompt(i, n_words=60):
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n_words))


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, int(round(p / 100.0 * len(xs) + 0.5)) - 1))
    return xs[k]


class Conn:
    def __init__(self, host, port):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def ensure(self):
        """Opens the connection if needed; returns True when it was opened now (not a reused keep-alive one)."""
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            return True
        return False

    def close(self):
        if self.writer is not None:
            self.writer.close()
            self.writer = None


async def read_head(reader):
    line = await reader.readline()
    if not line:
        raise ConnectionError("connection closed")
    status = int(line.split()[1])
    headers = {}
    while True:
        h = await reader.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, v = h.decode("latin-1").split(":", 1)
        headers[k.strip().lower()] = v.strip()
    return status, headers


async def read_body_chunks(reader, headers):
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0].strip(), 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                return
            data = await reader.readexactly(size)
            await reader.readexactly(2)
            yield data
    else:
        n = int(headers.get("content-length", "0"))
        if n:
            yield await reader.readexactly(n)


async def one_request(conn, args, i):
    body = json.dumps({"model": args.model, "prompt": make_prompt(i), "max_tokens": args.max_tokens,
                       "temperature": args.temperature, "seed": i, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    if args.model is None:
        body = body.replace(b'"model": null, ', b"")
    auth = f"Authorization: Bearer {args.api_key}\r\n" if args.api_key else ""
    head = (f"POST {args.path} HTTP/1.1\r\nHost: {conn.host}:{conn.port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\n{auth}Content-Length: {len(body)}\r\n\r\n").encode()
    fresh = await conn.ensure()
    t0 = time.perf_counter()
    try:
        conn.writer.write(head + body)
        await conn.writer.drain()
        status, headers = await read_head(conn.reader)
    except (ConnectionError, OSError):
        if fresh:
            raise
        # A reused keep-alive connection the server closed while idle (llama-server's HTTP library does after a
        # few requests): nothing was answered, so the request is sent again on a new one, as HTTP clients do.
        conn.close()
        await conn.ensure()
        t0 = time.perf_counter()
        conn.writer.write(head + body)
        await conn.writer.drain()
        status, headers = await read_head(conn.reader)
    res = {"ttft": None, "gaps": [], "tokens": 0, "error": None}
    buf, last = b"", None
    async for data in read_body_chunks(conn.reader, headers):
        if status != 200:
            buf += data
            continue
        buf += data
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: "):
                continue
            payload = ev[6:]
            if payload == b"[DONE]":
                continue
            obj = json.loads(payload)
            if "error" in obj:
                res["error"] = obj["error"].get("message", "error")
                continue
            if obj.get("usage"):
                res["tokens"] = obj["usage"]["completion_tokens"]
            for ch in obj.get("choices", []):
                if ch.get("text"):
                    now = time.perf_counter()
                    if res["ttft"] is None:
                        res["ttft"] = now - t0
                    else:
                        res["gaps"].append(now - last)
                    last = now
    if status != 200:
        res["error"] = f"HTTP {status}: {buf[:200]!r}"
    if headers.get("connection", "").lower() == "close":
        conn.close()
    res["latency"] = time.perf_counter() - t0
    return res


async def run_level(args, concurrency):
    u = urllib.parse.urlparse(args.url)
    counter = {"next": 0}
    results = []
    t_start = time.perf_counter()
    deadline = t_start + args.time_limit

    async def worker():
        conn = Conn(u.hostname, u.port or 80)
        while counter["next"] < args.requests and time.perf_counter() < deadline:
            i = counter["next"]
            counter["next"] += 1
            try:
                r = await asyncio.wait_for(one_request(conn, args, i), max(0.1, deadline - time.perf_counter()))
            except Exception as e:  # noqa: BLE001 — every failure is counted and reported
                r = {"ttft": None, "gaps": [], "tokens": 0, "error": f"{type(e).__name__}: {e}", "latency": 0}
                conn.close()
            results.append(r)
        conn.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t_start
    ok = [r for r in results if not r["error"]]
    ttfts = [r["ttft"] for r in ok if r["ttft"] is not None]
    gaps = [g for r in ok for g in r["gaps"]]
    tokens = sum(r["tokens"] for r in ok)
    return {"concurrency": concurrency, "requests": len(results), "errors": len(results) - len(ok),
            "error_samples": [r["error"] for r in results if r["error"]][:3], "tokens": tokens,
            "wall_s": wall, "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "ttft_p50_s": pct(ttfts, 50), "ttft_p99_s": pct(ttfts, 99),
            "itl_p50_s": pct(gaps, 50), "itl_p99_s": pct(gaps, 99)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--path", default="/v1/completions")
    ap.add_argument("--concurrency", default="1,8,32", help="comma-separated levels")
    ap.add_argument("--requests", type=int, default=64, help="requests per level")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per level")
    ap.add_argument("--api-key")
    ap.add_argument("--model")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = []
    for c in [int(x) for x in args.concurrency.split(",")]:
        r = asyncio.run(run_level(args, c))
        out.append(r)
        if not args.json:
            print(f"c={c:3d} req={r['requests']:4d} err={r['errors']:3d} tok={r['tokens']:6d} "
                  f"wall={r['wall_s']:6.2f}s {r['tokens_per_s']:8.1f} tok/s  "
                  f"TTFT p50={r['ttft_p50_s'] * 1e3:7.1f}ms p99={r['ttft_p99_s'] * 1e3:7.1f}ms  "
                  f"ITL p50={r['itl_p50_s'] * 1e3:6.2f}ms p99={r['itl_p99_s'] * 1e3:6.2f}ms", flush=True)
            for e in r["error_samples"]:
                print("   error:", e)
    if args.json:
        print(json.dumps(out, indent=1))
    return 1 if any(r["errors"] for r in out) else 0


if __name__ == "__main__":
    sys.exit(main())
