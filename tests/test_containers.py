"""Containers as units: the runtimes' names and layouts (pure), their log files followed across rotations and
restarts, their cgroups found from their ids, with real processes in real cgroups (tests/container_runtime.py)."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from exporter.core.containers import (
    docker_run,
    kubelet_link,
    log_unit,
    pod_log,
    rotation_order,
    scope_id,
)
from exporter.core.model import Event, Lifecycle, LogLine
from exporter.sources.containers import ContainerSource
from exporter.sources.log_files import FollowedFile
from exporter.sources.processes import ProcessSource
from exporter.sources.scopes import walk
from tests.container_runtime import CGROUP2, VLLM, Node, poll
from tests.scrape import Scrape, fetch, wait_for

ID = "4f5e" * 16
UID = "8d2b7c3a-94c1-4a0e-9b36-2f4a1c6e7d10"



# --- names and layouts -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "want"),
    [
        pytest.param(f"cri-containerd-{ID}.scope", ID, id="containerd, systemd driver"),
        pytest.param(f"crio-{ID}.scope", ID, id="CRI-O, systemd driver"),
        pytest.param(f"docker-{ID}.scope", ID, id="Docker, systemd driver"),
        pytest.param(f"libpod-{ID}.scope", ID, id="Podman"),
        pytest.param(ID, ID, id="containerd or Docker, cgroupfs driver"),
        pytest.param(f"crio-{ID}", ID, id="CRI-O, cgroupfs driver"),
        pytest.param(f"crio-conmon-{ID}.scope", None, id="CRI-O's monitor is no container"),
        pytest.param(f"libpod-conmon-{ID}.scope", None, id="nor Podman's"),
        pytest.param("kubepods-burstable-pod8d2b7c3a_94c1.slice", None, id="a pod's slice"),
        pytest.param(f"cri-containerd-{ID[:-1]}.scope", None, id="an id one digit short"),
        pytest.param("docker.service", None, id="the daemon"),
    ],
)
def test_a_containers_cgroup_is_named_after_its_id(name: str, want: str | None) -> None:
    assert scope_id(name) == want


def test_kubelets_link_and_log_paths_name_the_pod_container() -> None:
    assert kubelet_link(f"vllm-0_llm-serving_vllm-openai-{ID}.log") == ("llm-serving", "vllm-0", "vllm-openai", ID)
    assert kubelet_link(f"vllm-0_llm-serving_vllm-{ID[:12]}.log") is None
    log = pod_log(f"/var/log/pods/llm-serving_vllm-0_{UID}/vllm-openai/3.log")
    assert (log.unit, log.restart, log.invocation) == ("llm-serving/vllm-0/vllm-openai", 3, f"{UID}/vllm-openai/3")
    assert pod_log(f"llm-serving_vllm-0_{UID}/vllm-openai/3.log.20261129-120001.gz").restart == 3
    assert pod_log("/var/log/syslog") is None


@pytest.mark.parametrize(
    ("path", "unit"),
    [
        pytest.param(f"/var/log/pods/kserve_llama-predictor-5d9f_{UID}/kserve-container/0.log", "kserve/llama-predictor-5d9f/kserve-container", id="pod"),
        pytest.param(f"saved/kserve_llama_{UID}/kserve-container/0.log.20261129-120001.gz", "kserve/llama/kserve-container", id="rotated, copied"),
        pytest.param(f"/var/lib/docker/containers/{ID}/{ID}-json.log.2", ID[:12], id="docker: its short id"),
        pytest.param("vllm.log", None, id="anything else"),
    ],
)
def test_the_unit_of_a_saved_container_log(path: str, unit: str | None) -> None:
    assert log_unit(path) == unit


@pytest.mark.parametrize(
    ("base", "names", "want"),
    [
        pytest.param("0.log", ["0.log", "0.log.20261129-120105", "0.log.20261129-120001.gz", "0.log.20261129-120002.gz.tmp",
                               "1.log"], ["0.log.20261129-120001.gz", "0.log.20261129-120105"], id="kubelet: by time"),
        pytest.param(f"{ID}-json.log", [f"{ID}-json.log.1", f"{ID}-json.log.10", f"{ID}-json.log.2.gz", f"{ID}-json.log"],
                     [f"{ID}-json.log.10", f"{ID}-json.log.2.gz", f"{ID}-json.log.1"], id="docker: highest number oldest"),
    ],
)
def test_rotated_files_oldest_first(base: str, names: list[str], want: list[str]) -> None:
    assert rotation_order(base, names) == want


@pytest.mark.parametrize(
    ("t", "runs", "want"),
    [
        pytest.param(50.0, ((99.0, "B"),), "before B", id="a line older than the start known"),
        pytest.param(99.5, ((99.0, "B"),), "B", id="printed a moment before Docker stamped the start"),
        pytest.param(150.0, ((99.0, "B"), (140.0, "C")), "C", id="after the next start's boundary"),
        pytest.param(120.0, ((99.0, "B"), (140.0, "C")), "B", id="between"),
        pytest.param(120.0, (), "", id="no start known"),
    ],
)
def test_which_docker_run_a_line_belongs_to(t: float, runs: tuple, want: str) -> None:
    assert docker_run(t, runs) == want


# --- a log file followed across rotations -------------------------------------------------------


def test_a_followed_file_across_rotations_in_both_runtimes_styles(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    writer = open(path, "ab", buffering=0)
    followed = FollowedFile(path)
    writer.write(b"1\n2\n3")
    assert followed.read() == [b"1", b"2"]  # the unended line waits
    writer.write(b"\n")
    os.rename(path, tmp_path / "0.log.20261129-120001")  # kubelet renames; containerd writes there …
    writer.write(b"4\n")
    renamed, writer = writer, open(path, "ab", buffering=0)  # … until it reopens: a new file at the path
    writer.write(b"5\n")
    assert followed.read() == [b"3", b"4", b"5"]
    renamed.write(b"5a\n")  # a write that was under way in the runtime as it reopened
    assert followed.read() == [b"5a"]  # the renamed file's last look
    # two rotations between two reads, the first rotated file compressed meanwhile (kubelet's next rotation)
    writer.write(b"6\n")
    os.rename(path, tmp_path / "0.log.20261129-120002")
    writer = open(path, "ab", buffering=0)
    writer.write(b"7\n")
    first = tmp_path / "0.log.20261129-120002"
    with gzip.open(f"{first}.gz", "wb") as compressed:
        compressed.write(first.read_bytes())
    first.unlink()
    os.rename(path, tmp_path / "0.log.20261129-120003")
    writer = open(path, "ab", buffering=0)
    writer.write(b"8")
    assert followed.read() == [b"6", b"7"]
    assert followed.close() == [b"8"]  # its writer is gone: the last line, unended
    # read anew: the rotated files oldest first, compressed or not, then the file
    assert FollowedFile(path).read() == [b"1", b"2", b"3", b"4", b"5a", b"5", b"6", b"7"]


# --- real processes in real cgroups, their output in the runtimes' formats ----------------------

SCRIPT = [
    {"log": "vLLM API server version 0.11.0"},
    {"raw": "non-default args: {'model': 'Qwen/Qwen3-8B', 'served_model_name': [" + "'x', " * 6000 + "]}"},
    {"log": "Starting to load model Qwen/Qwen3-8B..."},
    {"hang": True},
]


def scenario(tmp_path: Path, steps: list, name: str = "steps.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(steps))
    return str(path)


def lines_of(observations, unit: str) -> list[LogLine]:
    return [o for o in observations if isinstance(o, LogLine) and o.unit == unit]


def test_a_pods_container_is_found_and_read_with_its_processes(node: Node, tmp_path: Path) -> None:
    pod = node.run_pod("llm", "vllm-0", "vllm", [*VLLM, scenario(tmp_path, SCRIPT)])
    unit = "llm/vllm-0/vllm"
    source = ContainerSource(node.pods, node.docker)
    [container] = source.containers().values()
    assert (container.unit, container.id, container.labels) == (
        unit, pod.id, {"namespace": "llm", "pod": "vllm-0", "container": "vllm"})
    assert walk(CGROUP2)[pod.id] == pod.cgroup
    processes = ProcessSource(CGROUP2)
    processes.place({unit: pod.id})
    assert "vllm.entrypoints.openai.api_server" in processes.cmdlines(unit)[0]
    source.follow([unit])
    seen: list[LogLine] = []
    poll(lambda: seen.extend(lines_of(source.drain(), unit)) or any("Starting to load" in s.text for s in seen), 20,
         "the container's lines")
    # the 40 KiB args line came as three CRI records (P, P, F) and is one line again
    assert sum(1 for s in seen if s.text.startswith("non-default args:")) == 1
    assert {s.invocation for s in seen} == {f"{pod.uid}/vllm/0"}
    sample = processes.sample([unit], 0.0)[unit]
    assert sample.ids and {pid for pid, _ in sample.ids} == pod.pids() and sample.rss_bytes > 0


def test_a_restart_is_a_new_start_and_earlier_starts_are_read_first(node: Node, tmp_path: Path) -> None:
    crash = [{"log": "vLLM API server version 0.11.0"}, {"exit": 1}]
    first = node.run_pod("llm", "vllm-0", "vllm", [*VLLM, scenario(tmp_path, crash)])
    first.wait()
    second = node.restart(first, [*VLLM, scenario(tmp_path, SCRIPT, "second.json")])
    source = ContainerSource(node.pods, node.docker)
    [container] = source.containers().values()
    assert container.id == second.id  # kubelet's newest link
    source.follow([container.unit])
    seen: list[LogLine] = []
    poll(lambda: seen.extend(lines_of(source.drain(), container.unit)) or any("Starting to load" in s.text for s in seen),
         20, "the second start's lines")
    invocations = [s.invocation for s in seen]
    assert invocations[0] == f"{first.uid}/vllm/0" and invocations[-1] == f"{first.uid}/vllm/1", [
        (s.invocation, s.text[:60]) for s in seen]
    assert invocations == sorted(invocations)  # the first start's lines, then the second's


def test_kubelets_rotation_under_load_loses_and_repeats_nothing(node: Node, tmp_path: Path) -> None:
    count = 20000
    # about 1 MB a second for 5 seconds: kubelet's stamps allow a rotation a second
    writer = [sys.executable, "-c", f"import time\nfor i in range({count}):\n print(f'line {{i:06d}} ' + 'x' * 200)\n"
              " if i % 40 == 0: time.sleep(0.01)"]
    pod = node.run_pod("load", "writer", "w", writer)
    source = ContainerSource(node.pods, node.docker)
    unit = "load/writer/w"
    source.containers()
    source.follow([unit])
    seen: list[str] = []
    stop = threading.Event()

    def rotate() -> None:  # kubelet: rotate whenever the log passed a size, as fast as its stamps allow
        while not stop.is_set() and pod.shim.poll() is None:
            if pod.log.exists() and pod.log.stat().st_size > 256 * 1024:
                node.rotate(pod)
            stop.wait(0.01)

    rotator = threading.Thread(target=rotate)
    rotator.start()
    try:
        while pod.shim.poll() is None:
            seen += [s.text for s in lines_of(source.drain(), unit)]
    finally:
        stop.set()
        rotator.join()
    seen += [s.text for s in lines_of(source.drain(), unit)]
    seen += [s.text for s in lines_of(source.drain(), unit)]  # the renamed file's last look
    rotated = list(pod.log.parent.glob("0.log.*"))
    assert len(rotated) >= 3, "kubelet rotated several times while the container wrote"
    assert any(p.name.endswith(".gz") for p in rotated)
    assert [int(text.split()[1]) for text in seen] == list(range(count))


@pytest.mark.parametrize("seed", range(30))
def test_dockers_rotation_under_a_fast_writer_loses_reorders_and_repeats_nothing(tmp_path: Path, seed: int) -> None:
    """dockerd's own rotation (tests/container_shim.py's, as dockerd does it: shift the numbered files, the
    log becomes .1, a new one is opened) every ~50 lines, while the file is read as fast as it can be."""
    from tests.container_shim import JsonFileLog

    path = tmp_path / f"{ID}-json.log"
    log = JsonFileLog(path, 8000, 100)
    count, done = 600, threading.Event()

    def write() -> None:
        pace = random.Random(seed)
        for i in range(count):
            log.write("stdout", f"line {i} ".encode() + b"y" * pace.randrange(50, 150), False)
            if pace.random() < 0.05:
                time.sleep(0.0005)
        done.set()

    followed = FollowedFile(path)
    writer = threading.Thread(target=write)
    writer.start()
    seen: list[bytes] = []
    while not done.is_set():
        seen += followed.read()
    writer.join()
    seen += followed.read() + followed.read()
    assert [int(json.loads(line)["log"].split()[1]) for line in seen] == list(range(count))


def test_dockers_json_file_rotation_and_runs(node: Node, tmp_path: Path) -> None:
    steps = [{"log": f"Starting to load model Qwen/Qwen3-8B... {i}"} for i in range(300)] + [{"exit": 3}]
    docker = node.run_docker("vllm", [*VLLM, scenario(tmp_path, steps)], max_size=8000, max_file=100)
    source = ContainerSource(node.pods, node.docker)
    [container] = source.containers().values()
    assert (container.unit, container.id, container.labels) == ("vllm", docker.id, {"namespace": "", "pod": "", "container": "vllm"})
    source.follow(["vllm"])
    seen = []
    while docker.shim.poll() is None:
        seen += source.drain()
    seen += source.drain()
    assert len(list(docker.directory.glob("*-json.log.*"))) >= 3
    loads = [o.text for o in lines_of(seen, "vllm") if "Starting to load" in o.text]
    assert [int(t.rsplit(" ", 1)[1]) for t in loads] == list(range(300))
    [run] = {o.invocation for o in lines_of(seen, "vllm")}
    [ended] = [o for o in seen if isinstance(o, Lifecycle)]
    assert (ended.event, ended.detail, ended.invocation) == (Event.EXITED, "exited/3/FAILURE", run)
    # `docker restart`: the same file goes on; the new run's lines are another start's
    again = node.restart(docker, [*VLLM, scenario(tmp_path, SCRIPT, "again.json")])
    more: list[LogLine] = []
    poll(lambda: more.extend(lines_of(source.drain(), "vllm")) or any("Starting to load" in s.text for s in more), 20,
         "the second run's lines")
    assert {s.invocation for s in more} - {run}, "a new run"
    assert again.id == docker.id


def test_a_log_the_agent_may_not_read_says_so(node: Node, tmp_path: Path) -> None:
    """containerd's pod logs are root's (0640, root's group): an agent without that group says which file."""
    pod = node.run_pod("llm", "vllm-0", "vllm", [*VLLM, scenario(tmp_path, SCRIPT)])
    source = ContainerSource(node.pods, node.docker)
    source.containers()
    source.follow(["llm/vllm-0/vllm"])
    os.chmod(pod.log, 0o000)
    os.setegid(65534)
    os.seteuid(65534)
    try:
        assert source.drain() == []
    finally:
        os.seteuid(0)
        os.setegid(0)
    assert source.status.failing
    os.chmod(pod.log, 0o640)
    poll(lambda: lines_of(source.drain(), "llm/vllm-0/vllm"), 20, "the lines, readable again")


# --- end to end: the real `llmstartup serve`, no unit named ----------------------------------------

LOAD = [
    {"log": "vLLM API server version 0.11.0"},
    {"log": "Initializing a V1 LLM engine (v0.11.0) with config: model='Qwen/Qwen3-8B', speculative_config=None"},
    {"log": "Starting to load model Qwen/Qwen3-8B..."},
    {"log": "Model loading took 15.27 GiB and 2.10 seconds"},
    {"log": "Using cache directory: /root/.cache/vllm/torch_compile_cache/7522dc03ce/rank_0_0/backbone for vLLM's torch.compile"},
]
READY = [
    *LOAD,
    {"burn": 8, "workers": 2},
    {"log": "torch.compile takes 8.40 s in total"},
    {"log": "GPU KV cache size: 412,336 tokens"},
    {"bar": "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", "steps": 10, "seconds": 1},
    {"log": "Graph capturing finished in 1 secs, took 0.52 GiB"},
    {"raw": "INFO:     Application startup complete."},
    {"hang": True},
]
READY_QUICK = [*LOAD, {"log": "torch.compile takes 2.40 s in total"}, {"raw": "INFO:     Application startup complete."},
               {"hang": True}]
HANG = [*LOAD, *[{"log": "Cache the graph of shape None for later use"} for _ in range(60)], {"hang": True}]
CUDA_OOM = [
    *LOAD,
    {"sleep": 3},
    {"traceback": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.25 GiB is free."},
    {"exit": 1},
]


def test_serve_follows_pods_and_docker_containers_with_no_unit_named(node: Node, agent, journald, tmp_path: Path) -> None:
    # two started before the agent (it reads their earlier lines), two after (it finds them as they start)
    node.run_pod("llm", "vllm-0", "vllm", [*VLLM, scenario(tmp_path, READY, "ready.json")])
    node.run_docker("vllm-journald", [*VLLM, scenario(tmp_path, READY_QUICK, "quick.json")], driver="journald",
                    journal_socket=journald.runtime_dir / "socket")
    port = agent(args=("--path.pods", str(node.pods), "--path.docker", str(node.docker)))
    oom = node.run_pod("llm", "vllm-oom-7f9c", "vllm", [*VLLM, scenario(tmp_path, CUDA_OOM, "oom.json")])
    hang = node.run_docker("vllm-docker", [*VLLM, scenario(tmp_path, HANG, "hang.json")], max_size=4096, max_file=5)
    units = {"pod": "llm/vllm-0/vllm", "oom": "llm/vllm-oom-7f9c/vllm", "docker": "vllm-docker", "journald": "vllm-journald"}
    seen: list[Scrape] = []

    def scrape() -> Scrape:
        seen.append(Scrape(fetch(port)))
        return seen[-1]

    def verdicts(s: Scrape) -> dict[str, str | None]:
        return {k: s.one_of("unit_verdict", u, "verdict") for k, u in units.items()}

    want = {"pod": "ready", "oom": "failed", "docker": "stalled", "journald": "ready"}
    try:
        wait_for(lambda: verdicts(scrape()) == want, 90, f"{want}")
    except AssertionError as error:
        raise AssertionError(f"{error}; last seen {verdicts(seen[-1])}") from None
    # kubelet restarts the crashed container: a new start of the same unit, which becomes ready
    again = node.restart(oom, [*VLLM, scenario(tmp_path, READY_QUICK, "again.json")])
    final = wait_for(lambda: (s := scrape()).one_of("unit_verdict", units["oom"], "verdict") == "ready" and s, 60,
                     "the restarted container to be ready")

    for key, unit in units.items():
        [info] = final.all("llmstartup_unit_info", unit=unit)
        assert info.labels["engine"] == "vllm", key
        assert info.labels["model"] == "Qwen/Qwen3-8B", key
    labels = final.all("llmstartup_unit_info", unit=units["pod"])[0].labels
    assert (labels["namespace"], labels["pod"], labels["container"]) == ("llm", "vllm-0", "vllm")
    labels = final.all("llmstartup_unit_info", unit="vllm-docker")[0].labels
    assert (labels["namespace"], labels["pod"], labels["container"]) == ("", "", "vllm-docker")

    # the silent compile was silent progress (its CPU, in the container's cgroup), never stalled
    pod_verdicts = [s.one_of("unit_verdict", units["pod"], "verdict") for s in seen]
    assert "silent_progress" in pod_verdicts and "stalled" not in pod_verdicts
    # the compile workers' CPU, read from the container's cgroup (on a loaded machine, of 16 s burnt a part)
    assert final.value("llmstartup_process_cpu_seconds_total", unit=units["pod"]) >= 1
    assert final.value("llmstartup_process_resident_memory_bytes", unit=units["pod"]) > 10 * 2**20
    assert final.value("llmstartup_processes", unit=units["pod"], state="sleeping") >= 1
    for phase in ("loading_weights", "compiling", "capturing_graphs"):
        assert final.value("llmstartup_phase_duration_seconds_count", unit=units["pod"], phase=phase) == 1, phase
    # the crash failed the first start for the reason it printed; the restart is the second start
    assert final.value("llmstartup_failures_total", unit=units["oom"], phase="compiling", reason="cuda_oom") == 1
    assert final.value("llmstartup_startups_total", unit=units["oom"], outcome="failed") == 1
    assert final.value("llmstartup_startups_total", unit=units["oom"], outcome="ready") == 1
    assert again.id != oom.id
    # the hung container's log was rotated while it wrote, and it hangs in the phase it reached
    assert list(hang.directory.glob("*-json.log.*"))
    assert final.one_of("unit_phase", "vllm-docker", "phase") == "compiling"
    assert final.value("llmstartup_source_up", source="containers") == 1
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by .ci/setup (Debian package prometheus)"
    lint = subprocess.run([promtool, "check", "metrics"], input=final.text, capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_a_pod_deleted_while_it_loads_is_stopped_not_failed(node: Node, agent, tmp_path: Path) -> None:
    # kubelet's SIGTERM to every process of the container (a rollout, a scale-down): vLLM's API server raises
    # KeyboardInterrupt("terminated") and exits 0, its EngineCore dies of the signal; no systemd says "Stopping"
    pod = node.run_pod("llm", "vllm-0", "vllm", [*VLLM, scenario(tmp_path, HANG, "hang.json")])
    port = agent(args=("--path.pods", str(node.pods), "--path.docker", str(node.docker)))
    unit = "llm/vllm-0/vllm"
    wait_for(lambda: Scrape(fetch(port)).one_of("unit_phase", unit, "phase") == "compiling", 60, "the pod compiling")
    assert pod.crash(signal.SIGTERM) == 0
    # settled either way: inactive once stopped, failed if the stop were taken for a crash
    final = wait_for(lambda: (s := Scrape(fetch(port))).one_of("unit_phase", unit, "phase") in ("inactive", "failed") and s,
                     60, "the pod's start to settle")
    assert final.value("llmstartup_startups_total", unit=unit, outcome="stopped") == 1
    assert final.all("llmstartup_failures_total", unit=unit) == []
    assert final.one_of("unit_verdict", unit, "verdict") == "inactive"


def test_wait_and_status_for_a_pods_container(node: Node, journald, tmp_path: Path) -> None:
    node.run_pod("llm", "vllm-0", "vllm", [*VLLM, scenario(tmp_path, READY_QUICK, "quick.json")])
    flags = ["--journal.namespace", journald.namespace, "--no-collector.gpu", "--path.pods", str(node.pods),
             "--path.docker", str(node.docker)]

    def llmstartup(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "exporter", *args, *flags], capture_output=True, text=True, timeout=60)

    done = llmstartup("wait", "llm/vllm-0/vllm", "--timeout", "40s")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].endswith(": ready")
    done = llmstartup("status", "--format", "json")
    [doc] = [d for d in json.loads(done.stdout) if d["unit"] == "llm/vllm-0/vllm"]
    assert (doc["namespace"], doc["pod"], doc["container"], doc["phase"]) == ("llm", "vllm-0", "vllm", "ready")
    assert llmstartup("wait", "llm/vllm-1/vllm").returncode == 4  # no such pod


@pytest.mark.parametrize(
    ("state", "want"),
    [
        pytest.param({"ExitCode": 137, "OOMKilled": True}, [(Event.OOM_KILLED, ""), (Event.EXITED, "killed/9/SIG9")],
                     id="OOM killer: 128+9, OOMKilled"),
        pytest.param({"ExitCode": 1}, [(Event.EXITED, "exited/1/FAILURE")], id="a crash"),
        pytest.param({"ExitCode": 0}, [(Event.EXITED, "exited/0/SUCCESS")], id="a clean exit"),
        pytest.param({"Running": True, "Restarting": True, "ExitCode": 1}, [(Event.EXITED, "exited/1/FAILURE")],
                     id="waiting to be restarted: its run has ended"),
        pytest.param({"Running": True}, [], id="running"),
    ],
)
def test_dockers_word_on_how_a_run_ended(tmp_path: Path, state: dict, want: list) -> None:
    directory = tmp_path / "containers" / ID
    directory.mkdir(parents=True)
    config = {"State": {"Running": False, "Restarting": False, "OOMKilled": False, "Pid": 0, "ExitCode": 0,
                        "StartedAt": "2026-11-29T12:00:01.000000001Z", "FinishedAt": "2026-11-29T12:05:00.5Z", **state},
              "ID": ID, "Name": "/vllm", "RestartCount": 0}
    (directory / "config.v2.json").write_text(json.dumps(config))
    (directory / "hostconfig.json").write_text(json.dumps({"LogConfig": {"Type": "journald", "Config": {}}}))
    wall = 1795953900.5 + 100  # FinishedAt + 100 s
    source = ContainerSource(None, tmp_path, wall=lambda: wall, clock=lambda: 100.0)
    assert list(source.containers()) == ["vllm"]
    source.follow(["vllm"])
    got = source.drain()
    assert [(o.event, o.detail) for o in got] == want
    assert all(o.t == pytest.approx(0.0) and o.invocation == "2026-11-29T12:00:01.000000001Z" for o in got)
