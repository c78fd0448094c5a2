"""The gauges the Kubernetes Gateway API Inference Extension's endpoint picker (EPP) reads from /metrics.

The EPP scrapes each replica's /metrics with the Go text parser (expfmt) and reads, by name, the waiting and running
requests and the KV cache's utilisation (gauges), and the KV block shape from an info gauge's labels; its default
names are vLLM's. A real `ferry serve` is held busy (two slots, five long requests) and the gauges must show
exactly the two running and three waiting, a KV share within what the test's own prompts and outputs can hold, and
go back to 0 when the requests are done. Every scrape is parsed by a strict reader of the text format (0.0.4),
refusing what expfmt refuses. The deploy example's EPP configuration (deploy/k8s-gateway) must name metrics
that ferry exports, as gauges, and its pool must select ferry's pods.
"""
import json
import math
import os
import re
import threading
import time
import urllib.request

import pytest

from conftest import Server, post

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
GATEWAY = os.path.join(ROOT, "deploy", "k8s-gateway")

# ---- a strict reader of the Prometheus text exposition format 0.0.4 ------------------------------------------

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
VALUE = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]Inf|NaN"
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


def _labels(text, where):
    """'a="x",b="y"' -> {"a": "x", "b": "y"}; escapes \\\\, \\" and \\n only; no duplicate names."""
    out, i = {}, 0
    while i < len(text):
        m = re.compile(rf'({LABEL})="').match(text, i)
        assert m, f"{where}: bad label at {text[i:]!r}"
        name, i, val = m.group(1), m.end(), []
        while True:
            assert i < len(text), f"{where}: unterminated label value"
            c = text[i]
            if c == "\\":
                assert i + 1 < len(text) and text[i + 1] in '\\"n', f"{where}: bad escape"
                val.append({"\\": "\\", '"': '"', "n": "\n"}[text[i + 1]])
                i += 2
            elif c == '"':
                i += 1
                break
            else:
                assert c != "\n", where
                val.append(c)
                i += 1
        assert name not in out, f"{where}: label {name} twice"
        out[name] = "".join(val)
        if i < len(text):
            assert text[i] == ",", f"{where}: expected ',' at {text[i:]!r}"
            i += 1
    return out


def parse_exposition(text):
    """Returns {family: {"type", "help", "samples": [(sample name, labels, value)]}}; fails on anything the Go
    parser refuses: a second HELP or TYPE, TYPE after samples, a family's lines not together, a sample name not
    of its family's type, duplicate samples, bad names, label syntax or values, no final newline; histograms
    must be cumulative with le ascending to +Inf and +Inf equal to _count."""
    assert text.endswith("\n"), "no final newline"
    fams, closed, current, seen = {}, set(), None, set()

    def family(name, where):
        nonlocal current
        if name != current:
            assert name not in closed, f"{where}: lines of {name} are not together"
            if current is not None:
                closed.add(current)
            current = name
        return fams.setdefault(name, {"type": None, "help": None, "samples": []})

    for n, line in enumerate(text[:-1].split("\n"), 1):
        where = f"line {n} {line!r}"
        assert line, f"line {n}: empty"
        if line.startswith("#"):
            m = re.fullmatch(rf"# (HELP|TYPE) ({NAME}) (.*)", line)
            assert m, f"{where}: a comment that is neither HELP nor TYPE"
            f = family(m.group(2), where)
            if m.group(1) == "TYPE":
                assert m.group(3) in TYPES, where
                assert f["type"] is None, f"{where}: second TYPE"
                assert not f["samples"], f"{where}: TYPE after samples"
                f["type"] = m.group(3)
            else:
                assert f["help"] is None, f"{where}: second HELP"
                assert not re.search(r"\\[^\\n]", m.group(3)), f"{where}: bad escape in HELP"
                f["help"] = m.group(3)
            continue
        m = re.fullmatch(rf"({NAME})(?:\{{(.*)\}})? ({VALUE})(?: -?\d+)?", line)
        assert m, f"{where}: not a sample"
        name, labels, value = m.group(1), _labels(m.group(2) or "", where), float(m.group(3))
        base = name
        for suffix in ("_bucket", "_sum", "_count"):
            b = name[: -len(suffix)]
            if name.endswith(suffix) and fams.get(b, {}).get("type") in ("histogram", "summary") and b == current:
                base = b
        f = family(base, where)
        t = f["type"] or "untyped"
        if t in ("counter", "gauge", "untyped"):
            assert name == base, where
        if t == "histogram":
            assert name != base, f"{where}: a histogram's sample needs a suffix"
            assert ("le" in labels) == name.endswith("_bucket"), where
        if t == "counter":
            assert value >= 0 or math.isnan(value), where
        key = (name, tuple(sorted(labels.items())))
        assert key not in seen, f"{where}: duplicate sample"
        seen.add(key)
        f["samples"].append((name, labels, value))
    for name, f in fams.items():
        if f["type"] != "histogram":
            continue
        buckets = [(s[1]["le"], s[2]) for s in f["samples"] if s[0] == name + "_bucket"]
        les = [float(le) for le, _ in buckets]
        assert les and les[-1] == math.inf and les == sorted(les) and len(set(les)) == len(les), name
        counts = [c for _, c in buckets]
        assert counts == sorted(counts), f"{name}: buckets not cumulative"
        count = [s[2] for s in f["samples"] if s[0] == name + "_count"]
        assert count == [counts[-1]], f"{name}: +Inf bucket != _count"
    return fams


