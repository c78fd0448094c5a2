"""Hostile input against a real `ferry serve`: values at the edges of every integer a request carries,
the auth, HTTP framing and cross-site rules, and the option parser. Each test here failed before its fix.

Run under the sanitizer build (tests/run.sh builds one) a request that reaches undefined behaviour aborts the
server, so "the server still answers" below is the assertion that catches it.
"""
import json

import pytest
from conftest import Server, assert_error, get, post

INT64_MAX = 2**63 - 1


def alive(server):
    st, _, out = post(server.url + "/v1/completions", {"prompt": "hi", "max_tokens": 1})
    assert st == 200 and out["usage"]["completion_tokens"] == 1, out


# ---- integers from the request ---------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [INT64_MAX, INT64_MAX - 1, 2**62, 2**31, 2**31 - 1, 4097])
def test_max_tokens_near_int64_max_is_400(server, field, value):
    """longest + max_tokens overflowed a signed sum: 200 with an empty text, or an abort under UBSan."""
    path = "/v1/chat/completions" if field == "max_completion_tokens" else "/v1/completions"
    body = {"messages": [{"role": "user", "content": "hi"}]} if field == "max_completion_tokens" else {"prompt": "hi"}
    body[field] = value
    st, _, out = post(server.url + path, body)
    assert_error(st, out, 400, field)
    assert str(value) in out["error"]["message"]
    alive(server)


EXTREMES = [INT64_MAX, -INT64_MAX - 1, 2**63, 2**64, -(2**63) - 1, 1e300, -1e300, 1.5, -1, 0, 2**31, -(2**31) - 1,
            "1", None, True, [], {}]


@pytest.mark.parametrize("field", ["max_tokens", "n", "top_k", "seed", "logprobs", "temperature", "top_p", "min_p",
                                   "presence_penalty", "frequency_penalty", "repetition_penalty"])
def test_integer_fields_at_the_edges(server, field):
    """Every numeric field at the edges of int64 and double: a 200 or a 400 error object, never anything else."""
    for v in EXTREMES:
        # written by hand: json.dumps refuses nothing here, and jansson must see the big integers as written
        raw = ('{"prompt": "hi", "max_tokens": 1, "%s": %s}' % (field, json.dumps(v))).encode()
        if field == "max_tokens":
            raw = ('{"prompt": "hi", "max_tokens": %s}' % json.dumps(v)).encode()
        st, _, out = post(server.url + "/v1/completions", raw)
        assert st in (200, 400), (field, v, st, out)
        if st == 400:
            assert_error(st, out, 400)
    alive(server)


def test_counts_and_sizes_at_the_edges(server):
    """n x prompts, logit_bias keys past int range, a token id past int32, stop lists: 400s, never a crash."""
    url = server.url + "/v1/completions"
    for body in ({"prompt": ["a"] * 128, "n": 128, "max_tokens": 1},
                 {"prompt": [[1, 2]] * 129, "max_tokens": 1},
                 {"prompt": "hi", "max_tokens": 1, "logit_bias": {"99999999999999999999": 1}},
                 {"prompt": "hi", "max_tokens": 1, "logit_bias": {"-1": 1}},
                 {"prompt": "hi", "max_tokens": 1, "logit_bias": {"5": 1e308}},
                 {"prompt": [2**31, 1], "max_tokens": 1},
                 {"prompt": [INT64_MAX], "max_tokens": 1},
                 {"prompt": "hi", "max_tokens": 1, "stop": ["x"] * 17},
                 {"prompt": "hi", "max_tokens": 1, "stop": "y" * 1025}):
        st, _, out = post(url, body)
        assert_error(st, out, 400)
    alive(server)


# ---- auth ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["", "\n\n", "# only a comment\n", "   \n# a\n\t\n", "\r\n#x\r\n"])
def test_key_file_without_a_key_refuses_to_start(tmp_path, content):
    """An --api-key-file with no usable line silently turned authentication off: now the server refuses to start."""
    keyfile = tmp_path / "keys"
    keyfile.write_text(content)
    with pytest.raises(RuntimeError, match="holds no key"):
        Server("--api-key-file", str(keyfile))


def test_key_file_line_too_long_refuses_to_start(tmp_path):
    keyfile = tmp_path / "keys"
    keyfile.write_text("k" * 3000 + "\n")
    with pytest.raises(RuntimeError, match="longer than"):
        Server("--api-key-file", str(keyfile))


def test_key_file_with_a_key_enforces_it(tmp_path):
    keyfile = tmp_path / "keys"
    keyfile.write_text("# comment\r\n  sekrit  \r\n")
    s = Server("--api-key-file", str(keyfile), key="sekrit")
    try:
        st, _, out = post(s.url + "/v1/completions", {"prompt": "hi", "max_tokens": 1})
        assert_error(st, out, 401)
        st, _, out = post(s.url + "/v1/completions", {"prompt": "hi", "max_tokens": 1}, {"Authorization": "Bearer sekrit"})
        assert st == 200
    finally:
        assert s.stop() == 0


# ---- options -----------------------------------------------------------------------------------------------


def test_boolean_flags_take_a_separate_value():
    """`--prompt-cache false` (the README's form) failed with "unexpected argument"."""
    prompt = "Once upon a time there was a little girl named Lily. She loved to play outside."
    for words, cached in ((["--prompt-cache", "false"], False), (["--prompt-cache", "TRUE"], True),
                          (["--prompt-cache", "off", "--any-model", "yes"], False), (["--prompt-cache"], True)):
        s = Server("--api-key", "k", "--public-health", "no", *words, key="k")
        try:
            hdr = {"Authorization": "Bearer k"}
            st, _, out = post(s.url + "/v1/completions", {"prompt": "hi", "max_tokens": 1, "model": "any"}, hdr)
            if "--any-model" in words:
                assert st == 200, out
            else:
                assert_error(st, out, 404, "model")
            for _ in range(2):
                st, _, out = post(s.url + "/v1/completions", {"prompt": prompt, "max_tokens": 2, "temperature": 0}, hdr)
                assert st == 200, out
            assert (out["usage"]["prompt_tokens_details"]["cached_tokens"] > 0) == cached, (words, out["usage"])
            st, _, out = get(s.url + "/health")
            assert_error(st, out, 401)  # --public-health no
        finally:
            assert s.stop() == 0
    # a bare boolean followed by another option still reads as true
    s = Server("--public-health", "--api-key", "k", key="k")
    try:
        assert get(s.url + "/health")[0] == 200
    finally:
        assert s.stop() == 0
