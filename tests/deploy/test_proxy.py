"""nginx (Debian's, with deploy/nginx/ferry.conf) in front of two real `ferry serve` replicas on 127.0.0.1.

Checks: a streamed completion through the proxy arrives as separate SSE events while generation is still running
(arrival times of the first and last event), non-streamed results through the proxy equal direct ones, the API
key passes through (401 without, 200 with), X-Request-Id passes both ways, the body limit, /metrics kept off the
public side, both replicas serve requests (nginx's access log and each replica's counters), and SIGTERM drains
a replica (its in-flight stream completes, it exits 0) while nginx moves new requests to the other one.
A control run through the same site with proxy_buffering on shows that the timing check can fail.
"""
import http.client
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import threading
import time
import zlib

import pytest

from conftest import (DEPLOY, ferry_binary, free_port, nginx_cmd, nginx_test, self_signed_cert, test_model, tool,
                      write_nginx_conf)

KEY = "deploy-test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "Once upon a time"
STARTUP_S = 60
MODEL_NAME = "ferry-deploy-test"


# ---- HTTP helpers --------------------------------------------------------------------------------------------------

def connect(port, timeout, tls=False):
    if not tls:
        return http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    import ssl
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the test's self-signed certificate
    return http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=ctx)


def request(port, method, path, body=None, headers=None, timeout=60, tls=False):
    """Returns (status, headers dict lower-cased, body bytes)."""
    conn = connect(port, timeout, tls)
    h = dict(headers or {})
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
    try:
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def stream(port, body, headers=None, timeout=120, tls=False):
    """POSTs a streamed completion as a browser or the openai client would (Accept-Encoding: gzip); returns
    (status, headers, events) with events = [(t_arrival, data_str)], times in seconds from the moment the request
    was sent, each taken when the bytes completing the event's line were read (and decompressed, if gzip)."""
    conn = connect(port, timeout, tls)
    h = {"Content-Type": "application/json", "Accept-Encoding": "gzip", **AUTH, **(headers or {})}
    t0 = time.monotonic()
    conn.request("POST", "/v1/completions", body=json.dumps(body).encode(), headers=h)
    r = conn.getresponse()
    hdrs = {k.lower(): v for k, v in r.getheaders()}
    gz = zlib.decompressobj(16 + zlib.MAX_WBITS) if hdrs.get("content-encoding") == "gzip" else None
    events, pending = [], b""
    if r.status == 200:
        while True:
            chunk = r.read1(65536)
            if not chunk:
                break
            pending += gz.decompress(chunk) if gz else chunk
            now = time.monotonic() - t0
            *lines, pending = pending.split(b"\n")
            for line in lines:
                line = line.decode().rstrip("\r")
                if line.startswith("data:"):
                    events.append((now, line[5:].strip()))
    conn.close()
    return r.status, hdrs, events


def completion_body(max_tokens, stream_=False, prompt=PROMPT):
    return {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream_}


def metrics(port):
    st, _, b = request(port, "GET", "/metrics", headers=AUTH)
    assert st == 200, b[:200]
    out = {}
    for line in b.decode().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, val = line.rpartition(" ")
        base = name.split("{", 1)[0]
        try:
            out[base] = out.get(base, 0.0) + float(val)
        except ValueError:
            pass
    return out


# ---- the deployment under test -------------------------------------------------------------------------------------

NOBODY = 65534
PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1


