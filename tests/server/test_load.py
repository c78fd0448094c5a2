"""A bounded load run with the project's own load generator (loadgen.py) at concurrency 1, 8 and 32:
no errors, every request gets its tokens, and the server's RSS stays flat after warm-up (the KV pool and
batch buffers are allocated once; a leak per request or per token would show up over ~100 requests)."""
import asyncio
import json
import os
import types

import pytest
from conftest import Server, asan_env

import loadgen


def level(url, concurrency, requests, max_tokens=64, time_limit=30.0):
    args = types.SimpleNamespace(url=url, path="/v1/completions", requests=requests, max_tokens=max_tokens,
                                 temperature=0.8, time_limit=time_limit, api_key=None, model=None)
    return asyncio.run(loadgen.run_level(args, concurrency))


def test_load_levels_rss_flat(capsys):
    s = Server("--parallel", "32", "--max-queue", "256", "--max-batch-tokens", "512", env=asan_env())
    try:
        level(s.url, 8, 16)  # warm-up: every slot and buffer touched once
        level(s.url, 32, 32)
        rss0 = s.rss_kib()
        rows = []
        for conc, n in ((1, 8), (8, 32), (32, 64)):
            r = level(s.url, conc, n)
            rows.append(r)
            assert r["errors"] == 0, r["error_samples"]
            assert r["requests"] == n, "time limit hit: the run was not bounded by count"
            assert r["tokens"] > 0 and r["ttft_p50_s"] == r["ttft_p50_s"]  # not NaN
        for _ in range(2):
            level(s.url, 32, 64)
        rss1 = s.rss_kib()
        m = s.metrics()
        assert m["ferry_running_sequences"] == 0 and m["ferry_queue_depth"] == 0
        with capsys.disabled():
            print()
            for r in rows:
                print(f"  loadgen c={r['concurrency']:2d} req={r['requests']:3d} tok={r['tokens']:5d} "
                      f"{r['tokens_per_s']:7.1f} tok/s TTFT p50={r['ttft_p50_s'] * 1e3:6.1f}ms "
                      f"p99={r['ttft_p99_s'] * 1e3:6.1f}ms ITL p50={r['itl_p50_s'] * 1e3:5.2f}ms "
                      f"p99={r['itl_p99_s'] * 1e3:5.2f}ms")
            print(f"  RSS after warm-up {rss0} KiB, after {8 + 32 + 64 + 128} more requests {rss1} KiB")
        out = os.environ.get("FERRY_BUILD")
        if out and os.path.isdir(out):
            with open(os.path.join(out, "server_load.json"), "w") as f:
                json.dump({"levels": rows, "rss_kib": [rss0, rss1]}, f, indent=1)
        assert rss1 - rss0 < 8 * 1024, f"RSS grew {rss1 - rss0} KiB after warm-up"
    finally:
        assert s.stop() == 0
