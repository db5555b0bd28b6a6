"""A start that spans hosts: its group from command lines (exporter/grammars/launch.toml) and lines, folded per start."""

from __future__ import annotations

import functools

import pytest

from exporter.core import grammar, groups
from exporter.core.model import Group, Launched, LogLine, Phase, ProcessSample, UnitState
from exporter.core.tracker import advance
from tests.test_tracker import LIMITS

VLLM, SGLANG = grammar.load("vllm"), grammar.load("sglang")
U = "vllm.service"


@pytest.mark.parametrize(
    ("cmdlines", "want"),
    [
        pytest.param([("/opt/vllm/bin/python3 /opt/vllm/bin/vllm serve zai-org/GLM-5-FP8 --tensor-parallel-size 16 --nnodes 2 "
                      "--node-rank 0 --master-addr 10.0.0.1 --master-port 29501")],
                     Group("10.0.0.1:29501", 2, 0), id="vLLM's head host"),
        pytest.param([("/opt/vllm/bin/python3 /opt/vllm/bin/vllm serve zai-org/GLM-5-FP8 --tensor-parallel-size 16 --nnodes=2 "
                      "--node_rank=1 --master_addr=node0 --headless"), "VLLM::Worker_TP8", "VLLM::Worker_TP9"],
                     Group("node0", 2, 1), id="a worker host: = and _ spellings, the port left to its default"),
        pytest.param([("/usr/bin/python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 16 "
                      "--dist-init-addr 10.0.0.1:5000 --nnodes 2 --node-rank 1"), "sglang::scheduler_TP8"],
                     Group("10.0.0.1:5000", 2, 1), id="SGLang"),
        pytest.param([("/usr/bin/python3 /usr/local/bin/torchrun --nnodes=4 --node-rank=3 --nproc-per-node=8 "
                      "--master-addr=10.0.0.1 --master-port=29500 serve.py")],
                     Group("10.0.0.1:29500", 4, 3), id="torchrun"),
        pytest.param([("/usr/bin/python3 /usr/local/bin/torchrun --nnodes=1:4 --nproc-per-node=8 --rdzv-backend=c10d "
                      "--rdzv-endpoint=10.0.0.1:29400 serve.py")],
                     Group("10.0.0.1:29400"), id="torchrun elastic: a range of hosts is no count"),
        pytest.param(["/bin/bash -c MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NNODES=2 NODE_RANK=1 exec python serve.py",
                      "python serve.py"],
                     Group("10.0.0.1:29500", 2, 1), id="the environment where a command line sets it"),
        pytest.param(["/usr/bin/nice -n 10 /opt/vllm/bin/vllm serve Qwen/Qwen3-8B -r 3"], Group(),
                     id="short options are not read: -n is nice's"),
        pytest.param(["/opt/vllm/bin/vllm serve Qwen/Qwen3-8B --tensor-parallel-size 8"], Group(), id="one host: nothing"),
        pytest.param([], Group(), id="no process left to read"),
    ],
)
def test_command_lines(cmdlines: list[str], want: Group) -> None:
    assert groups.launched(grammar.launch_flags(), cmdlines) == want


@pytest.mark.parametrize(
    ("group", "hosts", "spans"),
    [
        pytest.param(Group("10.0.0.1:29501", 2, 1), 2, True, id="said"),
        pytest.param(Group("10.0.0.1:29501", world_size=16, local_world_size=8), 2, True, id="ranks over this host's"),
        pytest.param(Group("10.0.0.1:29501", world_size=16, local_world_size=5), None, False, id="ranks that do not divide"),
        pytest.param(Group("127.0.0.1:41227"), None, False, id="a rendezvous alone: one host, or not known"),
        pytest.param(Group(None, 2, 1), 2, False, id="no meeting place: no group to join"),
        pytest.param(Group("10.0.0.1:29501", 1, 0), 1, False, id="one host"),
    ],
)
def test_how_many_hosts(group: Group, hosts: int | None, spans: bool) -> None:
    assert (group.hosts, group.spans_hosts) == (hosts, spans)


def test_a_line_reads_the_address_less_its_scheme() -> None:
    assert groups.read({"group_address": "tcp://10.0.0.1:29501/"}) == Group("10.0.0.1:29501")
    assert groups.read({"group_host": "node0"}) == Group("node0")
    assert groups.read({"nnodes": "2", "node_rank": "x"}) == Group(None, 2)


WORLD = "(Worker pid=3301) INFO 06-19 15:35:18 [parallel_state.py:1906] world_size=16 rank=8 local_rank=0 " \
        "distributed_init_method=tcp://{} backend=nccl"
HEAD = "vllm serve zai-org/GLM-5-FP8 --nnodes 2 --node-rank 1 --master-addr {}"


def fold(*observations: object, grammar_: grammar.Grammar = VLLM) -> UnitState:
    return functools.reduce(lambda s, o: advance(s, o, grammar_, LIMITS), observations, UnitState(U))


def started(t: float) -> ProcessSample:
    return ProcessSample(t, U, frozenset({(100 + int(t), t)}), 0.0, 0, 0, 0, started_at=t)


def launched(t: float, cmdline: str) -> Launched:
    return Launched(t, U, groups.launched(grammar.launch_flags(), [cmdline]))


@pytest.mark.parametrize(
    ("observations", "want"),
    [
        pytest.param([started(0), launched(0, HEAD.format("10.0.0.1"))], Group("10.0.0.1", 2, 1), id="the command line"),
        pytest.param([started(0), LogLine(1, U, WORLD.format("10.0.0.1:29501"))], Group("10.0.0.1:29501"),
                     id="a line alone: where, not how many"),
        pytest.param([started(0), launched(0, HEAD.format("10.0.0.1")), LogLine(1, U, WORLD.format("10.0.0.1:29501"))],
                     Group("10.0.0.1", 2, 1), id="the command line's address stays: every host names the group alike"),
        pytest.param([started(0), LogLine(1, U, WORLD.format("10.0.0.1:29501")), launched(2, HEAD.format("10.0.0.1"))],
                     Group("10.0.0.1", 2, 1), id="read after a line, the command line still decides"),
        pytest.param([started(0), launched(0, HEAD.format("10.0.0.1")), started(50)], None,
                     id="the next start has its own group"),
        pytest.param([launched(0, HEAD.format("10.0.0.1"))], None, id="no start to belong to"),
    ],
)
def test_a_starts_group(observations: list[object], want: Group | None) -> None:
    state = fold(*observations)
    assert (state.attempt.group if state.attempt else None) == want


def test_sglang_says_its_group_in_its_arguments() -> None:
    args = ("[2026-02-26 05:19:58] server_args=ServerArgs(model_path='deepseek-ai/DeepSeek-V3', tp_size=16, "
            "dist_init_addr='10.0.0.1:5000', nnodes=2, node_rank=1, nccl_port=None)")
    state = fold(started(0), LogLine(1, U, args), grammar_=SGLANG)
    assert state.attempt.group == Group("10.0.0.1:5000", 2, 1)
    assert state.phase is Phase.LAUNCHING and state.info["model"] == "deepseek-ai/DeepSeek-V3"