def _set_mdwe():
    """In the child before exec: refuse W+X memory, as MemoryDenyWriteExecute=yes does (inherited across exec)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0)


def sandbox_prefix(exe, model):
    """(argv prefix, notes): what of deploy/ferry.service's sandbox can be had here without systemd --
    no new privileges, an empty capability bounding set, and, when root, an unprivileged uid (DynamicUser)."""
    sp = tool("setpriv")
    if not sp:
        return [], ["setpriv missing: replica b runs unsandboxed"]
    pre = [sp, "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all"]
    notes = []
    if os.geteuid() == 0:
        user = ["--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups"]
        ok = subprocess.run(pre + user + ["sh", "-c", f'test -x "{exe}" && test -r "{model}"'], timeout=10)
        if ok.returncode == 0:
            pre += user
        else:
            notes.append(f"uid {NOBODY} cannot read {exe} or {model}: replica b keeps uid 0")
    return pre, notes


class Replica:
    def __init__(self, exe, model, port, logdir, name, sandbox=False):
        self.port, self.name, self.notes = port, name, []
        self.log = pathlib.Path(logdir) / f"ferry-{name}.log"
        env = dict(os.environ, FERRY_MODEL=str(model), FERRY_HOST="127.0.0.1", FERRY_PORT=str(port),
                   FERRY_API_KEY=KEY, FERRY_SERVED_MODEL_NAME=MODEL_NAME, FERRY_PUBLIC_HEALTH="1", FERRY_THREADS="1",
                   FERRY_LOG_LEVEL="info")
        pre, preexec = [], None
        if sandbox:
            pre, self.notes = sandbox_prefix(exe, model)
            preexec = _set_mdwe
        self.proc = subprocess.Popen(pre + [str(exe), "serve"], env=env, stdout=self.log.open("wb"),
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=preexec)

    def log_tail(self, n=3000):
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def healthy(self):
        try:
            return request(self.port, "GET", "/health", timeout=2)[0] == 200
        except OSError:
            return False

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class Nginx:
    def __init__(self, tmp, upstream_ports, site_text=None, tls=False):
        self.tmp = pathlib.Path(tmp)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.tls_port = None
        tls_arg = None
        if tls:
            self.tls_port = free_port()
            tls_arg = (self.tls_port, *self_signed_cert(self.tmp))
        self.conf = write_nginx_conf(self.tmp, self.port, upstream_ports, site_text, tls_arg)
        rc, out = nginx_test(self.tmp, self.conf)
        assert rc == 0, out
        self.proc = subprocess.Popen(nginx_cmd(self.tmp, self.conf, "-g", "daemon off;"),
                                     stdout=subprocess.DEVNULL, stderr=(self.tmp / "stderr.log").open("wb"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if request(self.port, "GET", "/nginx-health", timeout=1)[0] == 200:
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("nginx did not start: " + (self.tmp / "error.log").read_text()[-2000:])

    def access_log(self):
        p = self.tmp / "access.log"
        return p.read_text() if p.exists() else ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _missing(why):
    """Skips, or fails when FERRY_DEPLOY_REQUIRE_SERVER=1 (for a CI that must run these tests)."""
    if os.environ.get("FERRY_DEPLOY_REQUIRE_SERVER") == "1":
        pytest.fail(why + " (FERRY_DEPLOY_REQUIRE_SERVER=1)")
    pytest.skip(why)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    if not tool("nginx"):
        _missing("nginx not installed (tests/deploy/run.sh installs nginx-light from Debian)")
    exe = ferry_binary()
    if exe is None:
        _missing("ferry binary not built (looked at $FERRY_BIN, $FERRY_BUILD/server/ferry, build/server/ferry, "
                 "build-deploy/server/ferry)")
    model, why = test_model()
    if model is None:
        _missing(why)
    h = subprocess.run([str(exe), "serve", "--help"], capture_output=True, text=True, timeout=20)
    if h.returncode != 0 or "--port" not in h.stdout + h.stderr:
        _missing(f"`{exe} serve` is not available in this build: {(h.stdout + h.stderr)[-300:]}")
    tmp = tmp_path_factory.mktemp("deploy")
    # Replica a runs plain, replica b in what can be had of the systemd unit's sandbox (see test_sandboxed_replica).
    reps = [Replica(exe, model, free_port(), tmp, "a"), Replica(exe, model, free_port(), tmp, "b", sandbox=True)]
    ngx = None
    try:
        deadline = time.monotonic() + STARTUP_S
        while not all(r.healthy() for r in reps):
            for r in reps:
                if r.proc.poll() is not None:
                    pytest.fail(f"ferry replica {r.name} exited ({r.proc.returncode}) before /health said 200:\n"
                                + r.log_tail())
            if time.monotonic() > deadline:
                pytest.fail(f"ferry replicas not healthy after {STARTUP_S} s:\n" + reps[0].log_tail())
            time.sleep(0.1)
        ngx = Nginx(tmp / "nginx", [r.port for r in reps])
        yield {"nginx": ngx, "replicas": reps, "tmp": tmp, "model": model}
    finally:
        if ngx:
            ngx.stop()
        for r in reps:
            r.stop()
        keep = os.environ.get("FERRY_DEPLOY_KEEP_LOGS")  # a folder to copy the replica and nginx logs into
        if keep:
            for f in list(tmp.glob("ferry-*.log")) + list(tmp.glob("nginx*/*.log")):
                shutil.copy(f, pathlib.Path(keep) / (f.parent.name + "-" + f.name if "nginx" in f.parent.name else f.name))


def long_stream_tokens(port):
    """max_tokens for a streamed request that takes a measurable time (>= ~0.3 s) on this machine."""
    n = 64
    while True:
        t0 = time.monotonic()
        st, _, b = request(port, "POST", "/v1/completions", completion_body(n), headers=AUTH, timeout=120)
        dt = time.monotonic() - t0
        assert st == 200, b[:300]
        got = json.loads(b)["usage"]["completion_tokens"]
        if dt >= 0.3 or got < n or n >= 1024:
            return n, got, dt
        n *= 2


# ---- tests ---------------------------------------------------------------------------------------------------------

def _assert_streamed_while_generating(events, label):
    data = [(t, d) for t, d in events if d != "[DONE]"]
    assert len(data) >= 8, f"{label}: only {len(data)} events"
    assert events[-1][1] == "[DONE]", f"{label}: stream did not end with [DONE]"
    t_first, t_last = data[0][0], data[-1][0]
    total = events[-1][0]
    # Through a buffering proxy every event arrives at the end: t_first ~ t_last. Streamed, the first event comes
    # after the first token while the last comes after the last one.
    assert t_last - t_first >= 0.4 * total, (
        f"{label}: first event at {t_first*1000:.1f} ms, last at {t_last*1000:.1f} ms of {total*1000:.1f} ms")
    reads = len({t for t, _ in data})  # events read from the socket together share one time
    assert reads >= 10, f"{label}: {len(data)} events arrived in {reads} reads"


def test_stream_through_proxy_arrives_while_generating(deployment):
    ngx, a = deployment["nginx"], deployment["replicas"][0]
    n, got, dt = long_stream_tokens(a.port)
    st, hdrs, events = stream(ngx.port, completion_body(n, True))
    assert st == 200
    assert hdrs.get("content-type", "").startswith("text/event-stream")
    _assert_streamed_while_generating(events, f"proxy, {n} tokens ({dt:.2f} s direct)")
    # The same text as the non-streamed completion (greedy).
    text = "".join(json.loads(d)["choices"][0].get("text", "") for _, d in events if d != "[DONE]")
    st, _, b = request(a.port, "POST", "/v1/completions", completion_body(n), headers=AUTH)
    assert text == json.loads(b)["choices"][0]["text"]


def test_buffered_proxy_control_is_caught(deployment):
    """Control: the same site with proxy_buffering on and without `gzip off` (the http block gzips SSE, as an
    operator's nginx.conf may). nginx then holds the compressed stream until the end, and the timing check above
    must say so. (Either directive alone still streams here: with buffering off nginx flushes gzip per chunk.)"""
    reps = deployment["replicas"]
    site = (DEPLOY / "nginx" / "ferry.conf").read_text()
    site = site.replace("proxy_buffering off;", "proxy_buffering on; proxy_ignore_headers X-Accel-Buffering;", 1)
    site = site.replace("gzip off;", "", 1)
    ctl = Nginx(deployment["tmp"] / "nginx-buffered", [r.port for r in reps], site)
    try:
        n, _, _ = long_stream_tokens(reps[0].port)
        st, hdrs, events = stream(ctl.port, completion_body(n, True))
        assert st == 200 and hdrs.get("content-encoding") == "gzip"
        with pytest.raises(AssertionError, match="first event at"):
            _assert_streamed_while_generating(events, "buffered control")
    finally:
        ctl.stop()


def test_tls_block_serves_and_streams(deployment):
    """The site's commented TLS block, uncommented with a test certificate: completions over HTTPS equal direct
    ones, and a streamed completion still arrives while it is generated."""
    if not shutil.which("openssl"):
        pytest.skip("openssl missing: no test certificate")
    reps = deployment["replicas"]
    ngx = Nginx(deployment["tmp"] / "nginx-tls", [r.port for r in reps], tls=True)
    try:
        body = completion_body(24)
        st, _, b = request(ngx.tls_port, "POST", "/v1/completions", body, headers=AUTH, tls=True)
        assert st == 200, b[:300]
        direct = json.loads(request(reps[0].port, "POST", "/v1/completions", body, headers=AUTH)[2])
        assert json.loads(b)["choices"][0]["text"] == direct["choices"][0]["text"]
        assert request(ngx.tls_port, "POST", "/v1/completions", body, tls=True)[0] == 401
        assert request(ngx.tls_port, "GET", "/metrics", tls=True)[0] == 404
        n, _, dt = long_stream_tokens(reps[0].port)
        st, _, events = stream(ngx.tls_port, completion_body(n, True), tls=True)
        assert st == 200
        _assert_streamed_while_generating(events, f"TLS proxy, {n} tokens ({dt:.2f} s direct)")
    finally:
        ngx.stop()


def test_nonstreamed_via_proxy_equals_direct(deployment):
    ngx, reps = deployment["nginx"], deployment["replicas"]
    for prompt in (PROMPT, "The little dog"):
        body = completion_body(24, prompt=prompt)
        direct = [json.loads(request(r.port, "POST", "/v1/completions", body, headers=AUTH)[2]) for r in reps]
        assert direct[0]["choices"][0]["text"] == direct[1]["choices"][0]["text"]
        for _ in range(2):  # lands on both replicas in turn
            st, _, b = request(ngx.port, "POST", "/v1/completions", body, headers=AUTH)
            assert st == 200, b[:300]
            via = json.loads(b)
            assert via["choices"][0]["text"] == direct[0]["choices"][0]["text"]
            assert via["choices"][0].get("finish_reason") == direct[0]["choices"][0].get("finish_reason")
            for k in ("prompt_tokens", "completion_tokens", "total_tokens"):  # cached_tokens: the replicas' caches
                assert via["usage"][k] == direct[0]["usage"][k]
    st1, _, m1 = request(ngx.port, "GET", "/v1/models", headers=AUTH)
    st2, _, m2 = request(reps[0].port, "GET", "/v1/models", headers=AUTH)
    assert st1 == st2 == 200 and json.loads(m1)["data"] == json.loads(m2)["data"]


def test_api_key_passes_through(deployment):
    ngx, a = deployment["nginx"], deployment["replicas"][0]
    body = completion_body(4)
    assert request(ngx.port, "POST", "/v1/completions", body)[0] == 401
    assert request(ngx.port, "POST", "/v1/completions", body, headers={"Authorization": "Bearer wrong"})[0] == 401
    assert request(ngx.port, "POST", "/v1/completions", body, headers=AUTH)[0] == 200
    # The 401 is ferry's own answer, passed through unchanged (nginx checks no keys).
    assert request(ngx.port, "GET", "/v1/models")[2] == request(a.port, "GET", "/v1/models")[2]
    # Health needs no key (FERRY_PUBLIC_HEALTH=1, as the unit, compose and k8s set it).
    assert request(ngx.port, "GET", "/health")[0] == 200


def test_request_id_passes_through(deployment):
    ngx = deployment["nginx"]
    st, h, _ = request(ngx.port, "POST", "/v1/completions", completion_body(2),
                       headers={**AUTH, "X-Request-Id": "deploy-rid-42"})
    assert st == 200 and h.get("x-request-id") == "deploy-rid-42"
    st, h, _ = request(ngx.port, "GET", "/health")
    assert re.fullmatch(r"[0-9a-f]{32}", h.get("x-request-id", "")), h
    time.sleep(0.2)
    assert re.search(r"rid=deploy-rid-42 upstream=127\.0\.0\.1:\d+", ngx.access_log())


def test_body_limit_and_metrics_kept_inside(deployment):
    ngx, a = deployment["nginx"], deployment["replicas"][0]
    big = json.dumps({"prompt": "x" * (2 << 20), "max_tokens": 1}).encode()
    st, _, _ = request(ngx.port, "POST", "/v1/completions", big, headers=AUTH)
    assert st == 413
    ok = json.dumps({"prompt": "hi", "max_tokens": 1, "pad": "x" * (512 << 10)}).encode()
    assert request(ngx.port, "POST", "/v1/completions", ok, headers=AUTH)[0] != 413
    assert request(ngx.port, "GET", "/metrics")[0] == 404
    assert request(a.port, "GET", "/metrics")[0] == 200


def test_both_replicas_serve(deployment):
    ngx, reps = deployment["nginx"], deployment["replicas"]
    before = [metrics(r.port).get("ferry_prompt_tokens_total", 0.0) for r in reps]
    log_start = len(ngx.access_log())
    results = []

    def one():
        results.append(request(ngx.port, "POST", "/v1/completions", completion_body(16), headers=AUTH)[0])

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [200] * 6
    time.sleep(0.2)
    served = re.findall(r'"POST /v1/completions HTTP/1.1" 200 .* upstream=127\.0\.0\.1:(\d+)', ngx.access_log()[log_start:])
    assert len(served) == 6
    assert {int(p) for p in served} == {r.port for r in reps}, served
    after = [metrics(r.port).get("ferry_prompt_tokens_total", 0.0) for r in reps]
    assert all(x > y for x, y in zip(after, before)), f"prompt tokens before {before}, after {after}"


def _unit_exec_start_post():
    """ExecStartPost= of deploy/ferry.service as argv, the way systemd reads it: continuation lines joined,
    quotes honoured, `$$` turned into `$`."""
    import shlex
    text = (DEPLOY / "ferry.service").read_text().replace("\\\n", " ")
    line = next(l for l in text.splitlines() if l.startswith("ExecStartPost="))
    return shlex.split(line.split("=", 1)[1].replace("$$", "$"))


def _healthcheck_cmd(stage="cpu"):
    text = (DEPLOY / "Dockerfile").read_text()
    part = text.split(f" AS {stage}\n", 1)[1]
    m = re.search(r"HEALTHCHECK [^\n]*\\\n\s*CMD (\[.*?\])\n", part)
    return json.loads(m.group(1))


def test_readiness_and_health_commands_run(deployment):
    """The systemd unit's readiness poll and the image's HEALTHCHECK, run as they are written, against a ready
    replica (they succeed) and a port where nothing listens (the poll keeps waiting, the check fails)."""
    a = deployment["replicas"][0]
    dead = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    poll = _unit_exec_start_post()
    for host in ("127.0.0.1", "0.0.0.0"):
        r = subprocess.run(poll, env=dict(base, FERRY_HOST=host, FERRY_PORT=str(a.port)), timeout=20)
        assert r.returncode == 0
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(poll, env=dict(base, FERRY_PORT=str(dead)), timeout=3, capture_output=True)
    hc = _healthcheck_cmd()
    assert subprocess.run(hc, env=dict(base, FERRY_PORT=str(a.port)), timeout=10).returncode == 0
    assert subprocess.run(hc, env=dict(base, FERRY_PORT=str(dead)), timeout=10, capture_output=True).returncode == 1


def test_sandboxed_replica(deployment):
    """Replica b (which every test above also used) runs as deploy/ferry.service would confine it, as far as that
    works without systemd: NoNewPrivileges, CapabilityBoundingSet= (empty), MemoryDenyWriteExecute (the kernel's
    PR_SET_MDWE), and an unprivileged uid like DynamicUser's."""
    b = deployment["replicas"][1]
    status = pathlib.Path(f"/proc/{b.proc.pid}/status").read_text()
    field = dict(l.split(":", 1) for l in status.splitlines() if ":" in l)
    assert field["Name"].strip() == "ferry", "setpriv execs ferry in place"
    if not tool("setpriv"):
        pytest.skip("setpriv missing: replica b ran unsandboxed")
    assert field["NoNewPrivs"].strip() == "1"
    assert int(field["CapBnd"], 16) == 0 and int(field["CapEff"], 16) == 0
    if os.geteuid() == 0 and not b.notes:
        assert field["Uid"].split()[0] == str(NOBODY)
    assert b.healthy()
    st, _, body = request(b.port, "POST", "/v1/completions", completion_body(8), headers=AUTH)
    assert st == 200, body[:300]
    if b.notes:
        pytest.skip("; ".join(b.notes))


def test_zz_sigterm_drains_replica_and_proxy_fails_over(deployment):
    """Runs last (it stops replica b): an in-flight stream on b completes after SIGTERM, b exits 0, and requests
    through nginx keep succeeding on a."""
    ngx, (a, b) = deployment["nginx"], deployment["replicas"]
    n, got, dt = long_stream_tokens(b.port)
    out = {}

    def run_stream():
        out["t0"] = time.monotonic()
        out["r"] = stream(b.port, completion_body(n, True))

    t = threading.Thread(target=run_stream)
    t.start()
    time.sleep(min(0.1, dt / 4))
    t_term = time.monotonic()
    b.proc.send_signal(signal.SIGTERM)
    t.join(60)
    st, _, events = out["r"]
    assert st == 200 and events and events[-1][1] == "[DONE]", f"stream cut by SIGTERM: {events[-3:]}"
    assert out["t0"] + events[-1][0] > t_term, "the stream ended before SIGTERM: nothing was drained"
    assert b.proc.wait(30) == 0, b.log_tail()
    for _ in range(4):
        st, _, body = request(ngx.port, "POST", "/v1/completions", completion_body(4), headers=AUTH)
        assert st == 200, body[:300]
