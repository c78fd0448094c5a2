#!/usr/bin/env python3
"""A split GGUF model (NAME-00001-of-0000N.gguf ...) loads as the single file it was split from.

The shards are written at test time from stories260K.gguf by the `gguf` package's GGUFWriter (llama.cpp's
gguf-py, the writer convert_hf_to_gguf.py --split-max-tensors uses), into a temporary directory. `ferry run`
on the first shard must generate the single file's tokens exactly, `ferry inspect` must see the same model, and
`ferry serve` must answer as it does on the single file. Then each way a set of shards can be wrong (a shard
missing, a shard counting the shards otherwise, a tensor in two shards, split.tensors.count off, a shard under
another's name, opening a later shard, a first shard renamed) must be refused with an error naming the file.
Run by meson as a script: exits 77 (SKIP) with the reason when the model, the binary, pytest or gguf is missing.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("FERRY_BUILD", os.path.join(HERE, "..", "..", "build"))
TESTDATA = os.environ.get("FERRY_TESTDATA", os.path.join(HERE, "..", "..", "..", "shared", "testdata"))
FERRY = os.path.join(BUILD, "server", "ferry")
MODEL = os.path.join(TESTDATA, "models", "stories260K.gguf")

if __name__ == "__main__":
    for what, ok in (("FILE: " + MODEL, os.path.exists(MODEL)), ("FILE: " + FERRY, os.access(FERRY, os.X_OK))):
        if not ok:
            print("SKIP missing " + what)
            sys.exit(77)
    for mod in ("pytest", "gguf"):
        try:
            __import__(mod)
        except ImportError:
            print(f"SKIP missing python package: {mod} (pip install pytest gguf)")
            sys.exit(77)
    import pytest
    sys.exit(pytest.main(["-q", "-rs", "-p", "no:cacheprovider", "--rootdir", HERE, __file__]))

import pytest  # noqa: E402

gguf = pytest.importorskip("gguf", reason="the gguf package is missing (pip install gguf)")

PROMPT = "1,403,407,261,378,284,414,333,322,300"  # token ids: no tokenizer involved
N_SHARDS_TENSORS = 20  # stories260K has 48 tensors: 3 shards


def write_split(src, out_dir, stem, max_tensors=N_SHARDS_TENSORS):
    """Writes src as shards of at most max_tensors tensors with GGUFWriter; returns their paths in order."""
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(os.path.join(out_dir, stem + ".gguf"), arch, split_max_tensors=max_tensors)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        types = list(f.types)
        sub = types[1] if types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), types[0], sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    names = sorted(n for n in os.listdir(out_dir) if n.startswith(stem + "-"))
    return [os.path.join(out_dir, n) for n in names]


def ferry(*args, timeout=120):
    return subprocess.run([FERRY, *args], capture_output=True, text=True, timeout=timeout)


def generate(model):
    r = ferry("run", "--model", model, "--prompt-tokens", PROMPT, "--max-tokens", "48", "--temperature", "0",
              "--threads", "1", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["tokens"]


def patch(path, old, new):
    """Replaces the one occurrence of bytes `old` in the file by `new` (same length)."""
    assert len(old) == len(new)
    with open(path, "rb") as f:
        data = f.read()
    assert data.count(old) == 1, (path, old, data.count(old))
    with open(path, "wb") as f:
        f.write(data.replace(old, new))


def key_bytes(key, vtype):
    """A metadata entry's key and type as GGUF stores them (u64 length, bytes, u32 type)."""
    return len(key).to_bytes(8, "little") + key.encode() + int(vtype).to_bytes(4, "little")


