"""Engine grammars: regex rules loaded from a data file per engine, matched against one record."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from exporter.core.entries import SPAWN
from exporter.core.groups import FIELDS as GROUP
from exporter.core.model import REASON_DETAIL, STARTUP_ORDER, Phase, Reason, frozen_map
from exporter.core.screen import Screen, any_pattern

# The grammar files, shipped in the package (exporter/grammars/), read by their path: importlib.resources
# would import zipfile and tempfile, for packages installed as zips (this one is a folder), 0.4 MiB of the
# agent's memory.
GRAMMARS = Path(__file__).resolve().parent.parent / "grammars"

# Engine-reported values a grammar may extract, with their help text. A rule names one in a group
# as `<value>__<unit>`, e.g. `(?P<model_weights_bytes__gib>[\d.]+)`; the unit scales it to base units.
VALUES: Mapping[str, str] = frozen_map(
    {
        "model_weights_bytes": "GPU memory the model weights take per rank, as the engine reports it.",
        "kv_cache_tokens": "Tokens the KV cache holds, as the engine reports it.",
        "kv_cache_memory_bytes": "Memory set aside for the KV cache per rank, as the engine reports it.",
        "graph_memory_bytes": "Memory the CUDA graphs take, as the engine reports it.",
        "max_model_len_tokens": "The context length the engine serves.",
        "engine_weights_load_seconds": "Seconds the engine says loading the weights took.",
        "engine_compile_seconds": "Seconds the engine says torch.compile took.",
        "engine_graph_capture_seconds": "Seconds the engine says CUDA-graph capture took.",
        "engine_init_seconds": "Seconds the engine says its init (profile, KV cache, warm-up) took.",
    }
)
INFO = frozenset({"engine_version", "model"})
SCALES: Mapping[str, float] = frozen_map(
    # vLLM ≤0.7 prints "GB" for a value it computed in GiB, so GB scales as GiB.
    {"gib": 2.0**30, "gb": 2.0**30, "mib": 2.0**20, "s": 1.0, "count": 1.0}
)


# The progress an engine reports of its current phase's work (a shard bar, a count of files downloaded, a
# fraction loaded): a rule names its parts in groups `progress_<part>__<unit>`, each with the units it
# may be read in. `count` is a plain number, `size` tqdm's scaled one (`2.20G`), `fraction` 0–1 and
# `percent` 0–100 stand alone (the whole is 1), `clock` is tqdm's and timedelta's `[H:]MM:SS`.
PROGRESS: Mapping[str, frozenset[str]] = frozen_map(
    {
        "progress_done": frozenset({"count", "size", "fraction", "percent"}),
        "progress_total": frozenset({"count", "size"}),
        "progress_remaining": frozenset({"s", "clock"}),
    }
)
WHOLE = frozenset({"fraction", "percent"})  # units of a done that needs no total
SIZE_PREFIXES = " kMGTPEZY"  # tqdm's format_sizeof, unit_scale=True (divisor 1000)


class GrammarError(ValueError):
    """A grammar file that does not load; names the file and the rule."""


@dataclass(frozen=True, slots=True)
class Rule:
    pattern: re.Pattern[str]
    phase: Phase | None = None
    reason: Reason | None = None
    fatal: bool = False  # the engine gives up here, whether or not its processes exit yet
    heartbeat: bool = False  # printed on a timer whatever happens (TGI's "Waiting for shard"): no progress
    cache: str | None = None  # "cold" or "warm": whether the engine compiles or reuses a compile cache
    # The phase says where the start was (a traceback's frame, a worker's tag), not that it went on.
    where: bool = False
    # The engine prints this once, as its process starts (vLLM's `vLLM API server version`, Ollama's
    # `server config`): after a start that has settled, it is the next start, in a log that holds
    # several with nothing else between them (`docker logs` of a container that restarted, a plain file).
    begins: bool = False
    # The engine goes on after the failures it printed so far (Ollama's `model layout did not fit, applying
    # backoff`: it loads again with fewer layers on the GPU): they no longer explain how the start ends.
    retry: bool = False
    # The engine says it was asked to stop (Python's KeyboardInterrupt, which vLLM raises on SIGTERM too;
    # Triton's `Signal (15) received.`; an Ollama client that gave up on the load): a start under way is
    # stopped, unless a failure it printed is pending, which the stop only ends. A start that is ready stays
    # ready: the stop only says the traceback before it was its own.
    stops: bool = False
    # A line in a failure's words that is no failure (NCCL's warnings): it stops the search, so that no
    # failure rule after it reads it.
    benign: bool = False
    # The first line of a report whose last line names the cause (a traceback's header): its reason holds only
    # until that line, which replaces it whatever it says (`RuntimeError: Engine core initialization failed`
    # with no root cause above is engine_init, not a crash).
    opens: bool = False
    # Searched in the whole record, the engine's own prefix included: a worker's tag in that prefix
    # (vLLM's `(VllmWorker rank=1 pid=…)`) is itself a marker.
    whole: bool = False
    # An embedded engine's rule is searched after that engine's own prefix; None: the grammar's.
    prefix: re.Pattern[str] | None = None
    # An embedded engine's version and model are not the outer engine's (an Ollama runner's llama.cpp
    # build): only the grammar's own rules read them.
    reads_info: bool = True
    item: str = ""  # what its progress groups count, singular ("shard", "file", "byte"); "" for a fraction
    complete: bool = False  # the record says the phase's counted work is all done (llama.cpp's load dots)
    shared: bool = False  # the shared vocabulary's (vocabulary.toml), not the engine's own


@dataclass(frozen=True, slots=True)
class Report:
    """One progress record of an engine: how much of what it counts is done, of how much, and what it
    says is left. A fraction is `done` of a `total` of 1."""

    done: float
    total: float
    item: str = ""  # what is counted, singular; "" for a fraction
    remaining: float | None = None  # the engine's own estimate of the seconds left (tqdm's `<remaining`)


@dataclass(frozen=True, slots=True)
class Match:
    phase: Phase | None = None
    reason: Reason | None = None
    fatal: bool = False
    heartbeat: bool = False
    cache: str | None = None
    info: Mapping[str, str] = field(default_factory=frozen_map)
    values: Mapping[str, float] = field(default_factory=frozen_map)
    progress: Report | None = None
    where: bool = False
    begins: bool = False
    retry: bool = False
    stops: bool = False
    group: Mapping[str, str] = field(default_factory=frozen_map)  # the hosts the start spans (exporter.core.groups)
    shared: bool = False  # read by the shared vocabulary: no evidence of which engine it is
    opens: bool = False  # a report's first line: its reason is the report's last line's (Rule.opens)

    @property
    def moves_on(self) -> bool:
        """The line shows the start going on: a phase marker that is no part of a failure's report."""
        return self.phase is not None and self.reason is None and not self.where

    @property
    def outlives(self) -> bool:
        """The start went on past any cause it printed before: an engine's own phase marker. The shared vocabulary
        places a line, but its words in a traceback's tail or a note pasted under it prove no progress."""
        return self.moves_on and not self.shared


