"""The web page at / in a real headless browser (Debian's chromium, driven over the DevTools protocol), directly
and behind the shipped nginx site (deploy/nginx/ferry.conf), with --api-key.

Checks: the page loads and asks for the key (the dashboard says so without it); with the key a chat turn
streams and its text equals the API's own greedy answer to the same conversation; the dashboard updates (its
poll counter grows, the generated-token count includes the turn). Screenshots are saved as artifacts under the
build dir (FERRY_BUILD/tests/web-*.png). Skips when chromium is missing (apt-get install chromium).
"""
import base64
import importlib.util
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request

import pytest
from conftest import Server, post

KEY = "web-test-key"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
ART = os.path.join(os.environ.get("FERRY_BUILD", tempfile.gettempdir()), "tests")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebSocket:
    """The smallest RFC 6455 client the DevTools protocol needs: text frames, client-side masking."""

    def __init__(self, url):
        assert url.startswith("ws://")
        hostport, path = url[5:].split("/", 1)
        host, port = hostport.split(":")
        self.s = socket.create_connection((host, int(port)), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.s.sendall((f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.s.recv(1)
        assert b" 101 " in head.split(b"\r\n")[0], head
        self.buf = b""

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.s.recv(65536)
            if not chunk:
                raise ConnectionError("devtools closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def send(self, text):
        data = text.encode()
        mask = os.urandom(4)
        n = len(data)
        head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n)
                                if n < 65536 else bytes([0x80 | 127]) + struct.pack(">Q", n))
        self.s.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def recv(self):
        msg = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(n)
            msg += payload
            if b0 & 0x80:
                return msg.decode()


class Browser:
    def __init__(self):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="ferry-chromium-")
        self.proc = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                      f"--remote-debugging-port={self.port}", f"--user-data-dir={self.dir}",
                                      "--window-size=1280,900", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while True:
            try:
                pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=2))
                page = next(p for p in pages if p["type"] == "page")
                break
            except (OSError, StopIteration):
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        self.ws = WebSocket(page["webSocketDebuggerUrl"])
        self.id = 0

    def cmd(self, method, **params):
        self.id += 1
        self.ws.send(json.dumps({"id": self.id, "method": method, "params": params}))
        while True:
            m = json.loads(self.ws.recv())
            if m.get("id") == self.id:
                assert "error" not in m, m
                return m.get("result", {})

    def js(self, expr):
        r = self.cmd("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in r, r
        return r["result"].get("value")

    def wait(self, expr, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = self.js(expr)
            if v:
                return v
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {expr}")

    def goto(self, url):
        self.cmd("Page.enable")
        self.cmd("Page.navigate", url=url)
        self.wait("document.readyState === 'complete' && !!document.getElementById('updated')")

    def screenshot(self, name):
        os.makedirs(ART, exist_ok=True)
        png = base64.b64decode(self.cmd("Page.captureScreenshot", format="png")["data"])
        with open(os.path.join(ART, name), "wb") as f:
            f.write(png)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000

    def close(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def keyed():
    s = Server("--parallel", "2", "--api-key", KEY, key=KEY)
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM:
        pytest.skip("missing: chromium (apt-get install chromium)")
    b = Browser()
    yield b
    b.close()


def chat_turn(b, base, shot):
    b.goto(base + "/")
    assert b.js("document.title") == "ferry"
    # no key yet: the page loads (it is public) and the dashboard says what is missing
    b.js("localStorage.removeItem('ferry_api_key'); document.getElementById('apikey').value = ''")
    b.wait("document.getElementById('updated').textContent.includes('API key needed')")
    b.js(f"const k = document.getElementById('apikey'); k.value = '{KEY}'; k.dispatchEvent(new Event('change'))")
    n0 = b.wait("+document.getElementById('updated').dataset.n > 0 && "
                "document.getElementById('model').textContent === 'stories260K.gguf' && "
                "+document.getElementById('updated').dataset.n")
    gen0 = int(b.js("JSON.parse(JSON.stringify(document.getElementById('generated').textContent)).split(' ')[0]") or 0)
    b.js("document.getElementById('max_tokens').value = 24; document.getElementById('temperature').value = 0;"
         "document.getElementById('input').value = 'Once upon a time';"
         "document.getElementById('send').click()")
    done = b.wait("(m => m && m.dataset.done)(document.querySelector('.msg.assistant:last-child'))")
    assert done == "1", b.js("document.querySelector('.msg.assistant:last-child').textContent")
    text = b.js("document.querySelector('.msg.assistant:last-child').textContent")
    # the dashboard moves on: more polls, and the turn's tokens counted
    b.wait(f"+document.getElementById('updated').dataset.n >= {n0 + 2} && "
           f"parseInt(document.getElementById('generated').textContent) >= {gen0 + 24}")
    assert b.js("document.getElementById('tps').textContent") not in ("", "–")
    assert b.js("document.getElementById('layers').textContent").endswith("of 5 layers")
    b.screenshot(shot)
    return text


def test_page_chat_and_dashboard(keyed, browser):
    text = chat_turn(browser, keyed.url, "web-page.png")
    st, _, want = post(keyed.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "Once upon a time"}],
                                                             "max_tokens": 24, "temperature": 0},
                       headers={"Authorization": "Bearer " + KEY})
    assert st == 200 and text == want["choices"][0]["message"]["content"], (text, want)
    # the page is public, its data is not
    st, _, _ = post(keyed.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    assert st == 401
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(keyed.url + "/status")
    assert e.value.code == 401


def test_page_behind_nginx(keyed, browser):
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    if not nginx:
        pytest.skip("missing: nginx (tests/deploy/run.sh installs nginx-light)")
    spec = importlib.util.spec_from_file_location(
        "deploy_conftest", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy", "conftest.py"))
    dc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dc)
    tmp = tempfile.mkdtemp(prefix="ferry-web-nginx-")
    port = free_port()
    conf = dc.write_nginx_conf(tmp, port, [keyed.port, keyed.port])
    proc = subprocess.Popen(dc.nginx_cmd(tmp, conf, "-g", "daemon off;"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        chat_turn(browser, f"http://127.0.0.1:{port}", "web-page-nginx.png")
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
