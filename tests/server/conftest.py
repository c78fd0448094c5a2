"""Fixtures for the server tests: a real `ferry serve` on 127.0.0.1 with stories260K on the CPU backend.

FERRY_BUILD (the meson build root) locates the binary, FERRY_TESTDATA the model and llama.cpp goldens.
run_pytest.py checks both before pytest starts, so a missing file is a skip with a message, never a pass.
"""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

BUILD = os.environ.get("FERRY_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
TESTDATA = os.environ.get("FERRY_TESTDATA", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "testdata"))
FERRY = os.path.join(BUILD, "server", "ferry")
MODEL = os.path.join(TESTDATA, "models", "stories260K.gguf")
GOLDENS = os.path.join(TESTDATA, "goldens")
MODEL_NAME = "stories260K.gguf"


def free_port():
    # Free on every address (a server may bind 0.0.0.0): a port held by a client connection's local end
    # (a flood test's thousand sockets) is not free for a listener there.
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


class Server:
    """One `ferry serve` process; stop() sends SIGTERM and returns the exit status."""

    def __init__(self, *args, env=None, key=None, model=MODEL):
        # The port can still be taken between free_port() and the server's bind (tests run in parallel, and
        # their clients' sockets take ports too): a start that fails on it is retried on another port.
        for attempt in range(5):
            try:
                self._start(args, env, key, model)
                return
            except RuntimeError as e:
                if "Address already in use" not in str(e) or attempt == 4:
                    raise

    def _start(self, args, env, key, model):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = f"/tmp/ferry-serve-test-{self.port}.log"
        self.log = open(self.log_path, "w")
        threads = [] if "--threads" in args else ["--threads", "1"]
        cmd = [FERRY, "serve", "--model", model, "--port", str(self.port)] + threads + list(args)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ferry serve exited {self.proc.returncode}: {self.read_log()}")
            try:
                hdrs = {"Authorization": "Bearer " + key} if key else {}
                with urllib.request.urlopen(urllib.request.Request(self.url + "/health", headers=hdrs), timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("ferry serve did not become healthy: " + self.read_log())

    def read_log(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def metrics(self, headers=None):
        req = urllib.request.Request(self.url + "/metrics", headers=headers or {})
        with urllib.request.urlopen(req, timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def asan_env():
    """Under AddressSanitizer, freed memory waits in a quarantine (256 MiB by default) before it is reused, so RSS
    climbs for a long while with no leak at all: the environment for a server whose RSS a test measures turns the
    quarantine off (leaks are LeakSanitizer's job in that build). None for other builds."""
    with open(FERRY, "rb") as f:
        if b"__asan_init" not in f.read():
            return None
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=0:thread_local_quarantine_size_kb=0"
    return env


@pytest.fixture(scope="session")
def server():
    # --threads 2: the engine's pool and the parallel sampling workers are both exercised
    s = Server("--parallel", "4", "--conn-timeout", "2", "--max-queue", "256", "--threads", "2")
    yield s
    rc = s.stop()
    assert rc == 0, s.read_log()


def recv_all(sock):
    """Reads sock until the server closes it (or its timeout, or a reset); returns the bytes."""
    data = b""
    try:
        while True:
            d = sock.recv(65536)
            if not d:
                break
            data += d
    except (socket.timeout, ConnectionResetError):
        pass
    return data


def post(url, body, headers=None, timeout=60):
    """POST JSON (or raw bytes); returns (status, headers, parsed body or raw text)."""
    data = body if isinstance(body, (bytes, bytearray)) else json.dumps(body).encode()
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    req = urllib.request.Request(url, data=data, headers=h, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            status, hdrs = r.status, r.headers
    except urllib.error.HTTPError as e:
        raw, status, hdrs = e.read(), e.code, e.headers
    try:
        return status, hdrs, json.loads(raw)
    except ValueError:
        return status, hdrs, raw.decode("utf-8", "replace")


def get(url, headers=None, method="GET"):
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            raw, status, hdrs = r.read(), r.status, r.headers
    except urllib.error.HTTPError as e:
        raw, status, hdrs = e.read(), e.code, e.headers
    try:
        return status, hdrs, json.loads(raw)
    except ValueError:
        return status, hdrs, raw.decode("utf-8", "replace")


def sse_events(url, body, headers=None, timeout=60):
    """Streams a request; returns the list of parsed `data:` payloads (the string "[DONE]" kept as is)."""
    data = json.dumps(body).encode()
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    req = urllib.request.Request(url, data=data, headers=h, method="POST")
    events = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        buf = b""
        for chunk in iter(lambda: r.read1(65536), b""):
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if ev.startswith(b":"):  # SSE comment (keep-alive ping)
                    continue
                assert ev.startswith(b"data: "), ev
                payload = ev[6:]
                events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return events


def assert_error(status, body, want_status, param=None):
    assert status == want_status, (status, body)
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    if param is not None:
        assert err["param"] == param, err


def gguf_copy_fields(r, w, edit=None, skip=()):
    """Copies the metadata of the GGUFReader r into the GGUFWriter w, except general.architecture and keys
    starting with one of skip; edit maps a key to a function of its value (a list for arrays)."""
    import gguf
    edit = edit or {}
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key.startswith(tuple(skip)):
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                vals = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            else:
                vals = [f.parts[i].tolist()[0] for i in f.data]
            w.add_key_value(key, edit.get(key, lambda v: v)(vals), vt, sub_type=sub)
        elif vt == gguf.GGUFValueType.STRING:
            w.add_key_value(key, edit.get(key, lambda v: v)(bytes(f.parts[-1]).decode("utf-8")), vt)
        else:
            w.add_key_value(key, edit.get(key, lambda v: v)(f.parts[-1].tolist()[0]), vt)