@dataclass(frozen=True, slots=True)
class Silent:
    """A phase the engine goes through without a line while it runs (its bar redraws with \r, and journald
    passes a record on only at a newline): a start that falls silent after one of the phases `after` is in it,
    unless a launching line of the start said it goes without it (`unless`: eager mode, no CUDA graphs)."""

    phase: Phase
    after: frozenset[Phase]
    unless: re.Pattern[str] | None = None


@dataclass(frozen=True, slots=True)
class Layout:
    """A time the engine prints at the head of its own lines, by which a saved log is dated
    (exporter.core.formats.clock): named groups year (absent: the log's year), month, day, hour, minute, second,
    fraction and zone (absent: the log's zone)."""

    pattern: re.Pattern[bytes]
    # The head is the engine's alone, and looks like a journal's or a container runtime's prefix (TGI's
    # `TIME  LEVEL target: `, journalctl's `TIME host ident: ` where a page collapsed two spaces into one).
    own: bool = False


TIME_PARTS = frozenset({"year", "month", "day", "hour", "minute", "second", "fraction", "zone"})


@dataclass(frozen=True)  # not slots: `screen` is cached on the instance
class Grammar:
    engine: str
    commands: tuple[re.Pattern[str], ...]  # searched in a process's command line
    prefix: re.Pattern[str] | None  # strips the engine's own line prefix; group `msg` is the rest
    rules: tuple[Rule, ...]
    settings: tuple[re.Pattern[str], ...] = ()  # the line(s) where the engine prints its settings
    # Where a log names the engine (its paths, loggers, process tags, syslog identifier): evidence for
    # choosing it, never a marker.
    mentions: re.Pattern[str] | None = None
    # Engines this one runs inside it, whose lines its logs carry (Ollama runs llama.cpp, Triton vLLM);
    # their rules follow this grammar's own (`own` of them), never fatal nor ready (load()).
    embeds: tuple[str, ...] = ()
    own: int = 0
    silent: tuple[Silent, ...] = ()  # phases it goes through without a line, in the order it goes through them
    times: tuple[Layout, ...] = ()

    @functools.cached_property
    def fixed_matches(self) -> tuple[Match | None, ...]:
        """For each rule that reads no value, the Match it always gives; None for the others."""
        return tuple(None if r.pattern.groupindex else Match(r.phase, r.reason, r.fatal, r.heartbeat, r.cache,
                                                             progress=Report(1.0, 1.0, r.item) if r.complete else None,
                                                             where=r.where, begins=r.begins, retry=r.retry,
                                                             stops=r.stops, shared=r.shared, opens=r.opens)
                     for r in self.rules)

    @functools.cached_property
    def screen(self) -> Screen:
        """Which rules (indices 0…) and settings patterns (after them) might match a record's bytes."""
        return Screen([r.pattern for r in self.rules] + list(self.settings))

    @functools.cached_property
    def own_screen(self) -> Screen:
        """Which of the engine's own rules (and its embedded engines') might match: not the shared vocabulary's."""
        return Screen([r.pattern for r in self.rules if not r.shared])

    def message(self, record: str) -> str:
        """The record after the engine's own prefix: what rules and settings patterns are searched in."""
        return _after(self.prefix, record) if self.prefix else record

    def candidates(self, record: str) -> tuple[int, ...]:
        # surrogatepass: a lone surrogate (never from the journal, which is decoded with "replace")
        # becomes non-ASCII bytes, which pass the screen, rather than an error
        return self.screen.candidates(record.encode("utf-8", "surrogatepass"))


