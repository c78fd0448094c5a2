"""Sharing the engine between clients, against a real `ferry serve` (stories260K): a stream whose client stops
reading gives its slot to a waiting request and resumes where it was when read again, a client holding every slot
with embedding inputs gives one up to another client's chat, and a request that waits longer than --queue-timeout
for a slot is answered 503 + Retry-After. Clients speak from distinct 127.0.0.x addresses (one client each)."""
import http.client
import json
import socket
import threading
import time

from conftest import Server, assert_error

EOS_BANNED = {"2": -100}  # stories260K's end of text: outputs run to max_tokens


def call(src, port, path, body, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(src, 0))
    try:
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        return r.status, dict(r.getheaders()), json.loads(raw)
    finally:
        c.close()


def metric(s, name):
    return s.metrics().get(name, 0.0)


def read_stream_text(sock):
    """Reads a whole SSE completion stream from sock (head included); returns (text, finish_reason)."""
    sock.settimeout(60)
    data = b""
    while not data.endswith(b"0\r\n\r\n"):
        d = sock.recv(1 << 20)
        if not d:
            break
        data += d
    rest, body = data.split(b"\r\n\r\n", 1)[1], b""
    while True:  # undo the chunked framing
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        body, rest = body + rest[:size], rest[size + 2:]
    text, finish = "", None
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            ev = json.loads(line[6:])
            text += ev["choices"][0]["text"]
            finish = ev["choices"][0]["finish_reason"] or finish
    return text, finish


def test_a_stream_nobody_reads_gives_its_slot_and_resumes_where_it_was():
    s = Server("--parallel", "1", "--conn-timeout", "60")
    try:
        # logprobs make each event about 1 KB: the stream outgrows the socket buffers long before its end
        body = {"prompt": "Once upon a time", "max_tokens": 1500, "temperature": 0, "stream": True,
                "logit_bias": EOS_BANNED, "logprobs": 5}
        st, _, ref = call("127.0.0.4", s.port, "/v1/completions", dict(body, stream=False))
        assert st == 200
        want = ref["choices"][0]["text"]
        raw = json.dumps(body).encode()
        a = socket.socket()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        a.bind(("127.0.0.2", 0))
        a.connect(("127.0.0.1", s.port))
        a.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(raw), raw))
        time.sleep(1.5)  # it fills its buffers and pauses
        t0 = time.time()
        st, _, out = call("127.0.0.3", s.port, "/v1/completions", {"prompt": "Hi", "max_tokens": 4})
        assert st == 200 and time.time() - t0 < 2.0, (st, time.time() - t0)
        assert metric(s, "ferry_sequences_yielded_total") >= 1
        text, finish = read_stream_text(a)  # read now: it resumes, recomputed, and goes on to the end
        a.close()
        assert finish == "length"
        assert text == want
    finally:
        assert s.stop() == 0


def test_a_client_holding_every_slot_with_embeddings_gives_one_to_a_chat():
    s = Server("--parallel", "4", "--max-batch-tokens", "256")
    try:
        inputs = [[5 + (i * 7 + k) % 500 for k in range(1500)] for i in range(32)]
        done = {}

        def big():
            done["big"] = call("127.0.0.2", s.port, "/v1/embeddings", {"input": inputs}, timeout=300)
            done["big_t"] = time.time()

        t = threading.Thread(target=big)
        t.start()
        time.sleep(0.5)
        t0 = time.time()
        st, _, out = call("127.0.0.3", s.port, "/v1/completions", {"prompt": "Hi", "max_tokens": 4})
        chat_done = time.time()
        t.join()
        assert st == 200, out
        st_big, _, out_big = done["big"]
        assert st_big == 200 and len(out_big["data"]) == 32
        assert chat_done < done["big_t"], "the chat waited for the whole embedding batch"
        assert metric(s, "ferry_sequences_yielded_total") >= 1
        # the restarted input's embedding equals the same input's alone
        st, _, one = call("127.0.0.2", s.port, "/v1/embeddings", {"input": [inputs[31]]})
        a, b = one["data"][0]["embedding"], out_big["data"][31]["embedding"]
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4
    finally:
        assert s.stop() == 0


def test_queue_timeout_is_503_with_retry_after():
    s = Server("--parallel", "2", "--queue-timeout", "1", "--body-limit", "16MiB")
    try:
        # an embedding request far longer than the test: its connection is closed once the chat is answered
        raw = json.dumps({"input": [[5 + (i * 7 + k) % 500 for k in range(2000)] for i in range(400)]}).encode()
        big = socket.create_connection(("127.0.0.1", s.port), source_address=("127.0.0.2", 0))
        big.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw))
        deadline = time.time() + 30
        while time.time() < deadline and metric(s, "ferry_running_sequences") < 2:
            time.sleep(0.05)
        # the same client: within its share, nothing is taken from the big request for it
        t0 = time.time()
        st, hdrs, out = call("127.0.0.2", s.port, "/v1/completions", {"prompt": "Hi", "max_tokens": 4})
        waited = time.time() - t0
        assert_error(st, out, 503)
        assert hdrs.get("Retry-After") == "1" and "--queue-timeout" in out["error"]["message"], (hdrs, out)
        assert 0.9 < waited < 3.0, waited
        assert metric(s, "ferry_queue_timeouts_total") == 1
        # another client is served: the big request's client holds both slots, more than its share
        st, _, out = call("127.0.0.3", s.port, "/v1/completions", {"prompt": "Hi", "max_tokens": 4})
        assert st == 200, out
        big.close()
    finally:
        assert s.stop() == 0
