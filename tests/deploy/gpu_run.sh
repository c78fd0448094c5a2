#!/bin/bash
# gpu_run.sh — on the lent GPU machine: build ferry as the Dockerfile's build-cuda stage does (-Dcuda=enabled
# -Dnative=false -Dserver=enabled -Dtests=disabled) from the committed tree (or, without git, the copy of the
# checkout the machine was given), then run tests/deploy/test_proxy.py against two CUDA replicas behind Debian's
# nginx (replica b under no-new-privs, no capabilities, PR_SET_MDWE and uid 65534, as deploy/ferry.service
# confines it). Not run in CI (no GPU there).
#
# The machine has no package access: carry .debs (../shared/tools/offline-debs.sh) and build-deploy/gpu-kit with
#   debs/nginx_*.deb, wheels/ (pytest and its dependencies), stories260K.gguf
# Usage (repository root): tests/deploy/gpu_run.sh ; logs go to $OUT (./out when unset).
set -u
src=$(pwd)
out=${OUT:-$src/out}
kit=$src/build-deploy/gpu-kit
mkdir -p "$out"
log() { echo "== $*" | tee -a "$out/summary.txt"; }

deps=/opt/deps
if [ ! -d $deps/usr ]; then
    for f in "$src"/.debs/*.deb "$kit"/debs/*.deb; do dpkg -x "$f" $deps; done
    sed -i '/^Requires.private/d' $deps/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
fi
export PKG_CONFIG_SYSROOT_DIR=$deps
export PKG_CONFIG_PATH=$deps/usr/lib/x86_64-linux-gnu/pkgconfig:$deps/usr/share/pkgconfig
export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$PATH:$deps/usr/bin:$deps/usr/sbin:/usr/local/cuda/bin
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1; uname -r; } > "$out/machine.txt" 2>&1
log "machine: $(head -1 "$out/machine.txt")"
log "nginx: $(nginx -v 2>&1)"

work=/tmp/ferry-deploy-gpu
rm -rf "$work" && mkdir -p "$work"
# The committed tree when git is there; else the copy of the working tree the machine was given.
if git -C "$src" rev-parse HEAD >/dev/null 2>&1; then
    git -C "$src" archive HEAD | tar -C "$work" -xf -
else
    tar -C "$src" --exclude='./build*' --exclude=./.debs --exclude=./out --exclude=./.git -cf - . | tar -C "$work" -xf -
fi
cd "$work" || exit 1
if ! meson setup /tmp/ferry-deploy-build --buildtype=release -Dnative=false -Dcuda=enabled -Dserver=enabled \
        -Dtests=disabled > "$out/setup.log" 2>&1; then
    log "meson setup FAILED"; tail -30 "$out/setup.log"; exit 1
fi
grep -iE "cuda|server" "$out/setup.log" | tail -5 >> "$out/summary.txt"
if ! ninja -C /tmp/ferry-deploy-build server/ferry > "$out/build.log" 2>&1; then
    log "build FAILED"; grep -E "error" "$out/build.log" | head -30; exit 1
fi
log "build ok: $(ls -la /tmp/ferry-deploy-build/server/ferry)"

# Where uid 65534 (the sandboxed replica) can read it.
cp "$kit/stories260K.gguf" /tmp/stories260K.gguf && chmod 0644 /tmp/stories260K.gguf
py=python3
$py -c 'import pytest' 2>/dev/null || $py -m pip install -q --no-index --find-links "$kit/wheels" pytest > "$out/pip.log" 2>&1
cd "$work/tests/deploy" || exit 1
FERRY_BIN=/tmp/ferry-deploy-build/server/ferry FERRY_DEPLOY_MODEL=/tmp/stories260K.gguf FERRY_DEPLOY_REQUIRE_SERVER=1 \
    FERRY_DEPLOY_KEEP_LOGS="$out" \
    $py -m pytest -p no:cacheprovider -rs -v test_proxy.py > "$out/pytest.log" 2>&1
rc=$?
log "pytest rc=$rc: $(tail -1 "$out/pytest.log")"
grep -hE "backend|cuda|error" "$out"/ferry-*.log 2>/dev/null | head -10 | tee -a "$out/summary.txt"
exit $rc
