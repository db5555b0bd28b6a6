"""Every engine grammar against annotated real-format log lines, one fixture file per version family; the shared
vocabulary (grammar.vocabulary) alone against lines no engine's rules own.

Fixtures live in tests/grammars/<engine>/<family>.log, one directory per grammar in grammar.ENGINES and one for the
vocabulary (tests/grammars/vocabulary/, which never says ready: its lines run up to starting_api). Each
fixture line is `EXPECTATION | RAW LINE`. EXPECTATION is `-` (no rule matches) or space-separated
`key=value` items: `phase=`, `reason=`, `fatal=true`, `heartbeat=true`, `begins=true`, `retry=true`, `stops=true`,
`model=`, `engine_version=`, the fields of a start that spans hosts named as in exporter.core.groups.FIELDS
(`group_address=10.0.0.1:29501`, `nnodes=2`: as the line writes them) and engine values named as in grammar.VALUES, in base units
(`model_weights_bytes=8066163330.2528`); a progress record's report as `progress=DONE/TOTAL` (a fraction is
`progress=0.52/1`), `item=` (what it counts) and `remaining=` (the seconds the engine says are left), each
absent when the report has none. One item
is for the order check alone: `repeat=true` marks a phase marker the engine prints again after a later
phase (SGLang loads a speculative draft model after the target; TRT-LLM's PyTorch backend sizes the KV
cache, autotunes and captures graphs twice). The tracker ignores such a marker, because phases only move
forward; the order check skips it, and checks that it really does go back.
In RAW LINE the escapes `\\r` and `\\x1b` stand for the carriage return and escape characters a journal
record holds. The raw line goes through clean_records, as the journal source does, and the last record
(a `\\r` bar's final redraw) is matched. Lines starting with `#` are comments naming each line's source.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from exporter.core import grammar
from exporter.core.grammar import GROUP, INFO, VALUES, Grammar, GrammarError
from exporter.core.lines import clean_records
from exporter.core.model import STARTUP_ORDER, Phase, Reason

FIXTURES = Path(__file__).parent / "grammars"
SEPARATOR = " | "
SHARED = "vocabulary"
GRAMMARS: dict[str, Grammar] = {**grammar.load_all(), SHARED: grammar.vocabulary()}
KINDS = (*grammar.ENGINES, SHARED)
# Engines whose logs hold no `\r`-redrawn bar at all: TGI's launcher re-logs its shards' output line by
# line, Ollama's daemon and runners log with slog, and the fallback knows no engine.
NO_REDRAW = frozenset({"tgi", "ollama", "generic"})
FLAGS = ("fatal", "heartbeat", "begins", "retry", "stops", "repeat")
PROGRESS = ("progress", "item", "remaining")


@dataclass(frozen=True)
class Expected:
    phase: Phase | None = None
    reason: Reason | None = None
    fatal: bool = False
    heartbeat: bool = False
    begins: bool = False  # the engine's first word: after a settled start, the next begins
    retry: bool = False  # the engine goes on past the failures so far
    stops: bool = False  # the engine says it was asked to stop
    repeat: bool = False  # fixture-only: a marker printed again after a later phase
    info: dict[str, str] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    progress: grammar.Report | None = None
    group: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    engine: str
    where: str  # engine/file:lineno
    raw: str  # decoded: real \r and \x1b characters
    expected: Expected | None  # None: no rule may match


def _expectation(text: str, where: str) -> Expected | None:
    items = text.split()
    if items == ["-"]:
        return None
    if not items or "-" in items:
        raise ValueError(f"{where}: expectation {text!r} is neither `-` nor key=value items")
    seen: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not value or key in seen:
            raise ValueError(f"{where}: bad or repeated item {item!r}")
        if key not in {"phase", "reason", *FLAGS, *PROGRESS} | INFO | GROUP | set(VALUES):
            raise ValueError(f"{where}: unknown key {key!r}")
        seen[key] = value
    for flag in FLAGS:
        if seen.get(flag, "true") != "true":
            raise ValueError(f"{where}: {flag} is only ever `{flag}=true`")
    if "repeat" in seen and "phase" not in seen:
        raise ValueError(f"{where}: `repeat=true` only goes with a phase")
    if ("item" in seen or "remaining" in seen) and "progress" not in seen:
        raise ValueError(f"{where}: `item=` and `remaining=` only go with `progress=`")
    report = None
    if "progress" in seen:
        done, total = (float(n) for n in seen["progress"].split("/"))
        remaining = float(seen["remaining"]) if "remaining" in seen else None
        report = grammar.Report(done, total, seen.get("item", ""), remaining)
    return Expected(
        phase=Phase(seen["phase"]) if "phase" in seen else None,
        reason=Reason(seen["reason"]) if "reason" in seen else None,
        fatal="fatal" in seen,
        heartbeat="heartbeat" in seen,
        begins="begins" in seen,
        retry="retry" in seen,
        stops="stops" in seen,
        repeat="repeat" in seen,
        info={k: v for k, v in seen.items() if k in INFO},
        values={k: float(v) for k, v in seen.items() if k in VALUES},
        progress=report,
        group={k: v for k, v in seen.items() if k in GROUP},
    )


def _decode(raw: str) -> str:
    return raw.replace("\\x1b", "\x1b").replace("\\r", "\r")


def _cases(path: Path) -> list[Case]:
    engine = path.parent.name
    cases = []
    for lineno, line in enumerate(path.read_text("utf-8").splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        where = f"{engine}/{path.name}:{lineno}"
        expectation, sep, raw = line.partition(SEPARATOR)
        if not sep:
            raise ValueError(f"{where}: no {SEPARATOR!r} between expectation and raw line")
        cases.append(Case(engine, where, _decode(raw), _expectation(expectation, where)))
    return cases


FILES = sorted(FIXTURES.glob("*/*.log"))
CASES = {f"{path.parent.name}/{path.name}": _cases(path) for path in FILES}
ALL = [case for cases in CASES.values() for case in cases]


def _record(case: Case) -> str:
    records = clean_records(case.raw)
    assert records, f"{case.where}: the raw line holds no record"
    return records[-1]


def test_every_grammar_has_fixtures_and_every_fixture_a_grammar() -> None:
    directories = {path.name for path in FIXTURES.iterdir() if path.is_dir()}
    assert directories == set(KINDS)
    for engine in KINDS:
        assert any(path.parent.name == engine for path in FILES), f"no fixture file for {engine}"


@pytest.mark.parametrize("case", [pytest.param(c, id=c.where) for c in ALL])
def test_line(case: Case) -> None:
    found = grammar.match(GRAMMARS[case.engine], _record(case))
    expected = case.expected
    if expected is None:
        assert found is None, f"expected no match, got {found}"
        return
    assert found is not None, "expected a match, no rule matched"
    got = (found.phase, found.reason, found.fatal, found.heartbeat, found.begins, found.retry, found.stops)
    assert got == (expected.phase, expected.reason, expected.fatal, expected.heartbeat, expected.begins, expected.retry,
                   expected.stops)
    assert dict(found.info) == expected.info
    assert set(found.values) == set(expected.values)
    assert dict(found.values) == pytest.approx(expected.values)
    assert found.progress == expected.progress
    assert dict(found.group) == expected.group


def _winner(rules: Grammar, record: str) -> int | None:
    """Index of the rule that decides the record: the first one that matches it (a benign rule matches,
    and decides, by reading nothing)."""
    for index, rule in enumerate(rules.rules):
        if rule.benign:
            if rule.pattern.search(record if rule.whole else rules.message(record)):
                return index
        elif grammar.match(dataclasses.replace(rules, rules=(rule,)), record) is not None:
            return index
    return None


@pytest.mark.parametrize("engine", KINDS)
def test_every_rule_decides_some_fixture_line(engine: str) -> None:
    rules = GRAMMARS[engine]
    used = {_winner(rules, _record(case)) for case in ALL if case.engine == engine}
    # the grammar's own rules; the rules of an engine it embeds come after them, and are its engine's to test
    dead = [rule.pattern.pattern for index, rule in enumerate(rules.rules[: rules.own]) if index not in used]
    assert not dead, f"rules no fixture line reaches (dead or shadowed): {dead}"


@pytest.mark.parametrize("name", CASES)
def test_each_file_holds_a_start_failures_and_noise(name: str) -> None:
    cases = CASES[name]
    assert any(c.expected and c.expected.phase is _last(name) for c in cases), f"no {_last(name)} line"
    assert any(c.expected and c.expected.reason for c in cases), "no failure line"
    assert any(c.expected is None for c in cases), "no noise line"


@pytest.mark.parametrize("engine", sorted(set(KINDS) - NO_REDRAW))
def test_each_engine_with_redrawn_bars_has_one(engine: str) -> None:
    assert any(c.engine == engine and len(clean_records(c.raw)) > 1 for c in ALL), "no \\r-redrawn record"


@pytest.mark.parametrize("name", CASES)
def test_start_phases_only_move_forward(name: str) -> None:
    """Up to the first ready line (the vocabulary's starting_api) each file is one start in order: its phases never
    go back."""
    reached: tuple[str, Phase] | None = None
    for case in CASES[name]:
        if not (case.expected and case.expected.phase):
            continue
        phase = case.expected.phase
        if case.expected.repeat:
            assert reached and STARTUP_ORDER.index(phase) < STARTUP_ORDER.index(reached[1]), (
                f"{case.where} is marked repeat=true but does not go back"
            )
            continue
        if reached:
            assert STARTUP_ORDER.index(phase) >= STARTUP_ORDER.index(reached[1]), (
                f"{case.where} ({phase}) comes after {reached[0]} ({reached[1]})"
            )
        reached = (case.where, phase)
        if phase is _last(name):
            return
    pytest.fail(f"no {_last(name)} line")


def _last(name: str) -> Phase:
    """The phase a fixture file's start runs up to: ready, which only an engine says."""
    return Phase.STARTING_API if name.startswith(f"{SHARED}/") else Phase.READY


def _nested_repeat(items: object, inside: bool = False) -> bool:
    """Whether a parsed pattern has a repeat (max > 1) inside another repeat: the shape that backtracks."""
    for op, arg in items:  # type: ignore[attr-defined]
        if op in (re._parser.MAX_REPEAT, re._parser.MIN_REPEAT):  # type: ignore[attr-defined]
            _min, high, sub = arg
            repeats = high > 1
            if (inside and repeats) or _nested_repeat(sub, inside or repeats):
                return True
        elif op is re._parser.SUBPATTERN:  # type: ignore[attr-defined]
            if _nested_repeat(arg[-1], inside):
                return True
        elif op is re._parser.BRANCH:  # type: ignore[attr-defined]
            if any(_nested_repeat(branch, inside) for branch in arg[1]):
                return True
        elif op in (re._parser.ASSERT, re._parser.ASSERT_NOT):  # type: ignore[attr-defined]
            if _nested_repeat(arg[1], inside):
                return True
    return False


@pytest.mark.parametrize("engine", KINDS)
def test_every_regex_is_linear(engine: str) -> None:
    rules = GRAMMARS[engine]
    patterns = [rules.prefix, *rules.commands, *(rule.pattern for rule in rules.rules)]
    parse = re._parser.parse  # type: ignore[attr-defined]
    nested = [p.pattern for p in patterns if p and _nested_repeat(parse(p.pattern))]
    assert not nested, f"nested quantifiers: {nested}"


def test_nested_repeat_check_sees_one() -> None:
    assert _nested_repeat(re._parser.parse(r"(?:a\d+)+b"))  # type: ignore[attr-defined]
    assert _nested_repeat(re._parser.parse(r"(?!(?:a\d+)+)b"))  # type: ignore[attr-defined]
    assert not _nested_repeat(re._parser.parse(r"(?:a\d+)?b"))  # type: ignore[attr-defined]


# ---- which engine a process's command line names ----

ENGINES = tuple(GRAMMARS.values())  # in grammar.ENGINES order, as the agent loads them

DETECT = [
    # vLLM (vllm.toml): the `vllm` entry point and the module path
    ("/usr/bin/python3 /usr/local/bin/vllm serve Qwen/Qwen3-32B --tensor-parallel-size 2", "vllm"),
    ("/usr/bin/python3 -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-8B", "vllm"),
    # vllm.toml takes any command line with a word `vllm`, an install too (vllm.toml's pattern to narrow)
    ("/usr/bin/python3 -m pip install vllm", "vllm"),
    # SGLang: the module, the newer CLI, and the children that retitle themselves (setproctitle)
    ("/usr/bin/python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B --tp 2", "sglang"),
    ("/opt/venv/bin/python3 /opt/venv/bin/sglang serve --model-path Qwen/Qwen3-8B --port 30000", "sglang"),
    ("sglang::scheduler_TP0", "sglang"),
    ("sglang::detokenizer", "sglang"),
    # TGI: the launcher, its Python shards and its router
    ("/usr/local/bin/text-generation-launcher --model-id meta-llama/Meta-Llama-3.1-8B-Instruct", "tgi"),
    ("/opt/conda/bin/python3 /opt/conda/bin/text-generation-server serve /data/llama --port 3000", "tgi"),
    ("text-generation-router --max-concurrent-requests 128 --max-input-tokens 4095 --port 8080", "tgi"),
    # llama.cpp's server and llama-cpp-python's
    ("/opt/llama.cpp/build/bin/llama-server -m /models/qwen2.5-7b-q4_k_m.gguf --port 8080", "llamacpp"),
    ("llama-server -hf bartowski/Qwen_Qwen3-14B-GGUF:Q8_0 --host 0.0.0.0 --port 8080", "llamacpp"),
    ("/usr/bin/python3 -m llama_cpp.server --model /models/llama-3.1-8b.Q4_K_M.gguf", "llamacpp"),
    # Ollama: the daemon, and the runners it starts per model (C++ runner, Go runner, 2026's llama-server);
    # a `llama-server` under an ollama directory is Ollama's runner, not llama.cpp's server
    ("/usr/local/bin/ollama serve", "ollama"),
    ("/usr/local/bin/ollama runner --ollama-engine --model /root/.ollama/models/blobs/sha256-797b", "ollama"),
    ("/tmp/ollama319793/runners/cuda_v12/ollama_llama_server --model /root/.ollama/b --port 3897", "ollama"),
    ("/usr/lib/ollama/llama-server --model /root/.ollama/models/blobs/sha256-dde5 --port 41235", "ollama"),
    # Triton (also under mpirun for TensorRT-LLM) and trtllm-serve
    ("/opt/tritonserver/bin/tritonserver --model-repository=/models --http-port 8000", "triton"),
    ("mpirun --allow-run-as-root -n 2 /opt/tritonserver/bin/tritonserver --model-repository=/repo", "triton"),
    ("/usr/bin/python3 /usr/local/bin/trtllm-serve Qwen/Qwen3-8B --backend pytorch --port 8000", "triton"),
    # not model servers: editors, installers, clients, benchmarks, other tools of the same projects
    ("vim sglang_notes.txt", None),
    ("/usr/bin/python3 -m pip install 'sglang[all]'", None),
    ("/usr/bin/python3 -m sglang.bench_serving --backend sglang --num-prompts 100", None),
    ("ollama run llama3.1", None),
    ("/usr/local/bin/ollama pull llama3.1:70b", None),
    ("llama-cli -m /models/qwen2.5-7b-instruct-q4_k_m.gguf -p hello", None),
    ("/usr/local/bin/llama-server-wrapper.sh --port 8080", None),
    ("tail -f /var/log/tritonserver.log", None),
    ("/usr/bin/python3 -m pip install text-generation", None),
    # a container client: the server's processes live in the container's cgroup, not in this unit's,
    # so the unit's CPU, I/O and GPU evidence would say nothing; name the engine with --unit NAME=ENGINE
    ("/usr/bin/docker run --gpus all ghcr.io/huggingface/text-generation-inference:3.3.7 --model-id x", None),
    ("/usr/bin/podman run --device nvidia.com/gpu=all docker.io/vllm/vllm-openai:latest --model x", None),
]


@pytest.mark.parametrize("cmdline, engine", DETECT, ids=[c for c, _ in DETECT])
def test_detect(cmdline: str, engine: str | None) -> None:
    assert grammar.detect(ENGINES, cmdline) == engine


def test_detect_first_grammar_wins() -> None:
    """A command line two grammars claim goes to the first: vLLM serving a model from a dir `llama-server`."""
    both = "/usr/bin/python3 /usr/local/bin/vllm serve /models/llama-server --port 8000"
    assert grammar.detect((GRAMMARS["vllm"], GRAMMARS["llamacpp"]), both) == "vllm"
    assert grammar.detect((GRAMMARS["llamacpp"], GRAMMARS["vllm"]), both) == "llamacpp"
    assert grammar.detect(ENGINES, both) == "vllm"


def test_the_fallback_claims_no_process() -> None:
    assert grammar.ENGINES[-1] == "generic"
    assert GRAMMARS["generic"].commands == ()
    assert all(grammar.detect((GRAMMARS["generic"],), cmdline) is None for cmdline, _ in DETECT)
    assert all(GRAMMARS[engine].commands for engine in grammar.ENGINES if engine != "generic")


def test_an_embedded_engines_first_word_begins_no_start() -> None:
    """Triton runs vLLM: vLLM's first word, embedded, is a part of Triton's start, not the next one."""
    embedded = [
        rule
        for outer in GRAMMARS.values()
        for rule in outer.rules[outer.own:]
        if any(rule.pattern == r.pattern and r.begins for name in outer.embeds for r in GRAMMARS[name].rules)
    ]
    assert embedded, "no engine embeds another's first word: nothing to check"
    assert not any(rule.begins for rule in embedded)


# ---- grammar files that do not load ----


def test_parse_takes_a_minimal_grammar() -> None:
    parsed = grammar.parse("mini", "[[rule]]\nmatch = '''ready'''\nphase = \"ready\"\n")
    assert [r.phase for r in parsed.rules] == [Phase.READY]


def test_load_names_the_known_engines() -> None:
    with pytest.raises(GrammarError, match="no grammar for engine 'nope'; known: vllm, sglang"):
        grammar.load("nope")


@pytest.mark.parametrize(
    "text, says",
    [
        pytest.param("[[rule]]\nmatch = '''(unclosed'''\n", "missing ), unterminated subpattern", id="bad regex"),
        pytest.param("prefix = '''(?P<msg>.*'''\n", "missing ), unterminated subpattern", id="bad prefix"),
        pytest.param("commands = ['''(vllm''']\n", "missing ), unterminated subpattern", id="bad command"),
        pytest.param(
            "[[rule]]\nmatch = '''x'''\nphase = \"warp_speed\"\n",
            "'warp_speed' is not a valid Phase",
            id="unknown phase",
        ),
        pytest.param(
            "[[rule]]\nmatch = '''x'''\nreason = \"gremlins\"\n",
            "'gremlins' is not a valid Reason",
            id="unknown reason",
        ),
        pytest.param(
            "[[rule]]\nmatch = '''took (?P<bogus_bytes__gib>[\\d.]+) GiB'''\n",
            "group 'bogus_bytes__gib' is no known value",
            id="unknown value group",
        ),
        pytest.param(
            "[[rule]]\nmatch = '''took (?P<model_weights_bytes__tib>[\\d.]+) TiB'''\n",
            "group 'model_weights_bytes__tib' is no known value",
            id="unknown unit",
        ),
        pytest.param(
            "[[rule]]\nmatch = '''(?P<progress_done__count>\\d+) shards'''\n",
            "progress_done in count or size needs progress_total",
            id="a count of progress without its total",
        ),
        pytest.param(
            "[[rule]]\nmatch = '''(?P<progress_done__fraction>\\d) of (?P<progress_total__count>\\d+)'''\n",
            "progress_done in count or size needs progress_total, and only those do",
            id="a fraction of progress with a total",
        ),
        pytest.param(
            "[[rule]]\nmatch = '''ETA (?P<progress_remaining__clock>[\\d:]+)'''\n",
            "progress groups without progress_done",
            id="a remaining time without progress",
        ),
        pytest.param(
            "[[rule]]\nmatch = '''ETA (?P<progress_remaining__days>\\d+)'''\n",
            "group 'progress_remaining__days' is no known value",
            id="progress in an unknown unit",
        ),
        pytest.param(
            "[[rule]]\nmatch = '''(?P<progress_done__fraction>\\d)'''\ncomplete = true\n",
            "a complete rule reads no progress groups",
            id="complete and read as well",
        ),
        pytest.param(
            "[[rule]]\nmatch = '''loading'''\nitem = \"shard\"\n",
            "`item` names what a progress rule counts",
            id="an item without progress",
        ),
        pytest.param("[[silent]]\nphase = \"capturing_graphs\"\nafter = [\"starting_api\"]\n",
                     "capturing_graphs must be a startup phase after every phase in `after`",
                     id="a silent phase said to follow a later one"),
        pytest.param("[[silent]]\nphase = \"capturing_graphs\"\n", "silent phase 1: 'after'",
                     id="a silent phase after nothing"),
        pytest.param("[[silent]]\nphase = \"capturing_graphs\"\nafter = [\"allocating_kv_cache\"]\nunless = '(x'\n",
                     "silent phase 1: missing )", id="a silent phase's bad unless"),
        pytest.param("[[rule]]\nphase = \"ready\"\n", "rule 1 has no `match`", id="rule without match"),
        pytest.param("[[rule]\nmatch = 'x'\n", "line 1", id="bad toml"),
    ],
)
def test_parse_rejects_with_a_clear_message(text: str, says: str) -> None:
    with pytest.raises(GrammarError) as error:
        grammar.parse("broken", text)
    assert str(error.value).startswith("grammar broken: ")
    assert says in str(error.value)


@pytest.mark.parametrize(
    ("fixture", "text", "skips"),
    [
        pytest.param("v1-0.32-cpu.log", "Initializing a V1 LLM engine", {Phase.CAPTURING_GRAPHS},
                     id="the CPU build's config: cudagraph_mode NONE"),
        pytest.param("v1-0.32-cpu.log", "Enforce eager set", {Phase.CAPTURING_GRAPHS}, id="--enforce-eager's warning"),
        pytest.param("v1-0.33.log", "Initializing a V1 LLM engine", set(),
                     id="a GPU config with CUDA graphs: capture follows the KV cache"),
    ],
)
def test_a_start_says_at_launch_which_silent_phases_it_skips(fixture: str, text: str, skips: set[Phase]) -> None:
    """vLLM captures CUDA graphs after the KV cache, silently, unless its launching lines say it will not."""
    raw = next(c.raw for c in CASES[f"vllm/{fixture}"] if text in c.raw)
    assert grammar.skipped(GRAMMARS["vllm"], raw) == skips
