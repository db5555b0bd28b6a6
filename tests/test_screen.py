"""exporter.core.screen: the literal screen in front of every grammar never rules out a regex that matches."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from re import _constants as sre
from re import _parser as sre_parse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_grammars import ALL, GRAMMARS, _record

from exporter.core import grammar
from exporter.core.screen import Screen, required

PATTERNS = {engine: [r.pattern for r in g.rules] + list(g.settings) for engine, g in GRAMMARS.items()}


@pytest.mark.parametrize(
    ("pattern", "literals"),
    [
        ("vLLM API server version (?P<v>\\S+)", {("vLLM API server version ", False)}),
        ("x?abc", {("abc", False)}),
        ("(?:foo)?bar", {("bar", False)}),
        ("a\\d+bcd", {("bcd", False)}),  # the longest run
        ("NCCL error|DistBackendError", {("NCCL error", False), ("DistBackendError", False)}),
        ("(?:EngineCore|WorkerProc) failed to start", {(" failed to start", False)}),
        ("(?:ab)+", {("ab", False)}),
        ("(?i)error: out of memory", {("error: out of memory", True)}),
        ("id=(?i:Ready)", {("Ready", True)}),
        ("(?i)x(?-i:Abc)", {("Abc", False)}),
        ("\\u2588\\s+version", {("version", False)}),
    ],
)
def test_required_literals(pattern, literals):
    assert required(re.compile(pattern)) == literals


@pytest.mark.parametrize("pattern", ["\\d+", "a|\\d", "(?:abc)?", "(?:abc)*", "[ab]c?", "(?=abc)"])
def test_no_literal_no_screen(pattern):
    """A regex that can match without any literal is never ruled out."""
    screen = Screen([re.compile(pattern)])
    assert required(re.compile(pattern)) is None
    assert screen.unscreened == (0,)
    assert screen.candidates(b"") == screen.candidates(b"zzz") == (0,)


def test_every_rule_of_every_grammar_is_screened():
    """No shipped rule falls back to always running: each has a literal the screen can look for."""
    for engine, patterns in PATTERNS.items():
        assert Screen(patterns).unscreened == (), engine


def test_what_passes_the_screen():
    screen = Screen([re.compile("CUDA out of memory"), re.compile("(?i)address already in use"),
                     re.compile("\\u2588\\s+version")])
    assert screen.candidates(b"INFO  10.0.0.1:4000 - \"POST /v1/completions HTTP/1.1\" 200 OK") == ()
    assert screen.candidates(b"torch.OutOfMemoryError: CUDA out of memory. Tried") == (0,)
    assert screen.candidates(b"ERROR: [Errno 98] ADDRESS ALREADY IN USE") == (1,)
    # with a case-insensitive literal around, non-ASCII text passes for all: RE2 folds only ASCII
    assert screen.candidates("█  version 0.19".encode()) == (0, 1, 2)
    assert screen.may_match(b"CUDA out of memory") and not screen.may_match(b"nothing here")


def test_what_passes_a_screen_without_case_folding():
    patterns = [re.compile("CUDA out of memory"), re.compile("\u2588\\s+version")]
    screen, raw = Screen(patterns), Screen(patterns, raw=True)
    assert screen.candidates("█  version 0.19".encode()) == (1,)
    assert screen.candidates("Modèle chargé".encode()) == screen.candidates(b"\xff\xfe CUDA") == ()
    assert screen.candidates(b"\xff CUDA out of memory") == (0,)  # invalid UTF-8 around a literal
    # a raw MESSAGE still holds colour codes, which clean_records strips, and \r bars
    assert screen.candidates(b"CUDA \x1b[1mout of memory") == ()
    assert raw.candidates(b"CUDA \x1b[1mout of memory") == raw.candidates(b"bar 1/2\rbar 2/2") == (0, 1)
    assert raw.candidates(b"plain text") == ()


@pytest.mark.parametrize("case", ALL, ids=lambda c: c.where)
def test_every_fixture_line_that_a_regex_matches_passes_for_it(case):
    record = _record(case)
    might = GRAMMARS[case.engine].candidates(record)
    for index, pattern in enumerate(PATTERNS[case.engine]):
        if pattern.search(record):
            assert index in might, f"{case.where}: screen rules out {pattern.pattern!r}"


PLAIN = st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.just("\t")  # what the screen reads itself


def _plain_literals(node) -> bool:
    """Whether every literal character in a parse tree is plain ASCII (from_regex can then use PLAIN)."""
    if isinstance(node, sre_parse.SubPattern):
        return all(_plain_literals(item) for item in node)
    if isinstance(node, list):
        return all(_plain_literals(item) for item in node)
    if isinstance(node, tuple) and len(node) == 2 and node[0] in (sre.LITERAL, sre.NOT_LITERAL):
        return 0x20 <= node[1] <= 0x7E
    return all(_plain_literals(item) for item in node) if isinstance(node, tuple) else True


ASCII_ONLY = {(e, i) for e, patterns in PATTERNS.items() for i, p in enumerate(patterns)
              if _plain_literals(sre_parse.parse(p.pattern, p.flags))}


@st.composite
def matching_text(draw: st.DrawFn) -> tuple[str, int, str]:
    """A text one regex of one grammar matches: mostly plain ASCII, which the screen decides alone."""
    engine = draw(st.sampled_from(sorted(PATTERNS)))
    index = draw(st.integers(0, len(PATTERNS[engine]) - 1))
    pattern = PATTERNS[engine][index]
    plain = (engine, index) in ASCII_ONLY and draw(st.integers(0, 9)) > 0
    return engine, index, draw(st.from_regex(pattern, alphabet=PLAIN) if plain else st.from_regex(pattern))


@settings(max_examples=1500, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(matching_text())
def test_text_a_regex_matches_always_passes_its_screen(drawn):
    """Texts generated from the regexes themselves, with anything around the match."""
    engine, index, text = drawn
    assert PATTERNS[engine][index].search(text)
    assert index in GRAMMARS[engine].candidates(text)


def _searched(g, rule, text):
    """What a rule is searched in: the whole record, or the record after its grammar's (or its engine's) prefix."""
    if rule.whole:
        return text
    return g.message(text) if rule.prefix is None else dataclasses.replace(g, prefix=rule.prefix).message(text)


@settings(max_examples=800, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(matching_text().map(lambda drawn: drawn[2]) | st.text(alphabet=PLAIN, max_size=300))
def test_match_with_and_without_the_screen_agree(text):
    """grammar.match through the screen gives what trying every rule in order gives: the first that matches, its
    vague reason and missing phase read again in the shared vocabulary's rules (grammar._refined)."""
    for g in GRAMMARS.values():
        slow = next((rule for rule in g.rules if rule.pattern.search(_searched(g, rule, text))), None)
        fast = grammar.match(g, text)
        assert (fast is None) == (slow is None or slow.benign)  # a benign rule matches and reads nothing
        if fast is not None and slow is not None:
            assert (fast.phase, fast.reason) == _refined(g, slow, g.message(text))


