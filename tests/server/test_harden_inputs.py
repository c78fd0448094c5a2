"""Hostile and lenient input a real `ferry serve` must refuse, and the operator-facing defects around it: a NUL in a
header value, chunk lines that hold a connection, parsing that let malformed fields through, API-key files with a
byte-order mark or a NUL, the fuzz runner's verdict without test data, /status across tenants and the second
SIGTERM's log. Each test here failed before its fix.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest
from conftest import FERRY, Server, assert_error, get, post, recv_all

KEY = "k-harden"
AUTH = {"Authorization": "Bearer " + KEY}
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


@pytest.fixture(scope="module")
def keyed():
    s = Server("--api-key", KEY, "--api-key", "k-other", "--conn-timeout", "20", key=KEY)
    yield s
    assert s.stop() == 0, s.read_log()


def exchange(port, raw, timeout=10.0):
    """Sends raw bytes, returns (seconds until the server closed or answered whole, bytes received)."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(timeout)
    t0 = time.time()
    s.sendall(raw)
    data = recv_all(s)
    s.close()
    return time.time() - t0, data


def status_of(data):
    m = re.match(rb"HTTP/1\.1 (\d{3}) ", data)
    return int(m.group(1)) if m else None


def json_body(data):
    head, _, body = data.partition(b"\r\n\r\n")
    return json.loads(body)


def alive(s):
    st, _, out = post(s.url + "/v1/completions", {"prompt": "hi", "max_tokens": 1}, AUTH)
    assert st == 200, out


# ---- HTTP ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [b"Bearer " + KEY.encode() + b"\x00junk", b"Bearer " + KEY.encode() + b"\x00",
                                   b"Bearer \x00" + KEY.encode()])
@pytest.mark.parametrize("last", [False, True])
def test_nul_in_a_header_value_is_refused(keyed, value, last):
    """libmicrohttpd cut the value at the NUL: `Bearer KEY\\0junk` authenticated as KEY."""
    fields = [b"Host: localhost", b"Connection: close"]
    auth = b"Authorization: " + value
    fields = fields + [auth] if last else [auth] + fields
    raw = b"GET /v1/models HTTP/1.1\r\n" + b"\r\n".join(fields) + b"\r\n\r\n"
    _, data = exchange(keyed.port, raw)
    assert status_of(data) == 400, data[:300]
    assert "NUL" in json_body(data)["error"]["message"]
    # the same request without the NUL is served
    _, data = exchange(keyed.port, raw.replace(b"\x00junk", b"").replace(b"\x00", b""))
    assert status_of(data) == 200, data[:300]


CHUNKED = (b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer " + KEY.encode() +
           b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")


def test_chunk_extension_longer_than_the_buffer_is_answered_at_once(keyed):
    """A 100 KB chunk extension held the connection (and the whole event loop) 31 s, then closed it unanswered."""
    t, data = exchange(keyed.port, CHUNKED + b"1;" + b"e" * 100000 + b"\r\nx\r\n0\r\n\r\n", timeout=15)
    assert status_of(data) == 400 and t < 5, (t, data[:300])
    assert "chunk line" in json_body(data)["error"]["message"]
    alive(keyed)


@pytest.mark.parametrize("size", [b"ffffffffffffffff", b"ffffffffffffffff;a=b", b"100001", b"0000000000000100001"])
def test_chunk_declared_larger_than_the_limit_is_answered_at_once(keyed, size):
    """A chunk size of 2^64-1 with a few bytes of data got 408 only after the 30 s idle timeout."""
    t, data = exchange(keyed.port, CHUNKED + size + b"\r\nabc", timeout=15)
    assert status_of(data) == 413 and t < 2, (t, data[:300])
    assert "--body-limit" in json_body(data)["error"]["message"]
    alive(keyed)


def test_chunked_body_in_many_pieces_still_served(keyed):
    body = json.dumps({"prompt": "hi", "max_tokens": 1}).encode()
    chunks = b"".join(b"%x;n=v\r\n%s\r\n" % (len(body[i:i + 5]), body[i:i + 5]) for i in range(0, len(body), 5))
    s = socket.create_connection(("127.0.0.1", keyed.port))
    s.settimeout(10)
    s.sendall(CHUNKED.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
    for i in range(0, len(chunks), 9):  # one piece at a time: the shadow of the chunk framing follows along
        s.sendall(chunks[i:i + 9])
        time.sleep(0.002)
    s.sendall(b"0\r\n\r\n")
    data = recv_all(s)
    s.close()
    assert status_of(data) == 200, data[:300]


# ---- lenient parsing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path,body,param,words", [
    ("/v1/completions", {"prompt": [[1], "a"], "max_tokens": 1}, "prompt", "mixes"),
    ("/v1/completions", {"prompt": ["a", [1]], "max_tokens": 1}, "prompt", "mixes"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 1, "logit_bias": {" 5": 1}}, "logit_bias", "' 5'"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 1, "logit_bias": {"+5": 1}}, "logit_bias", "'+5'"),
    ("/v1/responses", {"input": [{"role": "user"}], "max_output_tokens": 1}, "input", "content"),
    ("/v1/responses", {"input": [{"role": "user", "content": 5}], "max_output_tokens": 1}, "input", "content"),
    ("/v1/responses", {"input": [{"role": "hacker", "content": "x"}], "max_output_tokens": 1}, "input", "hacker"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "string", "pattern": "a**"}}}},
     "response_format", "nothing to repeat"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "string", "pattern": "a+{2}"}}}},
     "response_format", "nothing to repeat"),
])
def test_lenient_fields_are_refused(keyed, path, body, param, words):
    st, _, out = post(keyed.url + path, body, AUTH)
    assert_error(st, out, 400, param)
    assert words in out["error"]["message"], out


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": [[1, 2], [3]], "max_tokens": 1}),
    ("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 1, "logit_bias": {"5": 1, "0": -1}}),
    ("/v1/responses", {"input": [{"role": "developer", "content": "be brief"},
                                 {"role": "user", "content": [{"type": "input_text", "text": "x"}]}],
                       "max_output_tokens": 1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "string", "pattern": "^a*?b+c{0,2}$"}}}}),
])
def test_the_valid_forms_still_pass(keyed, path, body):
    st, _, out = post(keyed.url + path, body, AUTH)
    assert st == 200, out


