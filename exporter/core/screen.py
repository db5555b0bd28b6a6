"""Which of some regexes might match a text: one pass over its bytes rules out those it cannot.

A regex can only match a text that holds one of its *required literals*: the runs of plain
characters every match must contain, read from the regex's own parse tree. `Screen` looks for
all of them at once with an RE2 set (linear in the text, whatever the number of regexes), so a
line that none of an engine's rules could match costs one scan instead of forty searches. A
serving model server prints almost only such lines.

The screen only ever says "maybe": the regexes still decide. It is sound by construction — a
literal is taken only where the parse tree makes it unavoidable — and tests/test_screen.py
checks it against every grammar's fixtures and against generated text.
"""

from __future__ import annotations

import functools
import re
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from itertools import accumulate
from re import _constants as sre  # the parse tree's opcodes; public in all but name since Python 1.6
from re import _parser as sre_parse

import re2

Literal = tuple[str, bool]  # the text, and whether it matches without regard to case

# Bytes after which a literal in the text no longer proves anything, so the text passes every
# regex on. A literal's UTF-8 bytes are in the text's exactly when the literal is in its characters,
# even around invalid UTF-8 (decoded as U+FFFD, which no literal holds); but case folding outside
# ASCII is not RE2's, and a raw journal message still holds the colour codes that clean_records
# strips (which can join a literal back together) and the \r that splits a bar into records.
NON_ASCII = rb"[\x80-\xff]"
RAW = rb"[\x1b\r]"


@functools.cache  # an engine's screen and the skim's, of every engine, read the same patterns
def required(pattern: re.Pattern[str]) -> frozenset[Literal] | None:
    """Literals one of which every text the pattern matches contains; None when there is none."""
    tree = sre_parse.parse(pattern.pattern, pattern.flags)
    return _needed(list(tree), bool(tree.state.flags & re.IGNORECASE))


def _needed(items: Iterable[tuple[object, object]], icase: bool) -> frozenset[Literal] | None:
    """The most selective set of alternatives the sequence `items` cannot match without: the one
    whose shortest literal is longest. Only runs of LITERALs, groups, branches (when every branch
    has one) and repeats of at least one are read; anything else just ends a run, which is safe."""
    best: frozenset[Literal] | None = None
    run: list[str] = []

    def consider(candidate: frozenset[Literal] | None) -> None:
        nonlocal best
        if candidate and (best is None or _weight(candidate) > _weight(best)):
            best = candidate

    def end_run() -> None:
        if run:
            consider(frozenset({("".join(run), icase)}))
            run.clear()

    for op, av in items:
        if op is sre.LITERAL:
            run.append(chr(av))  # type: ignore[arg-type]
            continue
        end_run()
        if op is sre.SUBPATTERN:
            _group, add, remove, sub = av  # type: ignore[misc]
            consider(_needed(sub, (icase or bool(add & re.IGNORECASE)) and not remove & re.IGNORECASE))
        elif op is sre.ATOMIC_GROUP:
            consider(_needed(av, icase))  # type: ignore[arg-type]
        elif op is sre.BRANCH:
            branches = [_needed(branch, icase) for branch in av[1]]  # type: ignore[index]
            if all(branches):
                consider(frozenset().union(*branches))  # type: ignore[arg-type]
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            low, _high, sub = av  # type: ignore[misc]
            if low >= 1:
                consider(_needed(sub, icase))
    end_run()
    return best


def _weight(literals: frozenset[Literal]) -> int:
    return min(len(text) for text, _ in literals)


def _re2(literals: frozenset[Literal]) -> bytes:
    """The literals as one RE2 alternation over UTF-8 bytes (the set reads bytes as Latin-1)."""
    def escaped(text: str) -> bytes:
        return b"".join(b"\\x%02x" % byte for byte in text.encode("utf-8"))
    return b"|".join(b"(?i:%s)" % escaped(t) if icase else escaped(t) for t, icase in sorted(literals))


ANYWHERE = b"(?:)"  # matches anywhere: the pattern of a regex without a required literal, always a candidate