def _refined(g, rule, message):
    phase, reason = rule.phase, rule.reason
    if reason is None:
        return phase, reason
    shared = [r for r in g.rules if r.shared and r.pattern.search(message)]
    if reason in grammar.VAGUE:
        reason = next((r.reason for r in shared if r.reason and r.reason not in grammar.VAGUE), reason)
    if phase is None:
        step = next((r for r in shared if r.benign or (r.phase and not r.reason)), None)
        phase = step.phase if step is not None else None
    return phase, reason



UNION = Screen([p for patterns in PATTERNS.values() for p in patterns], raw=True)  # the skim's screen


@settings(max_examples=300, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.lists(matching_text().map(lambda drawn: drawn[2]) | st.text(alphabet=PLAIN, max_size=80)
                | st.sampled_from(["", "\r", "a\x00b", "é"]), max_size=40))
def test_a_batch_passes_what_each_of_its_texts_passes(texts):
    """Screening texts together (journal_skim's batches) passes exactly the texts that pass alone."""
    raw = [text.encode("utf-8", "surrogatepass") for text in texts]
    assert UNION.which_may_match(raw) == {at for at, data in enumerate(raw) if UNION.may_match(data)}


def test_a_batch_with_nothing_to_find():
    serving = [b'INFO:     10.0.3.4:41000 - "POST /v1/chat/completions HTTP/1.1" 200 OK'] * 256
    assert UNION.which_may_match(serving) == set()
    assert UNION.which_may_match([*serving, b"x\rCapturing CUDA graphs: 100%"]) == {256}
    assert Screen([re.compile(r"\d+")]).which_may_match([]) == set()  # even where every text passes


def test_every_engines_screen_at_once_keeps_to_its_dfa():
    # replay's skim screens batches of a journal against every engine's literals at once: RE2's DFA for them
    # outgrew its default memory budget, fell back to the NFA (several times slower) and wrote "DFA out of
    # memory" to stderr again and again, thousands of lines in one `replay`. The texts: the corpus's real logs.
    script = (
        "import glob\n"
        "from exporter.sources.journal_skim import _screen\n"
        "lines = [l for f in sorted(glob.glob('tests/corpus/*/*.log')) for l in open(f, 'rb').read().split(b'\\n') if l]\n"
        "screen = _screen()\n"
        "for at in range(0, len(lines), 500):\n"
        "    screen.which_may_match(lines[at:at + 500])\n"
    )
    root = Path(__file__).parent.parent
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "DFA out of memory" not in done.stderr, done.stderr[:500]