# ---- API keys ---------------------------------------------------------------------------------------------


def test_key_file_with_a_byte_order_mark(tmp_path):
    """The BOM became part of the first key, which then never matched (and nothing said so)."""
    keyfile = tmp_path / "keys"
    keyfile.write_bytes(b"\xef\xbb\xbfsekrit\r\nsecond\n")
    s = Server("--api-key-file", str(keyfile), key="sekrit")
    try:
        for k in ("sekrit", "second"):
            st, _, out = post(s.url + "/v1/completions", {"prompt": "hi", "max_tokens": 1}, {"Authorization": "Bearer " + k})
            assert st == 200, out
    finally:
        assert s.stop() == 0
    with open(s.log_path) as f:
        assert "byte-order mark" in f.read()


@pytest.mark.parametrize("content", [b"sek\x00rit\n", b"ok\nsek\x00\n", b"\x00\n"])
def test_key_file_with_a_nul_refuses_to_start_and_says_why(tmp_path, content):
    """A NUL in a key line was reported as a line "longer than 1022 bytes"."""
    keyfile = tmp_path / "keys"
    keyfile.write_bytes(content)
    with pytest.raises(RuntimeError, match="holds a NUL byte") as e:
        Server("--api-key-file", str(keyfile))
    assert "longer than" not in str(e.value)


def test_help_says_how_to_keep_keys_out_of_the_process_list():
    out = subprocess.run([FERRY, "serve", "--help"], capture_output=True, text=True, timeout=30)
    text = out.stdout + out.stderr
    block = text[text.index("--api-key "):]
    assert "process list" in block[:600] and "--api-key-file" in block[:600] and "FERRY_API_KEY" in block[:600], block[:600]


# ---- /status across tenants -------------------------------------------------------------------------------


def test_status_lists_only_the_callers_own_requests(keyed):
    """/status listed every in-flight request to any key holder: one tenant saw another's traffic."""
    other = {"Authorization": "Bearer k-other"}
    seen_own, seen_counts = [], []
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            post(keyed.url + "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 1500, "temperature": 1,
                                                 "logit_bias": {"2": -100}}, AUTH)

    workers = [threading.Thread(target=busy) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        deadline = time.time() + 20
        while time.time() < deadline and not (seen_own and seen_counts):
            st, _, mine = get(keyed.url + "/status", AUTH)
            assert st == 200, mine
            st, _, theirs = get(keyed.url + "/status", other)
            assert st == 200, theirs
            assert theirs["seqs"] == [], theirs["seqs"]  # never another tenant's
            if mine["seqs"]:
                seen_own.append(mine["seqs"][0])
            if theirs["sequences"]["running"] + theirs["sequences"]["queued"] > 0:
                seen_counts.append(theirs["sequences"])  # the counts still cover everyone
    finally:
        stop.set()
        for w in workers:
            w.join()
    assert seen_own and seen_counts, (seen_own, seen_counts)
    assert set(seen_own[0]) >= {"id", "state", "prompt_tokens"}


# ---- shutdown -------------------------------------------------------------------------------------------


def stream_nobody_reads(s):
    """A stream whose client reads nothing keeps its request in flight (a small window, and events of about 1 KB
    with their logprobs: the stream outgrows the socket buffers). Returns the client's socket."""
    c = socket.socket()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.connect(("127.0.0.1", s.port))
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 2000, "stream": True, "logit_bias": {"2": -100},
                       "logprobs": 5}).encode()
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    time.sleep(1.0)
    return c


