"""Shared helpers for the deploy tests: repository paths, the ferry binary and model, free ports, and the
generated nginx configuration (deploy/nginx/ferry.conf with its ports and paths rewritten into a temp dir).

The rewrite is deliberately narrow: it swaps the two upstream addresses, the listen port and the access-log path,
and fails when it cannot find them, so the file under test is the shipped one, not a copy kept here.
"""
import os
import pathlib
import re
import shutil
import socket
import subprocess

import pytest

SRC = pathlib.Path(os.environ.get("FERRY_SRC") or pathlib.Path(__file__).resolve().parents[2])
DEPLOY = SRC / "deploy"
TESTDATA = pathlib.Path(os.environ.get("FERRY_TESTDATA") or SRC.parent / "shared" / "testdata")


def ferry_binary():
    """FERRY_BIN, else $FERRY_BUILD/server/ferry, build/server/ferry, build-deploy/server/ferry; None if none."""
    cands = []
    if os.environ.get("FERRY_BIN"):
        cands.append(pathlib.Path(os.environ["FERRY_BIN"]))
    if os.environ.get("FERRY_BUILD"):
        cands.append(pathlib.Path(os.environ["FERRY_BUILD"]) / "server" / "ferry")
    cands.append(SRC / "build" / "server" / "ferry")
    cands.append(SRC / "build-deploy" / "server" / "ferry")  # tests/deploy/run.sh builds it there when needed
    for c in cands:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    return None


def test_model():
    """(path, why-missing). stories260K from FERRY_TESTDATA, else FERRY_DEPLOY_MODEL."""
    if os.environ.get("FERRY_DEPLOY_MODEL"):
        p = pathlib.Path(os.environ["FERRY_DEPLOY_MODEL"])
        return (p, None) if p.is_file() else (None, f"missing FILE: {p} (FERRY_DEPLOY_MODEL)")
    p = TESTDATA / "models" / "stories260K.gguf"
    return (p, None) if p.is_file() else (None, f"missing FILE: {p} (FERRY_TESTDATA)")