U16, I32 = gguf.GGUFValueType.UINT16, gguf.GGUFValueType.INT32


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    d = tmp_path_factory.mktemp("split")
    paths = write_split(MODEL, str(d), "stories")
    assert [os.path.basename(p) for p in paths] == [f"stories-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    return paths


def fresh(split, tmp_path):
    """A private copy of the shards to break."""
    out = []
    for p in split:
        out.append(str(tmp_path / os.path.basename(p)))
        shutil.copy(p, out[-1])
    return out


def test_shards_are_what_the_writer_made(split):
    # three files, each with its split keys and part of the tensors; only the first has the tokenizer
    counts = []
    for i, p in enumerate(split):
        r = gguf.GGUFReader(p)
        assert r.fields["split.no"].contents() == i and r.fields["split.count"].contents() == 3
        counts.append(len(r.tensors))
        assert ("tokenizer.ggml.tokens" in r.fields) == (i == 0)
    assert counts == [20, 20, 8]


def test_split_generates_the_same_tokens(split):
    want = generate(MODEL)
    assert len(want) == 48
    assert generate(split[0]) == want


def test_inspect_sees_one_model(split):
    a, b = ferry("inspect", "--model", MODEL), ferry("inspect", "--model", split[0])
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    # the same model: every line but the ones naming the file or its size on disk
    strip = lambda s: [ln for ln in s.splitlines() if "stories" not in ln and "file" not in ln.lower()]  # noqa: E731
    assert strip(a.stdout) == strip(b.stdout)
    assert strip(a.stdout), a.stdout


def test_serve_answers_as_the_single_file(split):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([FERRY, "serve", "--model", split[0], "--port", str(port), "--threads", "1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.05)
        body = json.dumps({"prompt": [int(x) for x in PROMPT.split(",")], "max_tokens": 48, "temperature": 0,
                           "logprobs": 1}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            out = json.loads(r.read())
        assert out["usage"]["completion_tokens"] == 48
        run = ferry("run", "--model", MODEL, "--prompt-tokens", PROMPT, "--max-tokens", "48", "--temperature",
                    "0", "--threads", "1", "--json")
        assert out["choices"][0]["text"] == json.loads(run.stdout)["text"]
    finally:
        p.terminate()
        p.wait(30)


def refused(model, *needles):
    for cmd in (("run", "--model", model, "--prompt-tokens", PROMPT, "--max-tokens", "4"),
                ("inspect", "--model", model)):
        r = ferry(*cmd)
        assert r.returncode != 0, (cmd, r.stdout)
        for n in needles:
            assert n in r.stderr, (cmd, n, r.stderr)
    return r.stderr


def test_missing_shard(split, tmp_path):
    s = fresh(split, tmp_path)
    os.remove(s[1])
    refused(s[0], "stories-00002-of-00003.gguf", "missing")


def test_shard_counting_otherwise(split, tmp_path):
    s = fresh(split, tmp_path)
    patch(s[2], key_bytes("split.count", U16) + (3).to_bytes(2, "little"),
          key_bytes("split.count", U16) + (4).to_bytes(2, "little"))
    refused(s[0], "stories-00003-of-00003.gguf", "split.count is 4")


def test_duplicate_tensor(split, tmp_path):
    s = fresh(split, tmp_path)
    # shard 3's first tensor takes the name of one in shard 1 (same length: the file stays valid on its own)
    third = gguf.GGUFReader(s[2]).tensors[0].name
    first = next(t.name for t in gguf.GGUFReader(s[0]).tensors if len(t.name) == len(third))
    patch(s[2], len(third).to_bytes(8, "little") + third.encode(), len(first).to_bytes(8, "little") + first.encode())
    refused(s[0], f"tensor '{first}'", "stories-00001-of-00003.gguf", "stories-00003-of-00003.gguf")


def test_tensor_count_off(split, tmp_path):
    s = fresh(split, tmp_path)
    patch(s[0], key_bytes("split.tensors.count", I32) + (48).to_bytes(4, "little"),
          key_bytes("split.tensors.count", I32) + (47).to_bytes(4, "little"))
    refused(s[0], "stories-00001-of-00003.gguf", "split.tensors.count is 47", "48 tensors")


def test_shard_under_another_name(split, tmp_path):
    s = fresh(split, tmp_path)
    os.replace(s[1], str(tmp_path / "x"))
    os.replace(s[2], s[1])
    os.replace(str(tmp_path / "x"), s[2])
    refused(s[0], "stories-00002-of-00003.gguf", "split.no says shard 3")


def test_a_later_shard_is_not_a_model(split):
    refused(split[1], "stories-00002-of-00003.gguf is shard 2 of 3", "open the first, stories-00001-of-00003.gguf")


def test_renamed_first_shard(split, tmp_path):
    s = fresh(split, tmp_path)
    renamed = str(tmp_path / "stories.gguf")
    os.replace(s[0], renamed)
    refused(renamed, "stories.gguf", "-00001-of-00003.gguf")