def two_sigterms(s, c, read_after):
    """SIGTERM, a second one a second later; the client reads the rest when read_after. Returns (seconds from the
    first signal to the exit, the log)."""
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    s.proc.send_signal(signal.SIGTERM)
    if read_after:
        c.settimeout(10)
        recv_all(c)  # the client reads now: its request, cut, ends
    rc = s.proc.wait(20)
    took = time.time() - t0
    c.close()
    s.log.close()
    with open(s.log_path) as f:
        log = f.read()
    assert rc == 0, log
    return took, log


def test_second_sigterm_logs_the_real_drain_time():
    """After a second SIGTERM the log said "drained in 30.09s" where the server exited 2.7 s after the first."""
    s = Server("--shutdown-timeout", "30", "--conn-timeout", "60")
    took, log = two_sigterms(s, stream_nobody_reads(s), read_after=True)
    m = re.search(r"drained in ([0-9.]+)s", log)
    assert m, log
    assert abs(float(m.group(1)) - took) < 1.0 and took < 10, (m.group(0), took)


def test_second_sigterm_gives_up_soon_on_a_client_that_reads_nothing():
    s = Server("--shutdown-timeout", "30", "--conn-timeout", "60")
    took, log = two_sigterms(s, stream_nobody_reads(s), read_after=False)
    m = re.search(r"giving up on 1 request\(s\) ([0-9.]+)s after the first signal", log)
    assert m, log
    assert abs(float(m.group(1)) - took) < 1.0 and took < 4, (m.group(0), took)


# ---- the fuzz runner --------------------------------------------------------------------------------------


def test_fuzz_runner_says_skipped_without_test_data(tmp_path):
    """tests/fuzz/run.sh reported "ok" for targets that had loaded no test data and so exercised nothing."""
    if not shutil.which("clang"):
        pytest.skip("clang is not installed (tests/fuzz/run.sh needs it)")
    env = dict(os.environ, FERRY_TESTDATA=str(tmp_path / "none"), FUZZ_BUILD=str(tmp_path / "b"))
    env.pop("FERRY_FUZZ_VOCAB", None)
    out = subprocess.run(["bash", os.path.join(ROOT, "tests", "fuzz", "run.sh"), "1", "fuzz_tokenizer"],
                         capture_output=True, text=True, timeout=280, env=env, cwd=ROOT)
    text = out.stdout + out.stderr
    if out.returncode == 77 and "cannot build libFuzzer" in text:
        pytest.skip("clang's libFuzzer runtime is not installed")
    assert out.returncode == 77, text[-2000:]
    assert re.search(r"fuzz_tokenizer: SKIPPED.*nothing is exercised", text), text[-2000:]
    assert "fuzz_tokenizer: ok" not in text


# ---- limits the README states -----------------------------------------------------------------------------


def test_n_128_and_2048_embedding_inputs_with_the_default_pool():
    """With the defaults (--parallel 4, --max-queue 64) a request of more than 68 sequences got 400, while the README
    promises n up to 128 and embeddings up to 2,048 inputs."""
    s = Server()
    try:
        st, _, out = post(s.url + "/v1/completions", {"prompt": "hi", "max_tokens": 1, "n": 128, "seed": 1})
        assert st == 200, out
        assert sorted(c["index"] for c in out["choices"]) == list(range(128))
        st, _, out = post(s.url + "/v1/embeddings", {"input": ["hi", "there"] * 1024}, timeout=120)
        assert st == 200, out
        assert len(out["data"]) == 2048 and out["data"][0]["embedding"] == out["data"][2046]["embedding"]
        st, _, out = post(s.url + "/v1/completions", {"prompt": "hi", "max_tokens": 1, "n": 129})
        assert_error(st, out, 400, "n")
        assert "128" in out["error"]["message"]
    finally:
        assert s.stop() == 0
