"""deploy/container/Containerfile, built with buildah (Debian's package) from a local Debian base, no registry
pulled from, and the agent run in the image as the DaemonSet runs it: user 65534 with root's group, the node's
pod logs and cgroups mounted read-only, following a pod's container to its phase.

Opt-in (minutes, and the Debian archive over the network): LLMSTARTUP_TEST_IMAGE=1, as root, with buildah and
debootstrap installed. The base is `debootstrap --variant=minbase bookworm`, made once into
/var/cache/llmstartup-test and named as the recipe's FROM (debian:bookworm-slim) in a containers-storage of the
tests' own there, so that nothing is pulled and the machine's own images are untouched; the package's wheels
are built here (pip, as .ci/setup installs it) and served to the build on loopback, through the recipe's
PIP_* build arguments.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.container_runtime import CGROUP2, VLLM
from tests.scrape import Scrape, free_port, try_fetch, wait_for

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path("/var/cache/llmstartup-test")
BASE = "docker.io/library/debian:bookworm-slim"  # the recipe's FROM
IMAGE = "localhost/llmstartup:test"

pytestmark = pytest.mark.skipif(
    os.environ.get("LLMSTARTUP_TEST_IMAGE") != "1" or os.geteuid() != 0
    or not shutil.which("buildah") or not shutil.which("debootstrap") or CGROUP2 is None,
    reason="builds the image: LLMSTARTUP_TEST_IMAGE=1, as root, with buildah and debootstrap (Debian packages)",
)


def buildah(*args: str, timeout: float = 900, check: bool = True) -> str:
    storage = ["--root", str(CACHE / "storage"), "--runroot", "/run/llmstartup-test-storage", "--storage-driver", "vfs"]
    done = subprocess.run(["buildah", *storage, *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"buildah {' '.join(args)}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout.strip()


def base_image() -> None:
    """debian:bookworm-slim, as the tests' own storage knows it: a debootstrapped bookworm, made once."""
    if buildah("images", "--quiet", BASE, check=False):
        return
    rootfs = CACHE / "bookworm-minbase"
    if not (rootfs / "etc" / "debian_version").exists():
        shutil.rmtree(rootfs, ignore_errors=True)
        subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), "http://deb.debian.org/debian"],
                       check=True, capture_output=True, timeout=1200)
    container = buildah("from", "scratch")
    mount = buildah("mount", container)
    subprocess.run(f"tar -C {rootfs} -c . | tar -C {mount} -x", shell=True, check=True)
    buildah("umount", container)
    buildah("config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "--cmd", "bash", container)
    buildah("commit", "--quiet", container, BASE)
    buildah("rm", container)


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> str:
    CACHE.mkdir(parents=True, exist_ok=True)
    base_image()
    wheels = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels), str(ROOT),
                    "setuptools>=68", "wheel"], check=True, timeout=600)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(wheels))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        buildah("bud", "--pull=never", "--isolation", "chroot", "--layers",
                "--build-arg", "PIP_NO_INDEX=1", "--build-arg", f"PIP_FIND_LINKS=http://127.0.0.1:{server.server_port}/",
                "-f", str(ROOT / "deploy" / "container" / "Containerfile"), "-t", IMAGE, str(ROOT), timeout=1800)
    finally:
        server.shutdown()
    return IMAGE


def test_the_image_is_the_agent_as_nobody(image: str) -> None:
    config = json.loads(buildah("inspect", "--type", "image", image))["OCIv1"]["config"]
    assert config["User"] == "65534:65534"
    assert config["Entrypoint"] == ["llmstartup"] and config["Cmd"][0] == "serve"
    assert "9847/tcp" in config.get("ExposedPorts", {})


def test_the_agent_in_the_image_follows_a_pod_as_the_daemonset_runs_it(image: str, node, tmp_path: Path) -> None:
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps([{"log": "vLLM API server version 0.11.0"},
                                 {"log": "Starting to load model Qwen/Qwen3-8B..."}, {"hang": True}]))
    node.run_pod("llm", "vllm-0", "vllm", [*VLLM, str(steps)])
    port = free_port()
    container = buildah("from", image)
    # the DaemonSet's mounts, read-only, at its paths; its user, with root's group (supplementalGroups: [0])
    mounts = [f"{node.pods}:/var/log/pods:ro", f"{node.links}:/var/log/containers:ro", f"{CGROUP2}:/host/sys/fs/cgroup:ro"]
    command = ["buildah", "--root", str(CACHE / "storage"), "--runroot", "/run/llmstartup-test-storage",
               "--storage-driver", "vfs", "run", "--isolation", "chroot", "--user", "65534:0",
               *[f"--volume={m}" for m in mounts], container, "--", "llmstartup", "serve",
               f"--web.listen-address=127.0.0.1:{port}", "--path.cgroupfs=/host/sys/fs/cgroup",
               "--state.path=/tmp/history.db", "--no-collector.gpu", "--sample.interval=1s"]
    agent = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: try_fetch(port) or agent.poll() is not None, 60, "the agent in the image to serve")
        assert agent.poll() is None, agent.stdout.read()
        final = wait_for(lambda: (s := Scrape(try_fetch(port) or "")).one_of("unit_phase", "llm/vllm-0/vllm", "phase")
                         == "downloading" and s, 60, "the pod's phase, read by the agent in the image")
        assert final.value("llmstartup_processes", unit="llm/vllm-0/vllm", state="sleeping") >= 1
        assert final.value("llmstartup_source_up", source="containers") == 1
    finally:
        agent.terminate()
        try:
            agent.wait(timeout=20)
        except subprocess.TimeoutExpired:
            agent.kill()
        buildah("rm", container, check=False)