def parse(engine: str, text: str) -> Grammar:
    """Build a grammar from the text of its TOML file; every mistake is a GrammarError."""
    try:
        data = tomllib.loads(text)
        prefix = data.get("prefix")
        return Grammar(
            engine=engine,
            commands=tuple(re.compile(c) for c in data.get("commands", [])),
            prefix=re.compile(prefix) if prefix else None,
            rules=(rules := tuple(_rule(n, r) for n, r in enumerate(data.get("rule", []), 1))),
            own=len(rules),
            settings=tuple(re.compile(p) for p in data.get("settings", [])),
            mentions=re.compile("|".join(data["mentions"])) if data.get("mentions") else None,
            embeds=tuple(data.get("embeds", [])),
            silent=tuple(_silent(n, raw) for n, raw in enumerate(data.get("silent", []), 1)),
            times=tuple(_layout(n, t) for n, t in enumerate(data.get("time", []), 1)),
        )
    except (tomllib.TOMLDecodeError, re.error, ValueError, KeyError) as error:
        raise GrammarError(f"grammar {engine}: {error}") from error


def _rule(number: int, raw: Mapping[str, object]) -> Rule:
    label = f"rule {number} ({str(raw.get('match', ''))[:60]!r})"
    if "match" not in raw:
        raise ValueError(f"rule {number} has no `match`")
    try:
        pattern = re.compile(str(raw["match"]))
        phase, reason = raw.get("phase"), raw.get("reason")
        rule = Rule(
            pattern=pattern,
            phase=Phase(phase) if phase else None,
            reason=Reason(reason) if reason else None,
            fatal=bool(raw.get("fatal", False)),
            heartbeat=bool(raw.get("heartbeat", False)),
            cache=_cache(raw.get("cache")),
            where=bool(raw.get("where", False)),
            begins=bool(raw.get("begins", False)),
            retry=bool(raw.get("retry", False)),
            stops=bool(raw.get("stops", False)),
            benign=bool(raw.get("benign", False)),
            opens=bool(raw.get("opens", False)),
            whole=bool(raw.get("whole", False)),
            item=str(raw.get("item", "")),
            complete=bool(raw.get("complete", False)),
        )
    except (re.error, ValueError) as error:
        raise ValueError(f"{label}: {error}") from None
    if rule.retry and rule.reason:
        raise ValueError(f"{label}: a rule that says the engine goes on past its failures names none")
    if rule.opens and not rule.reason:
        raise ValueError(f"{label}: a rule that opens a failure's report names its reason until the report does")
    if rule.stops and (rule.reason or rule.phase or rule.retry or rule.begins):
        raise ValueError(f"{label}: a rule that says the engine was asked to stop says nothing else")
    if rule.benign and (rule.phase or rule.reason or rule.heartbeat or rule.retry or rule.stops or rule.cache
                        or pattern.groupindex):
        raise ValueError(f"{label}: a benign rule reads nothing from the line")
    if rule.begins and (rule.reason or rule.heartbeat or rule.where or (rule.phase not in (None, Phase.LAUNCHING))):
        raise ValueError(f"{label}: a rule that begins a start is the engine's first word, launching at most")
    progress = {}
    for group in pattern.groupindex:
        name, _, unit = group.partition("__")
        if name in PROGRESS and unit in PROGRESS[name]:
            progress[name] = unit
        elif group not in INFO and group not in GROUP and (name not in VALUES or unit not in SCALES):
            raise ValueError(f"{label}: group {group!r} is no known value")
    if progress and "progress_done" not in progress:
        raise ValueError(f"{label}: progress groups without progress_done")
    if "progress_done" in progress and (progress["progress_done"] in WHOLE) == ("progress_total" in progress):
        raise ValueError(f"{label}: progress_done in count or size needs progress_total, and only those do")
    if rule.complete and progress:
        raise ValueError(f"{label}: a complete rule reads no progress groups")
    if rule.item and not (progress or rule.complete):
        raise ValueError(f"{label}: `item` names what a progress rule counts; this one reads no progress")
    return rule


