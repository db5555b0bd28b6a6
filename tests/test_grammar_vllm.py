"""The vLLM grammar against annotated real-format log lines, one fixture file per version family.

Each fixture line is `EXPECTATION | RAW LINE`. EXPECTATION is `-` (no rule matches) or space-separated
`key=value` items: `phase=`, `reason=`, `fatal=true`, `model=`, `engine_version=` and engine values
named as in grammar.VALUES, in base units (`model_weights_bytes=8066163330.2528`). In RAW LINE the
escapes `\\r` and `\\x1b` stand for the carriage return and escape characters a journal record holds.
The raw line goes through clean_records, as the journal source does, and the last record (a `\\r`
bar's final redraw) is matched. Lines starting with `#` are comments naming each line's source.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from exporter import grammar
from exporter.grammar import INFO, VALUES, GrammarError
from exporter.lines import clean_records
from exporter.model import STARTUP_ORDER, Phase, Reason

FIXTURES = Path(__file__).parent / "grammars" / "vllm"
FILES = ("v0-0.5.log", "v0-0.6.log", "v1-0.8.log", "v1-0.11.log", "v1-0.19.log", "v1-0.33.log")
SEPARATOR = " | "
VLLM = grammar.load("vllm")


@dataclass(frozen=True)
class Expected:
    phase: Phase | None = None
    reason: Reason | None = None
    fatal: bool = False
    info: dict[str, str] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    where: str  # file:lineno
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
        if key not in {"phase", "reason", "fatal"} | INFO | set(VALUES):
            raise ValueError(f"{where}: unknown key {key!r}")
        seen[key] = value
    if seen.get("fatal", "true") != "true":
        raise ValueError(f"{where}: fatal is only ever `fatal=true`")
    return Expected(
        phase=Phase(seen["phase"]) if "phase" in seen else None,
        reason=Reason(seen["reason"]) if "reason" in seen else None,
        fatal="fatal" in seen,
        info={k: v for k, v in seen.items() if k in INFO},
        values={k: float(v) for k, v in seen.items() if k in VALUES},
    )


def _decode(raw: str) -> str:
    return raw.replace("\\x1b", "\x1b").replace("\\r", "\r")


def _cases(name: str) -> list[Case]:
    cases = []
    for lineno, line in enumerate((FIXTURES / name).read_text("utf-8").splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        where = f"{name}:{lineno}"
        expectation, sep, raw = line.partition(SEPARATOR)
        if not sep:
            raise ValueError(f"{where}: no {SEPARATOR!r} between expectation and raw line")
        cases.append(Case(where, _decode(raw), _expectation(expectation, where)))
    return cases


CASES = {name: _cases(name) for name in FILES}
ALL = [case for cases in CASES.values() for case in cases]


def _record(case: Case) -> str:
    records = clean_records(case.raw)
    assert records, f"{case.where}: the raw line holds no record"
    return records[-1]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.where) for c in ALL])
def test_line(case: Case) -> None:
    found = grammar.match(VLLM, _record(case))
    expected = case.expected
    if expected is None:
        assert found is None, f"expected no match, got {found}"
        return
    assert found is not None, "expected a match, no rule matched"
    assert (found.phase, found.reason, found.fatal) == (expected.phase, expected.reason, expected.fatal)
    assert dict(found.info) == expected.info
    assert set(found.values) == set(expected.values)
    assert dict(found.values) == pytest.approx(expected.values)


def _winner(record: str) -> int | None:
    """Index of the rule that decides the record: the first one that matches it."""
    for index, rule in enumerate(VLLM.rules):
        if grammar.match(dataclasses.replace(VLLM, rules=(rule,)), record) is not None:
            return index
    return None


def test_every_rule_decides_some_fixture_line() -> None:
    used = {_winner(_record(case)) for case in ALL}
    dead = [rule.pattern.pattern for index, rule in enumerate(VLLM.rules) if index not in used]
    assert not dead, f"rules no fixture line reaches (dead or shadowed): {dead}"


@pytest.mark.parametrize("name", FILES)
def test_each_file_holds_a_start_failures_noise_and_a_redrawn_bar(name: str) -> None:
    cases = CASES[name]
    assert any(c.expected and c.expected.phase is Phase.READY for c in cases), "no ready line"
    assert any(c.expected and c.expected.reason for c in cases), "no failure line"
    assert any(c.expected is None for c in cases), "no noise line"
    assert any(len(clean_records(c.raw)) > 1 for c in cases), "no \\r-redrawn record"


@pytest.mark.parametrize("name", FILES)
def test_start_phases_only_move_forward(name: str) -> None:
    """Up to the first ready line each file is one start in order: its phases never go back."""
    phases = []
    for case in CASES[name]:
        if case.expected and case.expected.phase:
            phases.append((case.where, case.expected.phase))
            if case.expected.phase is Phase.READY:
                break
    assert phases and phases[-1][1] is Phase.READY
    for (where_a, a), (where_b, b) in zip(phases, phases[1:]):
        assert STARTUP_ORDER.index(b) >= STARTUP_ORDER.index(a), f"{where_b} ({b}) comes after {where_a} ({a})"


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
    return False


def test_every_regex_is_linear() -> None:
    patterns = [VLLM.prefix] + [rule.pattern for rule in VLLM.rules]
    nested = [p.pattern for p in patterns if p and _nested_repeat(re._parser.parse(p.pattern))]  # type: ignore[attr-defined]
    assert not nested, f"nested quantifiers: {nested}"


def test_nested_repeat_check_sees_one() -> None:
    assert _nested_repeat(re._parser.parse(r"(?:a\d+)+b"))  # type: ignore[attr-defined]
    assert not _nested_repeat(re._parser.parse(r"(?:a\d+)?b"))  # type: ignore[attr-defined]


# ---- grammar files that do not load ----


def test_parse_takes_a_minimal_grammar() -> None:
    parsed = grammar.parse("mini", "[[rule]]\nmatch = '''ready'''\nphase = \"ready\"\n")
    assert [r.phase for r in parsed.rules] == [Phase.READY]


@pytest.mark.parametrize(
    "text, says",
    [
        pytest.param("[[rule]]\nmatch = '''(unclosed'''\n", "missing ), unterminated subpattern", id="bad regex"),
        pytest.param("prefix = '''(?P<msg>.*'''\n", "missing ), unterminated subpattern", id="bad prefix"),
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
        pytest.param("[[rule]]\nphase = \"ready\"\n", "rule 1 has no `match`", id="rule without match"),
        pytest.param("[[rule]\nmatch = 'x'\n", "line 1", id="bad toml"),
    ],
)
def test_parse_rejects_with_a_clear_message(text: str, says: str) -> None:
    with pytest.raises(GrammarError) as error:
        grammar.parse("broken", text)
    assert str(error.value).startswith("grammar broken: ")
    assert says in str(error.value)
