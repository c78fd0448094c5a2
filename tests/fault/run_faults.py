#!/usr/bin/env python3
"""run_faults — fault injection, sqlite style: ferry_fault (tests/fault/fault.c) is started once per failure, fails
one allocation, file operation or CUDA call, and must end it cleanly.

A clean run first records the answers and every call site of the class. Then, for every site (default) or every
call number N up to the total (--every), one run: `ferry_fault serve` on stories260K with the failure armed, the
scenario (a completion with n=2, logprobs, echo and a stop string; a streamed chat completion; /tokenize), the
first completion again, SIGTERM. Each run must end in one of:
  - a refused start: exit status 1 and an error line, when the failure hit the load;
  - each answer either equal to the clean run's or an OpenAI-style JSON error with status 500/503/504 (a stream:
    an error event, or cut short), after which the server answers the repeated request correctly;
and always: exit 0 on SIGTERM within 20 s (never a hang), no crash, and no sanitizer report (LeakSanitizer checks
for leaks at exit in the ASan build). Sites first reached by a run's error handling are failed in a further
round, so cleanup paths are covered too.

Usage: run_faults.py [--class alloc] [--class file] [--every] [--stride K] [--jobs 2] [--binary PATH]
                     [--model GGUF] [--serve-args "..."] [--requests cuda]
Exit status 0 when every run ended cleanly, 1 otherwise, 77 (skip) when the binary or the model is missing.
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("FERRY_BUILD", os.path.join(HERE, "..", "..", "build"))
TESTDATA = os.environ.get("FERRY_TESTDATA", os.path.join(HERE, "..", "..", "..", "shared", "testdata"))
SANITIZER = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer|ThreadSanitizer)|runtime error:|"
                       r"SUMMARY: (Address|Undefined|Leak)|Segmentation fault|stack-overflow")

SCENARIO = [
    ("POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "n": 2, "logprobs": 2, "echo": True,
                                 "stop": ["zz"], "temperature": 0, "seed": 1}),
    ("STREAM", "/v1/chat/completions", {"messages": [{"role": "system", "content": "Be brief."},
                                                     {"role": "user", "content": "Tell me a story."}],
                                        "max_tokens": 6, "temperature": 0, "stream": True,
                                        "stream_options": {"include_usage": True}}),
    ("POST", "/tokenize", {"content": "Once upon a time, in a land far away"}),
]


def normalize(obj):
    """An answer without the fields that differ between runs (ids, times, and what the prompt cache held)."""
    if isinstance(obj, dict):
        return {k: normalize(v) for k, v in obj.items() if k not in ("id", "created", "prompt_tokens_details")}
    if isinstance(obj, list):
        return [normalize(v) for v in obj]
    return obj


def call(port, kind, path, body, timeout=30):
    """One request. Returns (status, parsed body or stream summary, note)."""
    data = json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            if kind != "STREAM":
                return r.status, json.loads(r.read()), ""
            error, done = None, False
            buf = b""
            try:
                for chunk in iter(lambda: r.read1(65536), b""):
                    buf += chunk
            except Exception as e:  # noqa: BLE001 — a cut stream is an outcome, judged by the caller
                return 200, None, f"stream cut: {e!r}"
            # what a client makes of the stream (chunk boundaries depend on timing): text and finish per choice,
            # the role, the usage
            texts, finish, role, usage = {}, {}, {}, None
            for ev in buf.split(b"\n\n"):
                if not ev or ev.startswith(b":"):
                    continue
                payload = ev[len(b"data: "):]
                if payload == b"[DONE]":
                    done = True
                    continue
                j = json.loads(payload)
                if "error" in j:
                    error = j
                    continue
                usage = normalize(j.get("usage")) or usage
                for ch in j.get("choices", []):
                    i, d = ch["index"], ch.get("delta", {})
                    texts[i] = texts.get(i, "") + (d.get("content") or ch.get("text") or "")
                    role[i] = d.get("role", role.get(i))
                    if ch.get("finish_reason"):
                        finish[i] = ch["finish_reason"]
            if error:
                return 200, error, "stream error event"
            if not done:
                return 200, None, "stream cut before [DONE]"
            return 200, {"texts": texts, "finish": finish, "role": role, "usage": usage}, ""
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw), ""
        except ValueError:
            return e.code, raw.decode("utf-8", "replace"), "not JSON"
    except (ConnectionError, socket.timeout, urllib.error.URLError, TimeoutError, json.JSONDecodeError) as e:
        return 0, None, f"no answer: {e!r}"


def is_json_error(status, body):
    return (status in (500, 503, 504) and isinstance(body, dict) and set(body) == {"error"} and
            set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"])


class Run:
    """One ferry_fault process with one failure armed (or none)."""

    def __init__(self, args, env_extra):
        self.args = args
        self.port = None  # --port 0: the bound port is read from the log (no race between parallel runs)
        fd, self.report = tempfile.mkstemp(prefix="ferry-fault-", suffix=".txt")
        os.close(fd)
        env = dict(os.environ)
        env.update(env_extra)
        env["FERRY_FAULT_REPORT"] = self.report
        env.setdefault("ASAN_OPTIONS", "halt_on_error=1:abort_on_error=1:detect_leaks=1")
        env.setdefault("UBSAN_OPTIONS", "halt_on_error=1:abort_on_error=1:print_stacktrace=1")
        cmd = [args.binary, "serve", "--model", args.model, "--port", "0", "--threads", "1",
               "--parallel", "2", "--ctx-size", "256", "--shutdown-timeout", "5"] + args.serve_args.split()
        fd, self.log_path = tempfile.mkstemp(prefix="ferry-fault-", suffix=".log")
        self.proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, env=env)
        os.close(fd)  # the child has it; we read through our own descriptor (never moving the child's offset)

    def wait_ready(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return False
            if self.port is None:
                m = re.search(r"listening on http://[^ ]*:(\d+)[/ ]", self.output())
                if not m:
                    time.sleep(0.01)
                    continue
                self.port = int(m.group(1))
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return True
            except urllib.error.HTTPError:
                pass
            except OSError:
                pass
            time.sleep(0.02)
        return False

    def stop(self, timeout=20):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode

    def output(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def read_report(self):
        calls, sites, failed = 0, {}, []
        try:
            with open(self.report) as f:
                for line in f:
                    w = line.split()
                    if w[0] == "calls":
                        calls = int(w[1])
                    elif w[0] == "site":
                        sites[int(w[1], 16)] = (int(w[2]), int(w[3]))
                    elif w[0] == "failed":
                        failed.append((int(w[1]), int(w[2], 16)))
        except (OSError, IndexError, ValueError):
            pass
        os.unlink(self.report)
        return calls, sites, failed

    def cleanup(self):
        try:
            os.unlink(self.log_path)
        except OSError:
            pass


def clean_run(args, cls):
    r = Run(args, {"FERRY_FAULT_CLASS": cls})
    if not r.wait_ready():
        r.stop()
        sys.exit(f"the clean run did not start:\n{r.output()[-3000:]}")
    answers = []
    for kind, path, body in SCENARIO:
        st, out, note = call(r.port, kind, path, body)
        if st != 200 or note:
            r.stop()
            sys.exit(f"the clean run failed {path}: {st} {note} {out}")
        answers.append(normalize(out))
    rc = r.stop()
    out = r.output()
    r.cleanup()
    calls, sites, _ = r.read_report()
    if rc != 0 or SANITIZER.search(out):
        sys.exit(f"the clean run did not end cleanly (exit {rc}):\n{out[-3000:]}")
    return answers, calls, sites


def faulted_run(args, cls, answers, arm):
    """arm: {"FERRY_FAULT_N": ...} or {"FERRY_FAULT_SITE": ...}. Returns (ok, outcome, problems, sites seen)."""
    env = {"FERRY_FAULT_CLASS": cls}
    env.update(arm)
    r = Run(args, env)
    problems, outcome = [], []
    ready = r.wait_ready()
    if ready:
        for (kind, path, body), want in zip(SCENARIO, answers):
            st, out, note = call(r.port, kind, path, body)
            if st == 200 and not note and normalize(out) == want:
                outcome.append("same")
            elif is_json_error(st, out):
                outcome.append(str(st))
            elif kind == "STREAM" and st == 200 and (note == "stream error event" or note.startswith("stream cut")):
                # after the 200 head an error can only be an error event, or the connection cut short
                outcome.append("stream-" + ("error" if "event" in note else "cut"))
                if note == "stream error event" and not isinstance(out, dict):
                    problems.append(f"{path}: malformed stream error {out}")
            else:
                outcome.append(f"BAD {st}")
                problems.append(f"{path}: {st} {note} {str(out)[:300]}")
        # the server must have recovered: the first request again, answered as in the clean run (twice at most:
        # with --every, the failure may land in the first of them, which may then fail cleanly)
        kind, path, body = SCENARIO[0]
        for attempt in range(2):
            st, out, note = call(r.port, kind, path, body)
            if st == 200 and normalize(out) == answers[0]:
                break
            if attempt == 0 and is_json_error(st, out) or st == 0:
                continue
            if r.proc.poll() is None:
                problems.append(f"not recovered: {path} again gave {st} {note} {str(out)[:300]}")
            break
        else:
            if r.proc.poll() is None:
                problems.append(f"not recovered: {path} again gave {st} {note} {str(out)[:300]}")
    rc = r.stop()
    text = r.output()
    r.cleanup()
    calls, sites, failed = r.read_report()
    if not ready:
        if rc != 1:
            problems.append(f"start failed with exit {rc} (want 1)")
        elif not re.search(r"\berror\b|ferry serve: ", text):
            problems.append("start refused without an error message")
        outcome = ["refused start"]
    elif rc is None:
        problems.append("hang: no exit within 20 s of SIGTERM")
    elif rc != 0:
        problems.append(f"exit {rc} after SIGTERM")
    if SANITIZER.search(text):
        problems.append("sanitizer report")
    armed = [int(x, 16) for x in arm.get("FERRY_FAULT_SITE", "").split(",") if x]
    if not failed or (armed and armed[-1] not in {f[1] for f in failed}):
        outcome.append("(never reached)")
    if problems:
        problems.append("log tail:\n    " + "\n    ".join(text.splitlines()[-25:]))
    return not problems, " ".join(outcome), problems, sites, failed


def symbolize(binary, sites):
    """A site is (caller offset << 32) | call offset: "function file:line < caller file:line"."""
    pcs = sorted({s & 0xffffffff for s in sites} | {s >> 32 for s in sites if s >> 32})
    if not pcs:
        return {}
    try:
        out = subprocess.run(["addr2line", "-f", "-s", "-e", binary] + [hex(o) for o in pcs],
                             capture_output=True, text=True, timeout=60).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return {}
    name = {o: f"{out[2 * i]} {out[2 * i + 1]}" for i, o in enumerate(pcs) if 2 * i + 1 < len(out)}
    return {s: name.get(s & 0xffffffff, hex(s & 0xffffffff)) +
            (" < " + name.get(s >> 32, hex(s >> 32)) if s >> 32 else "") for s in sites}


def sweep(args, cls):
    answers, total, sites = clean_run(args, cls)
    print(f"== {cls}: the clean run made {total} calls from {len(sites)} sites", flush=True)
    if total == 0:
        print(f"   nothing to fail in class {cls}")
        return True, 0
    lock = threading.Lock()
    ok_all = True
    done_sites, results = set(), []

    def one(arm):
        ok, outcome, problems, seen, failed = faulted_run(args, cls, answers, arm)
        with lock:
            results.append((arm, ok, outcome, problems, failed))
            done_sites.update(f[1] for f in failed)
            for s in seen:  # reached only by this failure's handling: failed next round, after the same failure
                if s not in sites and s not in new_sites:
                    new_sites[s] = arm.get("FERRY_FAULT_SITE", "")
        return ok

    new_sites = {}
    tries = {}  # armed runs of each site (hex)
    if args.every:
        arms = [{"FERRY_FAULT_N": str(n)} for n in range(1, total + 1, args.stride)]
        with ThreadPoolExecutor(args.jobs) as ex:
            ok_all = all(list(ex.map(one, arms)))
    else:
        # round 1: the clean run's sites; then each site first seen in the handling of an earlier failure, armed
        # after that failure; a site a run did not reach (threads interleave differently) is tried again
        arms = [{"FERRY_FAULT_SITE": hex(s)} for s in sorted(sites)]
        for round_no in range(1, 6):
            arms = [a for a in arms if int(a["FERRY_FAULT_SITE"].split(",")[-1], 16) not in done_sites]
            if not arms:
                break
            print(f"   round {round_no}: {len(arms)} sites", flush=True)
            with ThreadPoolExecutor(args.jobs) as ex:
                ok_all &= all(list(ex.map(one, arms)))
            # not reached (under load a request's timing decides some paths): again, armed alone, twice at most
            retry = []
            for a in arms:
                site = a["FERRY_FAULT_SITE"].split(",")[-1]
                tries[site] = tries.get(site, 0) + 1
                if int(site, 16) not in done_sites and tries[site] <= 2:
                    retry.append({"FERRY_FAULT_SITE": site})
            new = {s: prev for s, prev in new_sites.items() if s not in done_sites}
            sites.update({s: (0, 0) for s in new})
            arms = retry + [{"FERRY_FAULT_SITE": (prev + "," if prev else "") + hex(s)} for s, prev in sorted(new.items())]
            new_sites.clear()
    names = symbolize(args.binary, sorted({f[1] for *_, fl in results for f in fl} | set(sites)))
    counts = {}
    for arm, ok, outcome, problems, failed in sorted(results, key=lambda r: r[4][-1] if r[4] else (0, 0)):
        counts[outcome] = counts.get(outcome, 0) + 1
        where = " after ".join(names.get(f[1], hex(f[1])) for f in reversed(failed)) if failed else "-"
        if not ok or args.verbose:
            print(f"   {'FAIL' if not ok else 'ok  '} {list(arm.values())[0]:>8} at {where}: {outcome}")
            for p in problems:
                print("        " + p)
    reached = {f[1] for *_, fl in results for f in fl}
    print(f"   {len(results)} runs, {len(reached)} sites failed; outcomes: " +
          ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))
    if not args.every:
        # a site is a call and its caller; every call must have failed at least once (from some caller), and the
        # call paths that timing alone decides whether a run reaches are listed
        calls_all = {s & 0xffffffff for s in sites}
        calls_failed = {s & 0xffffffff for s in reached}
        missed = [s for s in sites if s not in reached]
        print(f"   coverage: {len(calls_failed)}/{len(calls_all)} calls, {len(reached & set(sites))}/{len(sites)} "
              f"call paths")
        if missed:
            print(f"   call paths not reached again when armed: " + ", ".join(names.get(s, hex(s)) for s in missed[:20]))
        # a call none of whose paths an armed run reached, each armed three times, is one that only timing
        # reaches (a stream event under load): listed, not counted; any other call that never failed fails
        timing = {s & 0xffffffff for s in missed if tries.get(hex(s), 0) >= 3}
        untested = calls_all - calls_failed - {c for c in timing
                                               if all(s in missed for s in sites if s & 0xffffffff == c)}
        if calls_all - calls_failed - untested:
            print("   not failed, reached only by timing (armed three times): " +
                  ", ".join(names.get(s, hex(s)) for s in missed if s & 0xffffffff in calls_all - calls_failed - untested))
        if untested:
            ok_all = False
            print(f"   FAIL: {len(untested)} calls never failed: " +
                  ", ".join(names.get(s, hex(s)) for s in missed if s & 0xffffffff in untested))
    return ok_all, len(results)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--class", dest="classes", action="append", choices=["alloc", "file", "cuda"])
    ap.add_argument("--every", action="store_true", help="fail every call number N up to the total")
    ap.add_argument("--stride", type=int, default=1, help="with --every: every K-th N")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--binary", default=os.path.join(BUILD, "tests", "fault", "ferry_fault"))
    ap.add_argument("--model", default=os.path.join(TESTDATA, "models", "stories260K.gguf"))
    ap.add_argument("--serve-args", default="--backend cpu", help="extra `ferry serve` options")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    for path, what in ((args.binary, "binary"), (args.model, "model")):
        if not os.path.exists(path):
            print(f"SKIP missing FILE: {path} ({what})")
            sys.exit(77)
    ok = True
    t0 = time.time()
    for cls in args.classes or ["alloc"]:
        good, _ = sweep(args, cls)
        ok &= good
    print(f"== fault injection {'passed' if ok else 'FAILED'} in {time.time() - t0:.0f}s")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