def _silent(number: int, raw: Mapping[str, object]) -> Silent:
    label = f"silent phase {number}"
    try:
        phase = Phase(str(raw["phase"]))
        after = frozenset(Phase(str(p)) for p in raw["after"])  # type: ignore[attr-defined]
        unless = re.compile(str(raw["unless"])) if raw.get("unless") else None
    except (re.error, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{label}: {error}") from None
    order = list(Phase)
    if phase not in STARTUP_ORDER[1:-1] or not after or any(order.index(p) >= order.index(phase) for p in after):
        raise ValueError(f"{label}: {phase} must be a startup phase after every phase in `after`")
    return Silent(phase, after, unless)


def skipped(grammar: Grammar, record: str) -> frozenset[Phase]:
    """The silent phases a launching line says the start goes without (vLLM's config: enforce_eager=True)."""
    message = grammar.message(record)
    return frozenset(s.phase for s in grammar.silent if s.unless is not None and s.unless.search(message))


def _layout(number: int, raw: Mapping[str, object]) -> Layout:
    pattern = re.compile(str(raw.get("match", "")).encode())
    if not {"month", "day", "hour", "minute", "second"} <= set(pattern.groupindex) <= TIME_PARTS:
        raise ValueError(f"time {number}: groups {sorted(pattern.groupindex)} are not a time's")
    return Layout(pattern, bool(raw.get("own", False)))


def _cache(value: object) -> str | None:
    if value not in (None, "cold", "warm"):
        raise ValueError(f"cache must be cold or warm, not {value!r}")
    return str(value) if value else None


@functools.cache  # a Grammar is immutable; its screen is built once, for every reader of it
def load(engine: str) -> Grammar:
    """The grammar shipped in exporter/grammars/<engine>.toml, with the rules of the engines it embeds, then the
    shared vocabulary's (`vocabulary`).

    An embedded engine's lines say where its part of the start is and why it fails, but not whether
    the whole is ready or has given up: the outer engine says that (an Ollama runner's failure leaves
    the daemon serving), so its ready rules are left out and its fatal ones are not fatal here; nor
    does its first word begin a start (a runner's llama.cpp `build:` line is a model load, not the daemon
    starting again).
    """
    try:
        text = (GRAMMARS / f"{engine}.toml").read_text("utf-8")
    except FileNotFoundError:
        raise GrammarError(f"no grammar for engine {engine!r}; known: {', '.join(ENGINES)}") from None
    outer = parse(engine, text)
    embedded = []
    for name in outer.embeds:
        inner = load(name)
        embedded += [dataclasses.replace(rule, fatal=False, begins=False, prefix=rule.prefix or inner.prefix,
                                         reads_info=False)
                     for rule in inner.rules
                     if _says_more_than_info(rule) and rule.phase is not Phase.READY and not rule.shared]
    return dataclasses.replace(outer, rules=outer.rules + tuple(embedded) + vocabulary().rules)


@functools.cache
def vocabulary() -> Grammar:
    """The shared vocabulary (exporter/grammars/vocabulary.toml), alone: what any engine's lines say of a start in
    words no engine owns. No engine's: `load` puts its rules under every engine's own."""
    shared = parse("vocabulary", (GRAMMARS / "vocabulary.toml").read_text("utf-8"))
    return dataclasses.replace(shared, rules=tuple(dataclasses.replace(rule, shared=True) for rule in shared.rules))


def _says_more_than_info(rule: Rule) -> bool:
    said = rule.phase or rule.reason or rule.heartbeat or rule.retry or rule.stops or rule.benign
    return bool(said or set(rule.pattern.groupindex) - INFO)


# The agent loads the grammars in this order and detect() tries them in it: the first whose command
# pattern matches names the engine. `generic` claims no process: it is for a unit whose engine is unknown.
ENGINES = ("vllm", "sglang", "tgi", "llamacpp", "ollama", "triton", "generic")


@functools.cache
def launch_flags() -> tuple[re.Pattern[str], ...]:
    """The command-line flags that say a start spans hosts (exporter/grammars/launch.toml), each reading
    the fields of exporter.core.groups by its named groups; a GrammarError names a bad one."""
    text = (GRAMMARS / "launch.toml").read_text("utf-8")
    try:
        flags = tuple(re.compile(p) for p in tomllib.loads(text)["flags"])
    except (tomllib.TOMLDecodeError, re.error, KeyError) as error:
        raise GrammarError(f"launch.toml: {error}") from error
    for flag in flags:
        if not flag.groupindex or not set(flag.groupindex) <= GROUP:
            raise GrammarError(f"launch.toml: flag {flag.pattern!r} reads no field, or one not in {sorted(GROUP)}")
    return flags


def load_all() -> Mapping[str, Grammar]:
    """Every shipped grammar by engine, in ENGINES order: the one place the grammars are loaded from."""
    return frozen_map({engine: load(engine) for engine in ENGINES})


@functools.cache
def worth_folding() -> bytes:
    """The pattern of an AnyOf (exporter.core.screen) that says whether a unit's raw MESSAGE might tell its fold
    more than its time: any rule or settings pattern of any engine (a unit's engine may be named after its
    lines are read), or systemd's word, from the unit's own cgroup, that it could not run the command. A line
    it rules out only moves the last-log time on: the skims of the journal (the reader child's, replay's) hand
    over few of them. Not a benign rule's: a line it matches is one no rule reads, as a line no rule matches is.
    Bytes, not compiled: the agent sends it to its reader child."""
    loaded = load_all().values()
    # once each: the shared vocabulary is under every engine
    patterns = {p.pattern: p for g in loaded for p in (*(r.pattern for r in g.rules if not r.benign), *g.settings)}
    return any_pattern([*patterns.values(), SPAWN], raw=True)


def match(grammar: Grammar, record: str, settled: bool = False, own: bool = False) -> Match | None:
    """The first rule that matches the record (after the engine's prefix), with its values.

    `settled`: the start is ready, failed or stopping, so no phase marker can change anything; only
    failures, heartbeats, stops and the engine's first word (which begins the next start) are tried. Failures
    come first in every grammar, so the first match among them is the first match among all. Serving a
    model prints far more lines than starting it: this, and the screen that rules out at once every rule
    whose literals the record lacks (exporter.core.screen), is what keeps those lines cheap. `own`: the engine's
    rules (and those of the engines it embeds) alone, without the shared vocabulary's.
    """
    rules = grammar.rules
    if own:  # the rules before the shared vocabulary's, screened alone
        candidates = list(grammar.own_screen.candidates(record.encode("utf-8", "surrogatepass")))
    else:
        candidates = [i for i in grammar.candidates(record) if i < len(rules)]
    if all(rules[i].benign for i in candidates):  # none, or only rules that read nothing: nothing to read
        return None
    message = grammar.message(record)
    for index in candidates:
        rule = grammar.rules[index]
        if settled and rule.reason is None and not (rule.heartbeat or rule.benign or rule.begins or rule.stops):
            continue
        if found := rule.pattern.search(record if rule.whole else message if rule.prefix is None else _after(rule.prefix, record)):
            if rule.benign:
                return None
            said = grammar.fixed_matches[index] or _read(rule, found)
            return _refined(grammar, said, message, candidates) if said.reason or said.phase else said
    return None


# Reasons that say only that a start died (REASON_DETAIL), or that CUDA failed: a root cause named on the same line
# says more.
VAGUE = frozenset({*REASON_DETAIL, Reason.CUDA_ERROR})
ROOT_CAUSES = frozenset(Reason) - VAGUE


def _refined(grammar: Grammar, said: Match, message: str, candidates: list[int]) -> Match:
    """A failure's line as the shared vocabulary reads it too: the root cause it names beside a vague reason (every
    engine's way of saying out of memory is an OOM), and, where the failure is placed nowhere, the step the line
    names (`Unable to warmup model: … out of memory` failed in warm-up), unless the line only names it (benign); and
    a phase's marker (a worker's tag, as vLLM's Ray workers' lines begin) on a line whose words say its process
    died (a signal's handler, a segfault, a panic: the vocabulary's fatal rules) as that death, where the marker is."""
    shared = [grammar.rules[index] for index in candidates if grammar.rules[index].shared]
    if said.reason is None:
        died = next((r for r in shared if r.fatal and r.pattern.search(message)), None)
        return said if died is None else dataclasses.replace(said, reason=died.reason, fatal=True)
    cause = step = None
    if said.reason in VAGUE:  # a root cause; or CUDA's own error beside a crash's (`CUDA kernel failed : 1`)
        better = ROOT_CAUSES if said.reason is Reason.CUDA_ERROR else ROOT_CAUSES | {Reason.CUDA_ERROR}
        cause = next((r.reason for r in shared if r.reason in better and r.pattern.search(message)), None)
    if said.phase is None:
        step = next((r for r in shared if (r.benign or (r.phase and not r.reason)) and r.pattern.search(message)), None)
    if step is not None and step.benign:
        step = None
    if cause is None and step is None:
        return said
    return dataclasses.replace(said, reason=cause or said.reason, phase=step.phase if step else said.phase,
                               where=said.where or step is not None)


def _read(rule: Rule, found: re.Match[str]) -> Match:
    """What a rule that reads values says of the record it matched."""
    info, values, progress, hosts = {}, {}, {}, {}
    for group, raw in found.groupdict().items():
        if raw is None:
            continue
        if group in INFO:
            if rule.reads_info:
                info[group] = raw
            continue
        if group in GROUP:
            hosts[group] = raw
            continue
        name, _, unit = group.partition("__")
        value = _progress_part(raw, unit) if name in PROGRESS else float(raw.replace(",", "")) * SCALES[unit]
        if math.isfinite(value):  # 400 digits of "max model len" is no value at all
            (progress if name in PROGRESS else values)[name] = value
    return Match(rule.phase, rule.reason, rule.fatal, rule.heartbeat, rule.cache, frozen_map(info),
                 frozen_map(values), _report(progress, rule), rule.where, rule.begins, rule.retry,
                 rule.stops, frozen_map(hosts), rule.shared, rule.opens)


def _after(prefix: re.Pattern[str], record: str) -> str:
    head = prefix.match(record)
    if head is None:
        return record
    if "quoted" in prefix.groupindex and head.group("quoted") is not None:  # the prefix ends inside a JSON string
        return _string(head.group("msg"))
    return head.group("msg")


JSON_STRING = re.compile(r'(?:[^"\\]|\\.)*')


def _string(rest: str) -> str:
    """The value of the JSON string whose body starts `rest` (a record cut inside it: what there is of it)."""
    body = JSON_STRING.match(rest).group()  # type: ignore[union-attr]
    try:
        return json.loads(f'"{body}"')
    except ValueError:
        return body


def _progress_part(raw: str, unit: str) -> float:
    if unit == "clock":  # `[H:]MM:SS`; the hours are bounded in the rules, so this is a float
        seconds = 0.0
        for part in raw.split(":"):
            seconds = seconds * 60 + int(part)
        return seconds
    if unit == "size":
        number, prefix = (raw[:-1], raw[-1]) if raw[-1:].isalpha() else (raw, " ")
        return float(number) * 1000.0 ** SIZE_PREFIXES.index(prefix)
    value = float(raw.replace(",", ""))
    return value / 100 if unit == "percent" else value


def _report(parts: Mapping[str, float], rule: Rule) -> Report | None:
    """The rule's progress groups as one Report; None when the record holds no usable progress."""
    done = parts.get("progress_done")
    whole = not any(group.startswith("progress_total__") for group in rule.pattern.groupindex)
    total = 1.0 if whole else parts.get("progress_total")
    if done is None or total is None or total <= 0:  # a bar of nothing (`0/0`) says nothing
        return None
    return Report(done, total, rule.item, parts.get("progress_remaining"))


def settings(grammar: Grammar, record: str) -> str | None:
    """The engine's settings if this record is where it prints them (after its prefix)."""
    first = len(grammar.rules)
    candidates = [i - first for i in grammar.candidates(record) if i >= first]
    if not candidates:
        return None
    message = grammar.message(record)
    for index in candidates:
        if found := grammar.settings[index].search(message):
            return found.group(0)[:4096]
    return None


def detect(grammars: tuple[Grammar, ...], cmdline: str) -> str | None:
    """The engine whose command pattern the command line matches, first grammar first."""
    for grammar in grammars:
        if any(c.search(cmdline) for c in grammar.commands):
            return grammar.engine
    return None
