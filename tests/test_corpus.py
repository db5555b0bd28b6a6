"""The corpus (tests/corpus/): startup logs shaped as users really pasted them, each read right by `replay`.

One test reads every case and fails on any miss, listing each one, so that a grammar change that fixes
one case and breaks another shows; the rate is printed at the end of every run (conftest.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import signal
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.core import formats
from exporter.core.entries import log_lines
from exporter.core.formats import Format, paste
from exporter.shell import cli
from exporter.sources import saved_log

CORPUS = Path(__file__).parent / "corpus"
ENGINES = ("vllm", "sglang", "tgi", "llamacpp", "ollama", "triton")
OUTCOMES = ("ready", "failed", "stopped", "incomplete")


@dataclass(frozen=True)
class Case:
    log: Path
    expected: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.log.parent.name}/{self.log.stem}"


def cases() -> list[Case]:
    return [Case(toml.with_suffix(".log"), tomllib.loads(toml.read_text())) for toml in sorted(CORPUS.glob("*/*.toml"))]


def _accepted(value: str | list[str] | None) -> set[str | None]:
    return set(value) if isinstance(value, list) else {value}


def _replay(case: Case) -> tuple[int, list[dict[str, Any]], str]:
    """`llmstartup replay CASE --format json`, in this process (the command sets SIGPIPE back to its
    default, which a test process must not keep)."""
    out, err = io.StringIO(), io.StringIO()
    sigpipe = signal.getsignal(signal.SIGPIPE)
    # The command's logging is set up once per process (and not at all under pytest, whose handlers are
    # there first): a handler of this case's own, or a miss would say only its exit code and not why
    # ("no model-server startup found …").
    said = logging.StreamHandler(err)
    said.setLevel(logging.WARNING)
    logging.getLogger().addHandler(said)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["replay", str(case.log), "--format", "json", *case.expected.get("args", [])])
    finally:
        logging.getLogger().removeHandler(said)
        signal.signal(signal.SIGPIPE, sigpipe)
    docs = json.loads(out.getvalue()) if code == 0 else []
    return code, docs if isinstance(docs, list) else [docs], err.getvalue()


def _span(case: Case) -> tuple[float, float] | None:
    """The first and last time the log's own lines carry, as replay's reader sees them."""
    year = int(case.expected.get("args", ["--year", "2025"])[1]) if "--year" in case.expected.get("args", []) else 2025
    times = [t for t, _ in saved_log.entries(str(case.log), year=year) if t is not None]
    return (min(times), max(times)) if times else None


def misses(case: Case) -> list[str]:
    """What `replay` got wrong about the case; [] when it read it right."""
    expected = case.expected
    code, docs, err = _replay(case)
    if code != 0:
        return [f"exit {code}: {err.strip()[-200:]}"]
    wanted = expected.get("unit")
    docs = [d for d in docs if d["unit"] == wanted] if wanted else docs
    if len(docs) != 1:
        return [f"{len(docs)} documents for {wanted or 'the log'}, not one"]
    [doc] = docs
    found = []
    for key, accepted in (
        ("engine", _accepted(expected["engine"])),
        ("outcome", _accepted(expected["outcome"])),
        ("last_phase", _accepted(expected["last_phase"])),
        ("failure_reason", _accepted(expected.get("failure_reason"))),
    ):
        if doc[key] not in accepted:
            found.append(f"{key} {doc[key]!r}, expected {' or '.join(map(repr, sorted(accepted, key=str)))}")
    durations = [doc["startup_seconds"], *(p["duration_seconds"] for p in doc["phases"]),
                 *(g["duration_seconds"] for g in doc["silent_gaps"])]
    span = _span(case)
    if span is None:
        if any(d is not None for d in durations):
            found.append(f"durations {durations} from a log without times")
    elif any(d is None or not 0 <= d <= span[1] - span[0] + 1 for d in durations):
        found.append(f"durations {durations} outside the log's own span of {span[1] - span[0]:.0f} s")
    return found


def test_the_corpus_is_well_formed():
    all_cases = cases()
    assert len(all_cases) >= 80
    assert len({c.expected["source"] for c in all_cases}) >= 60
    for case in all_cases:
        e = case.expected
        assert case.log.is_file(), case.name
        assert e["source"].startswith("https://"), case.name
        assert e["engine"] == case.log.parent.name and e["engine"] in ENGINES, case.name
        assert e["outcome"] in OUTCOMES, case.name
        assert ("failure_reason" in e) == (e["outcome"] == "failed"), case.name
        assert e.get("why"), case.name
    assert {c.log.parent.name for c in all_cases} == set(ENGINES)


class _Rate:
    """Prints the corpus rate at the end of the run, pass or fail."""

    def __init__(self, right: int, total: int) -> None:
        self.right, self.total = right, total

    def pytest_terminal_summary(self, terminalreporter) -> None:
        terminalreporter.write_line(
            f"corpus: {self.right} of {self.total} real-world startup logs read right "
            f"({self.right / self.total:.0%}), tests/corpus/"
        )


def test_every_case_is_read_right(request):
    results = {case.name: misses(case) for case in cases()}
    wrong = {name: found for name, found in results.items() if found}
    request.config.pluginmanager.register(_Rate(len(results) - len(wrong), len(results)), "corpus-rate")
    assert not wrong, f"{len(wrong)} of {len(results)} corpus cases misread:\n" + "\n".join(
        f"  {name}: {'; '.join(found)}" for name, found in sorted(wrong.items())
    )


JOURNALS = (Format.SHORT, Format.SHORT_PRECISE, Format.SHORT_ISO)  # journalctl's text: what the agent reads live


def test_paste_repair_changes_no_line_a_journal_holds():
    """The live agent never repairs a paste (formats.paste): in every corpus case that is a journal, each line the
    journal held gives the live path the same records with replay's repair as without; the repair only ever takes
    off what a page or a terminal put around the log (fences, quotes, line numbers)."""
    journals = 0
    for case in cases():
        lines = case.log.read_bytes().splitlines(keepends=True)
        if frame := paste.frame(lines[:50]):
            lines = list(paste.unframed(lines, frame))
        if (fmt := formats.detect(lines[:50])) not in JOURNALS:
            continue
        journals += 1
        for _, fields in formats.entries(lines, fmt, year=2025):
            if "SYSLOG_IDENTIFIER" in fields:  # a journal's line, not the paste's own (a fence, a note)
                live = log_lines(fields["MESSAGE"], 0.0, "unit")
                assert log_lines(paste.repaired(fields)["MESSAGE"], 0.0, "unit") == live, case.name
    assert journals >= 50


def test_a_case_replay_finds_nothing_in_is_a_miss_that_says_why(tmp_path):
    log = tmp_path / "vllm" / "no-markers.log"
    log.parent.mkdir()
    log.write_text("hello\nnothing a grammar knows\n")
    case = Case(log, {"engine": "vllm", "outcome": "ready", "last_phase": "ready"})
    for _ in range(2):  # the second too: the command sets its logging up once per process
        [miss] = misses(case)
        assert miss.startswith("exit 1: ") and "no model-server startup found" in miss