def scrape(s):
    with urllib.request.urlopen(s.url + "/metrics", timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain"), r.headers["Content-Type"]
        return parse_exposition(r.read().decode())


def gauge(fams, name):
    """The value of a gauge family with one unlabelled sample."""
    f = fams[name]
    assert f["type"] == "gauge", (name, f["type"])
    assert len(f["samples"]) == 1 and f["samples"][0][1] == {}, f["samples"]
    return f["samples"][0][2]


# ---- the parser refuses what it must ----------------------------------------------------------------------------

GOOD = ('# HELP a_total A.\n# TYPE a_total counter\na_total 3\n# TYPE g:x gauge\ng:x{k="v\\"w"} -1.5e3\n'
        '# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_sum 3.5\nh_count 2\n')


@pytest.mark.parametrize("bad", [
    GOOD[:-1],                                                       # no final newline
    GOOD + "# TYPE a_total counter\n",                               # second TYPE, lines apart
    GOOD.replace("# TYPE g:x gauge\n", "# TYPE g:x gauge\n# TYPE g:x gauge\n"),
    GOOD + "a_total 4\n",                                            # a family's lines not together
    GOOD.replace('g:x{k="v\\"w"}', 'g:x{k="v"w"}'),                 # bad label value
    GOOD.replace('g:x{k=', 'g:x{1k='),                               # bad label name
    GOOD.replace("-1.5e3", "1,5"),                                   # bad value
    GOOD.replace("h_count 2", "h_count 3"),                          # +Inf bucket != _count
    GOOD.replace('h_bucket{le="1"} 1', 'h_bucket{le="1"} 3'),        # not cumulative
    GOOD.replace("a_total 3", "a_total 3\na_total 3"),               # duplicate sample
    GOOD.replace("h_sum 3.5", "h 3.5"),                              # a histogram's sample without a suffix
    GOOD + "\n",                                                     # empty line
    GOOD + "# a comment\n",                                         # (valid, but ferry writes none)
])
def test_parser_refuses(bad):
    with pytest.raises(AssertionError):
        parse_exposition(bad)


def test_parser_reads():
    fams = parse_exposition(GOOD)
    assert fams["g:x"]["samples"] == [("g:x", {"k": 'v"w'}, -1500.0)]
    assert [s[0] for s in fams["h"]["samples"]] == ["h_bucket", "h_bucket", "h_sum", "h_count"]


# ---- the gauges on a busy server ---------------------------------------------------------------------------------

PARALLEL, KV_TOKENS, BLOCK = 2, 4096, 16
PROMPT = [(7 * i) % 400 + 20 for i in range(200)]  # token ids: both running prompts prefill in one 512-token step
MAX_TOKENS = 1800  # with the prompt, within the 2048 positions of a slot


def test_gauges_follow_the_scheduler():
    s = Server("--parallel", str(PARALLEL), "--kv-tokens", str(KV_TOKENS), "--threads", "1")
    try:
        fams = scrape(s)
        # idle: all zero; the KV cache's shape from the flags given
        for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                     "vllm:gpu_cache_usage_perc"):
            assert gauge(fams, name) == 0, name
        info = fams["vllm:cache_config_info"]
        assert info["type"] == "gauge"
        assert [(x[1], x[2]) for x in info["samples"]] == [
            ({"block_size": str(BLOCK), "num_gpu_blocks": str(KV_TOKENS // BLOCK)}, 1.0)]
        total = KV_TOKENS // BLOCK

        results = []

        def run(stream):
            body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 1, "seed": 1, "ignore_eos": True}
            if stream:
                body.update(stream=True, stream_options={"include_usage": True})
                req = urllib.request.Request(s.url + "/v1/completions", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"}, method="POST")
                with urllib.request.urlopen(req, timeout=120) as r:
                    raw = r.read().decode()
                usage = [json.loads(x[6:]) for x in raw.split("\n\n") if x.startswith("data: {")][-1]["usage"]
                results.append(usage["completion_tokens"])
            else:
                st, _, out = post(s.url + "/v1/completions", body, timeout=120)
                assert st == 200, out
                results.append(out["usage"]["completion_tokens"])

        # two streams take the two slots, then three more requests wait
        threads = [threading.Thread(target=run, args=(i < 2,)) for i in range(5)]
        for t in threads[:2]:
            t.start()
        deadline = time.time() + 30
        while time.time() < deadline and gauge(scrape(s), "vllm:num_requests_running") < 2:
            time.sleep(0.005)
        for t in threads[2:]:
            t.start()
        # two running sequences hold at least their prompts (once both are prefilled) and at most prompt + every
        # output token
        lo = PARALLEL * math.ceil(len(PROMPT) / BLOCK) / total
        hi = PARALLEL * math.ceil((len(PROMPT) + MAX_TOKENS) / BLOCK) / total
        busy = None
        while time.time() < deadline:
            fams = scrape(s)
            if (gauge(fams, "vllm:num_requests_running"), gauge(fams, "vllm:num_requests_waiting")) == (2, 3) \
                    and gauge(fams, "vllm:kv_cache_usage_perc") >= lo - 1e-6:
                busy = fams
                break
            time.sleep(0.005)
        assert busy, "never saw 2 running and 3 waiting with both prompts in the KV cache"
        # the same numbers as ferry's own gauges of the same scrape
        assert gauge(busy, "ferry_running_sequences") == 2 and gauge(busy, "ferry_queue_depth") == 3
        usage = gauge(busy, "vllm:kv_cache_usage_perc")
        assert gauge(busy, "vllm:gpu_cache_usage_perc") == usage
        # no free slot holds a cache yet: the share is every block in use
        assert usage == pytest.approx(gauge(busy, "ferry_kv_blocks_used") / total, abs=1e-6)
        assert usage <= hi + 1e-6, (usage, hi)

        for t in threads:
            t.join(120)
        assert results == [MAX_TOKENS] * 5
        deadline = time.time() + 10
        while time.time() < deadline:
            fams = scrape(s)
            if gauge(fams, "vllm:num_requests_running") == 0:
                break
            time.sleep(0.01)
        assert gauge(fams, "vllm:num_requests_running") == 0 and gauge(fams, "vllm:num_requests_waiting") == 0
        # the free slots keep their prompt caches (blocks still allocated) and the picker sees them as free
        assert gauge(fams, "ferry_kv_blocks_used") >= PARALLEL * math.ceil(len(PROMPT) / BLOCK)
        assert gauge(fams, "vllm:kv_cache_usage_perc") == 0 and gauge(fams, "vllm:gpu_cache_usage_perc") == 0
    finally:
        assert s.stop() == 0, s.read_log()


def test_waiting_request_cancelled_leaves_the_queue():
    """A queued request whose client goes away no longer counts as waiting."""
    s = Server("--parallel", "1", "--threads", "1")
    try:
        body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 1, "ignore_eos": True, "n": 4}
        t = threading.Thread(target=post, args=(s.url + "/v1/completions", body), kwargs={"timeout": 120})
        t.start()
        deadline = time.time() + 30
        while time.time() < deadline and gauge(scrape(s), "vllm:num_requests_waiting") < 3:
            time.sleep(0.005)
        # a second client's request waits behind the first's three queued choices, then leaves
        import socket
        raw = json.dumps({"prompt": "Once", "max_tokens": 4}).encode()
        c = socket.create_connection(("127.0.0.1", s.port))
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw))
        waited = None
        while time.time() < deadline:
            fams = scrape(s)
            if gauge(fams, "vllm:num_requests_waiting") == 4:
                waited = fams
                break
            time.sleep(0.005)
        assert waited, "the second request was never seen waiting"
        assert gauge(waited, "vllm:num_requests_running") == 1
        c.close()
        while time.time() < deadline and gauge(scrape(s), "vllm:num_requests_waiting") == 4:
            time.sleep(0.005)
        assert gauge(scrape(s), "vllm:num_requests_waiting") <= 3
        t.join(120)
        fams = scrape(s)
        assert gauge(fams, "vllm:num_requests_waiting") == 0 and gauge(fams, "vllm:num_requests_running") == 0
    finally:
        assert s.stop() == 0, s.read_log()


# ---- the deploy example names metrics that ferry exports ----------------------------------------------------------


def _docs(path):
    yaml = pytest.importorskip("yaml", reason="pyyaml missing (pip install pyyaml)")
    with open(path) as f:
        return {d["kind"]: d for d in yaml.safe_load_all(f) if d}


def _epp_config():
    import yaml
    (text,) = _docs(os.path.join(GATEWAY, "epp.yaml"))["ConfigMap"]["data"].values()
    return yaml.safe_load(text)


def test_deploy_example_pool_selects_ferry():
    epp = _docs(os.path.join(GATEWAY, "epp.yaml"))
    pool = _docs(os.path.join(GATEWAY, "inferencepool.yaml"))
    kus = _docs(os.path.join(GATEWAY, "kustomization.yaml"))["Kustomization"]
    dep = _docs(os.path.join(ROOT, "deploy", "k8s", "deployment.yaml"))["Deployment"]
    labels = dict(dep["spec"]["template"]["metadata"]["labels"])
    # the overlay's patch adds the label that picks the "ferry" metric names
    (patch,) = kus["patches"]
    assert patch["target"] == {"kind": "Deployment", "name": dep["metadata"]["name"]}
    import yaml
    (op,) = [o for o in yaml.safe_load(patch["patch"]) if "engine-type" in o["path"]]
    key = op["path"].rsplit("/", 1)[1].replace("~1", "/")
    labels[key] = op["value"]
    ext = next(p for p in _epp_config()["plugins"] if p["type"] == "core-metrics-extractor")["parameters"]
    assert ext["engineLabelKey"] == key and op["value"] in [e["name"] for e in ext["engineConfigs"]]
    ip = pool["InferencePool"]["spec"]
    assert ip["selector"]["matchLabels"].items() <= labels.items()
    port = next(p for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"] if p["name"] == "http")
    assert [p["number"] for p in ip["targetPorts"]] == [port["containerPort"]]
    svc = epp["Service"]
    assert ip["endpointPickerRef"]["name"] == svc["metadata"]["name"]
    assert ip["endpointPickerRef"]["port"]["number"] in [p["port"] for p in svc["spec"]["ports"]]
    args = epp["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--pool-name") + 1] == pool["InferencePool"]["metadata"]["name"]
    backend = pool["HTTPRoute"]["spec"]["rules"][0]["backendRefs"][0]
    assert backend["kind"] == "InferencePool" and backend["name"] == pool["InferencePool"]["metadata"]["name"]


def test_deploy_example_names_ferry_metrics():
    cfg = _epp_config()
    assert cfg["kind"] == "EndpointPickerConfig"
    ext = next(p for p in cfg["plugins"] if p["type"] == "core-metrics-extractor")
    (eng,) = [e for e in ext["parameters"]["engineConfigs"] if e["name"] == "ferry"]
    s = Server("--parallel", "2")
    try:
        fams = scrape(s)
    finally:
        assert s.stop() == 0
    for key in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "cacheInfoSpec"):
        name = eng[key]
        assert name in fams and fams[name]["type"] == "gauge", (key, name)
    assert eng["loraSpec"] == "", "ferry serves no LoRA adapters: the picker must not look for them"
    assert {"block_size", "num_gpu_blocks"} <= set(fams[eng["cacheInfoSpec"]]["samples"][0][1])
    # the names an EPP uses when nothing is configured (vLLM's) are there too
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        assert fams[name]["type"] == "gauge"
