"""test_pull — `ferry pull REPO[:QUANT]`, `ferry list` and `--hf-repo` on serve and run, against a local HTTP server that mimics a Hugging Face
hub: the file list API (/api/models/REPO/tree/main with sizes and LFS SHA-256), downloads under
/REPO/resolve/main/FILE answered by a redirect to a storage path, range requests, a transfer that breaks
halfway, a wrong checksum, a private repository (401) and a missing one (404). The digests are Python's
hashlib's; the client is the real curl ferry runs."""
import hashlib
import http.server
import json
import os
import random
import shutil
import socket
import subprocess
import threading
import time
import urllib.request

import pytest

BUILD = os.environ.get("FERRY_BUILD", "build")
FERRY = os.path.join(BUILD, "server", "ferry")


class Hub(http.server.ThreadingHTTPServer):
    def __init__(self):
        super().__init__(("127.0.0.1", 0), HubHandler)
        self.repos = {}  # repo -> {path: bytes}
        self.bad_sha = set()  # paths whose advertised SHA-256 is wrong
        self.private = set()  # repos that want HF_TOKEN == "secret"
        self.break_once = set()  # paths whose first transfer stops halfway
        self.log = []  # (path, Range header)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


class HubHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def send(self, code, body=b"", ctype="application/json", headers=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        hub = self.server
        hub.log.append((self.path, self.headers.get("Range")))
        path = self.path.split("?")[0]
        if path.startswith("/api/models/"):
            repo = path[len("/api/models/"):].rsplit("/tree/main", 1)[0]
            if repo not in hub.repos:
                return self.send(404, b'{"error":"Repository not found"}')
            if repo in hub.private and self.headers.get("Authorization") != "Bearer secret":
                return self.send(401, b'{"error":"Invalid credentials"}')
            tree = [{"type": "directory", "path": "docs"}]
            for p, data in hub.repos[repo].items():
                sha = hashlib.sha256(data).hexdigest()
                if p in hub.bad_sha:
                    sha = hashlib.sha256(data + b"x").hexdigest()
                tree.append({"type": "file", "path": p, "size": len(data), "oid": "0" * 40,
                             "lfs": {"oid": sha, "size": len(data), "pointerSize": 134}})
            tree.append({"type": "file", "path": "README.md", "size": 5, "oid": "1" * 40})
            return self.send(200, json.dumps(tree).encode())
        if path.startswith("/storage/"):
            repo, file = path[len("/storage/"):].split("/resolve/main/", 1)
            data = hub.repos.get(repo, {}).get(file)
            if data is None:
                return self.send(404, b"not found")
            start = 0
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                start = int(rng[6:].split("-")[0])
                if start >= len(data):
                    return self.send(416, b"", "application/octet-stream")
            body = data[start:]
            self.send_response(206 if start else 200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if file in hub.break_once:
                hub.break_once.discard(file)
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.connection.shutdown(2)  # the connection drops halfway
                return
            self.wfile.write(body)
            return
        if "/resolve/main/" in path:  # the hub redirects to its storage
            return self.send(302, b"", headers=[("Location", "/storage" + path)])
        self.send(404, b"{}")


@pytest.fixture
def hub(tmp_path):
    if not shutil.which("curl") or not shutil.which("sha256sum"):
        pytest.skip("curl or sha256sum missing")
    h = Hub()
    yield h
    h.shutdown()


def pull(tmp_path, hub, spec, token=None):
    env = dict(os.environ, HF_ENDPOINT=hub.url, FERRY_CACHE=str(tmp_path / "cache"))
    env.pop("HF_TOKEN", None)
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([FERRY, "pull", spec], capture_output=True, text=True, timeout=120, env=env)


def blob(n, seed):
    return random.Random(seed).randbytes(n)


def test_pull_picks_the_quant_and_verifies(tmp_path, hub):
    q4, q8 = blob(300_000, 1), blob(500_000, 2)
    hub.repos["acme/Tiny-GGUF"] = {"Tiny-Q4_K_M.gguf": q4, "Tiny-Q8_0.gguf": q8, "other.bin": b"x"}
    r = pull(tmp_path, hub, "acme/Tiny-GGUF")  # default Q4_K_M
    assert r.returncode == 0, r.stderr
    path = r.stdout.strip()
    assert path == str(tmp_path / "cache" / "acme--Tiny-GGUF" / "Tiny-Q4_K_M.gguf")
    assert open(path, "rb").read() == q4 and "SHA-256 match" in r.stderr
    r = pull(tmp_path, hub, "acme/Tiny-GGUF:q8_0")  # any case
    assert r.returncode == 0 and open(r.stdout.strip(), "rb").read() == q8, r.stderr
    n = len(hub.log)
    r = pull(tmp_path, hub, "acme/Tiny-GGUF:Q8_0")  # cached: no download
    assert r.returncode == 0 and "in the cache" in r.stderr
    assert not any("/storage/" in p for p, _ in hub.log[n:])
    env = dict(os.environ, FERRY_CACHE=str(tmp_path / "cache"))
    out = subprocess.run([FERRY, "list"], capture_output=True, text=True, env=env, timeout=30).stdout
    assert "acme/Tiny-GGUF  Tiny-Q4_K_M.gguf" in out and "acme/Tiny-GGUF  Tiny-Q8_0.gguf" in out


def test_pull_resumes_a_broken_transfer(tmp_path, hub):
    data = blob(2_000_000, 3)
    hub.repos["acme/Big-GGUF"] = {"Big-Q4_K_M.gguf": data}
    hub.break_once.add("Big-Q4_K_M.gguf")
    r = pull(tmp_path, hub, "acme/Big-GGUF")
    assert r.returncode == 0, r.stderr
    assert open(r.stdout.strip(), "rb").read() == data
    ranges = [rng for p, rng in hub.log if p.startswith("/storage/")]
    assert len(ranges) == 2 and ranges[0] in (None, "bytes=0-") and ranges[1].startswith("bytes=")
    assert int(ranges[1][6:].rstrip("-")) >= 1  # continued where the first transfer stopped
    assert "resuming" in r.stderr


def test_pull_split_files(tmp_path, hub):
    parts = {f"big/Model-Q4_K_M-0000{i}-of-00003.gguf": blob(100_000 + i, i) for i in (1, 2, 3)}
    hub.repos["acme/Split-GGUF"] = dict(parts, **{"Model-Q8_0.gguf": blob(10, 9)})
    r = pull(tmp_path, hub, "acme/Split-GGUF:Q4_K_M")
    assert r.returncode == 0, r.stderr
    d = tmp_path / "cache" / "acme--Split-GGUF"
    for p, data in parts.items():
        assert (d / os.path.basename(p)).read_bytes() == data
    assert r.stdout.strip().endswith("Model-Q4_K_M-00001-of-00003.gguf")


def test_pull_refuses_a_bad_checksum(tmp_path, hub):
    hub.repos["acme/Bad-GGUF"] = {"Bad-Q4_K_M.gguf": blob(50_000, 4)}
    hub.bad_sha.add("Bad-Q4_K_M.gguf")
    r = pull(tmp_path, hub, "acme/Bad-GGUF")
    assert r.returncode == 1 and "SHA-256" in r.stderr
    d = tmp_path / "cache" / "acme--Bad-GGUF"
    assert not (d / "Bad-Q4_K_M.gguf").exists() and not (d / "Bad-Q4_K_M.gguf.part").exists()


def test_pull_errors_404_401_and_no_match(tmp_path, hub):
    hub.repos["acme/Private-GGUF"] = {"P-Q4_K_M.gguf": blob(1000, 5)}
    hub.private.add("acme/Private-GGUF")
    r = pull(tmp_path, hub, "acme/Nope-GGUF")
    assert r.returncode == 1 and "404" in r.stderr
    r = pull(tmp_path, hub, "acme/Private-GGUF")
    assert r.returncode == 1 and "401" in r.stderr and "HF_TOKEN" in r.stderr
    r = pull(tmp_path, hub, "acme/Private-GGUF", token="secret")
    assert r.returncode == 0, r.stderr
    r = pull(tmp_path, hub, "acme/Private-GGUF:Q6_K", token="secret")
    assert r.returncode == 1 and "no .gguf file" in r.stderr and "P-Q4_K_M.gguf" in r.stderr
    for bad in ("noslash", "a/b/c", "../x/y", "a/b:"):
        r = pull(tmp_path, hub, bad)
        assert r.returncode == 2, (bad, r.stderr)


STORIES = os.path.join(os.environ.get("FERRY_TESTDATA", "../shared/testdata"), "models", "stories260K.gguf")


def test_serve_and_run_take_a_model_from_the_hub(tmp_path, hub):
    if not os.path.exists(STORIES):
        pytest.skip(f"missing {STORIES} (../shared/testdata)")
    model = open(STORIES, "rb").read()
    hub.repos["acme/Stories-GGUF"] = {"stories260K-F32.gguf": model, "stories260K-Q8_0.gguf": b"x" * 10}
    env = dict(os.environ, HF_ENDPOINT=hub.url, FERRY_CACHE=str(tmp_path / "cache"))
    args = ["--prompt-tokens", "1,403,407", "--temperature", "0", "--max-tokens", "8", "--json", "--backend", "cpu"]
    r = subprocess.run([FERRY, "run", "--hf-repo", "acme/Stories-GGUF:F32", *args], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    want = subprocess.run([FERRY, "run", "-m", STORIES, *args], capture_output=True, text=True, timeout=120)
    assert json.loads(r.stdout)["tokens"] == json.loads(want.stdout)["tokens"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([FERRY, "serve", "--hf-repo", "acme/Stories-GGUF:F32", "--port", str(port), "--threads", "1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.time() + 30
        while True:
            assert p.poll() is None and time.time() < deadline, p.stderr.read() if p.poll() is not None else "timeout"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/stories260K-F32", timeout=1) as m:
                    assert json.loads(m.read())["id"] == "stories260K-F32.gguf"
                    break
            except OSError:
                time.sleep(0.1)
    finally:
        p.terminate()
        assert p.wait(timeout=30) == 0
    r = subprocess.run([FERRY, "serve", "--hf-repo", "acme/Stories-GGUF:F32", "-m", STORIES], capture_output=True,
                       text=True, env={k: v for k, v in env.items() if k != "FERRY_MODEL"}, timeout=30)
    assert r.returncode == 1 and "not both" in r.stderr