def _alternatives(patterns: Sequence[re.Pattern[str]], raw: bool) -> list[bytes]:
    """Entry 0, what makes a text pass every regex (a class no byte is in, when nothing does); then each
    regex's required literals as one RE2 alternation."""
    literals = [required(pattern) for pattern in patterns]
    icase = any(folded for found in literals for _, folded in found or ())
    unsafe = b"|".join(([RAW] if raw else []) + ([NON_ASCII] if icase else []))
    return [unsafe or b"[^\\x00-\\xff]"] + [_re2(found) if found else ANYWHERE for found in literals]


def any_pattern(patterns: Sequence[re.Pattern[str]], raw: bool = False) -> bytes:
    """The pattern of Screen(patterns, raw).any, without compiling the Screen: what AnyOf is built from."""
    return b"|".join(_alternatives(patterns, raw))


class Screen:
    """The regexes, by index, that might match a text given as UTF-8 bytes.

    `raw`: the texts are journal MESSAGEs as stored, not the records clean_records makes of them;
    any with a colour code or a \r passes.
    """

    def __init__(self, patterns: Sequence[re.Pattern[str]], raw: bool = False) -> None:
        self._set = re2.Set.SearchSet(_options())
        alternatives = _alternatives(patterns, raw)
        for alternative in alternatives:
            self._set.Add(alternative)
        self._set.Compile()
        self._pattern = b"|".join(alternatives)
        self.everything = tuple(range(len(patterns)))
        self.unscreened = tuple(i for i, alternative in enumerate(alternatives[1:]) if alternative == ANYWHERE)

    def candidates(self, data: bytes) -> tuple[int, ...]:
        """The indices, in order, of the patterns that might match `data`; () when none can."""
        hits = self._set.Match(data)
        if not hits:
            return ()
        if 0 in hits:
            return self.everything
        hits.sort()
        return tuple([hit - 1 for hit in hits])

    def may_match(self, data: bytes) -> bool:
        """Whether any pattern might match `data`."""
        return self._set.Match(data) is not None

    @functools.cached_property
    def any(self) -> AnyOf:
        """Whether any pattern might match: compiled when first asked (replay screens batches of records with it;
        the agent, which asks each line's candidates, never does: 0.1 MiB of RE2 per grammar kept)."""
        return AnyOf(self._pattern)

    def which_may_match(self, texts: Sequence[bytes]) -> set[int]:
        """The indices of the texts any pattern might match (AnyOf.which_may_match)."""
        return self.any.which_may_match(texts)


def _options() -> re2.Options:
    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1  # a byte is a character: any bytes can be screened
    # RE2's DFA for every engine's literals at once (replay's skim) outgrows the default 8 MiB budget: it
    # then falls back to the NFA, several times slower, and logs `DFA out of memory` to stderr each time.
    # A budget, not an allocation: the states are built as texts need them.
    options.max_mem = 64 << 20
    return options


class AnyOf:
    """Whether any of a Screen's patterns might match a text: the one alternation of all their literals.

    It is all of a Screen that the journal reader child needs (exporter.sources.journal_catchup), and it
    crosses the pipe as that alternation's bytes: the child loads no grammar.
    """

    def __init__(self, pattern: bytes) -> None:
        self.pattern = pattern
        self._any = re2.compile(pattern, _options())

    def __reduce__(self) -> tuple[type[AnyOf], tuple[bytes]]:
        return AnyOf, (self.pattern,)

    def which_may_match(self, texts: Sequence[bytes]) -> set[int]:
        """The indices of the texts any pattern might match: one scan of them all, where a call per text
        costs more. They are joined with NULs, which no literal of a grammar holds (a literal that did
        would only make a text pass needlessly); after a text passes, the scan goes on from the next
        one's start."""
        together = b"\0".join(texts)
        found = self._any.search(together) if texts else None
        if found is None:  # what a batch of serving lines comes to
            return set()
        starts = list(accumulate((len(text) + 1 for text in texts[:-1]), initial=0))
        out = set()
        while found is not None:
            at = bisect_right(starts, found.start()) - 1
            out.add(at)
            if at + 1 == len(starts):
                break
            found = self._any.search(together, starts[at + 1])
        return out