test_model.__test__ = False  # a helper, not a test


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tool(name):
    """Path of an executable, looking also in /usr/sbin (nginx lives there; a non-root PATH may lack it)."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/local/sbin")


def render_site(listen_port, upstream_ports, tmp, text=None):
    """deploy/nginx/ferry.conf with the upstream replicas, listen port and log path rewritten."""
    text = (DEPLOY / "nginx" / "ferry.conf").read_text() if text is None else text
    m = re.search(r"^upstream ferry \{.*?^\}", text, re.S | re.M)
    assert m, "ferry.conf: no `upstream ferry { ... }` block"
    block = m.group(0)
    servers = re.findall(r"^\s*server\s+127\.0\.0\.1:\d+", block, re.M)
    assert len(servers) == len(upstream_ports), f"ferry.conf: expected {len(upstream_ports)} upstream servers, found {servers}"
    it = iter(upstream_ports)
    block2 = re.sub(r"^(\s*server\s+)127\.0\.0\.1:\d+", lambda mm: f"{mm.group(1)}127.0.0.1:{next(it)}", block, flags=re.M)
    text = text[: m.start()] + block2 + text[m.end():]
    text, n = re.subn(r"^(\s*)listen 80;", rf"\g<1>listen 127.0.0.1:{listen_port};", text, flags=re.M)
    assert n == 1, "ferry.conf: expected one `listen 80;`"
    text, n = re.subn(r"^(\s*access_log )/var/log/nginx/access\.log( ferry;)", rf"\g<1>{tmp}/access.log\g<2>", text, flags=re.M)
    assert n == 1, "ferry.conf: expected one active `access_log /var/log/nginx/access.log ferry;`"
    live = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))
    assert "/var/" not in live and "/etc/" not in live, "ferry.conf: a root path is left after the rewrite"
    return text


def nginx_version():
    r = subprocess.run([tool("nginx"), "-v"], capture_output=True, text=True)
    m = re.search(r"nginx/(\d+)\.(\d+)\.(\d+)", r.stdout + r.stderr)
    return tuple(int(x) for x in m.groups()) if m else (0, 0, 0)


def self_signed_cert(tmp):
    """(cert, key) for CN=localhost, made with openssl; None when openssl is missing."""
    if not shutil.which("openssl"):
        return None
    tmp = pathlib.Path(tmp)
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True, timeout=60)
    return cert, key


def enable_tls_block(site_text, tls_port, cert, key, tmp):
    """Uncomments the TLS server block at the end of ferry.conf, as an operator would, pointing it at a test
    certificate and port. On nginx < 1.25.1 `http2 on;` becomes `listen ... ssl http2`, as the block's comment says."""
    lines = site_text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("# server {"))
    end = max(i for i, l in enumerate(lines) if l.startswith("# }"))
    block = [l[2:] if l.startswith("# ") else l.lstrip("#") for l in lines[start:end + 1]]
    text = "\n".join(block)
    old_nginx = nginx_version() < (1, 25, 1)
    listen = f"listen 127.0.0.1:{tls_port} ssl{' http2' if old_nginx else ''};"
    text, n = re.subn(r"^(\s*)listen 443 ssl;", rf"\g<1>{listen}", text, flags=re.M)
    assert n == 1, "TLS block: expected one `listen 443 ssl;`"
    text = re.sub(r"^\s*listen \[::\]:443 ssl;\n", "", text, flags=re.M)
    if old_nginx:
        text = re.sub(r"^\s*http2 on;.*\n", "", text, flags=re.M)
    text, n1 = re.subn(r"(ssl_certificate\s+)\S+;", rf"\g<1>{cert};", text)
    text, n2 = re.subn(r"(ssl_certificate_key\s+)\S+;", rf"\g<1>{key};", text)
    assert n1 == n2 == 1, "TLS block: expected ssl_certificate and ssl_certificate_key"
    text, n = re.subn(r"access_log /var/log/nginx/access\.log", f"access_log {tmp}/access.log", text)
    assert n == 1
    return site_text + "\n" + text + "\n"


def render_main(tmp, site_path):
    """A main nginx.conf around the site, everything under tmp; `user` only when running as root."""
    user = ""
    if os.geteuid() == 0:
        user = "user root;\n"  # run workers as the current user (root here), not nobody
    return f"""# generated by tests/deploy/conftest.py
{user}worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log info;
events {{ worker_connections 256; }}
http {{
    default_type application/octet-stream;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    access_log {tmp}/access_default.log;
    # Debian's nginx.conf has `gzip on`; an operator may add JSON and SSE to gzip_types. The site must turn
    # gzip off where it streams (gzip holds output until its buffers fill unless every chunk is flushed).
    gzip on;
    gzip_min_length 1;
    gzip_types application/json text/event-stream;
    include {site_path};
}}
"""


def write_nginx_conf(tmp, listen_port, upstream_ports, site_text=None, tls=None):
    """tls: None, or (port, cert, key) to turn on the site's commented TLS block as well."""
    tmp = pathlib.Path(tmp)
    site = tmp / "ferry.conf"
    text = render_site(listen_port, upstream_ports, tmp, site_text)
    if tls:
        text = enable_tls_block(text, *tls, tmp)
    site.write_text(text)
    main = tmp / "nginx.conf"
    main.write_text(render_main(tmp, site))
    return main


def nginx_cmd(tmp, conf, *extra):
    return [tool("nginx"), "-e", f"{tmp}/error.log", "-p", str(tmp), "-c", str(conf), *extra]


def nginx_test(tmp, conf):
    """Runs `nginx -t`; returns (rc, output)."""
    r = subprocess.run(nginx_cmd(tmp, conf, "-t"), capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout + r.stderr


@pytest.fixture
def need_nginx():
    if not tool("nginx"):
        pytest.skip("nginx not installed (tests/deploy/run.sh installs nginx-light from Debian)")
    return tool("nginx")
