"""6. Lines of 1 MiB: what cleaning one takes (exporter/core/lines.py: decode, strip colour, split the
`\\r` redraws, date them), against decoding and splitting the same bytes.

journald cuts lines at LineMax= (48 KiB by default), so lines this long come from saved logs that
`replay` reads, or from a journal configured otherwise. Four kinds of 1 MiB line, as tests/test_fuzz.py
feeds them: plain text, a `\\r` storm of tqdm redraws, an ANSI colour storm, and invalid UTF-8. Ours:
`clean_records` then `redraw_ages`, as to_observations runs them; reference: `bytes.decode(errors=
"replace").split("\\r")`, the least any reader does. Best of 5 each; ratio = ours / reference.
Goal: under 1 s a line, whatever it holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bench.common import MiB, Row, say
from exporter.core.lines import MAX_RECORD, clean_records, redraw_ages

KINDS = {
    "plain text": b"INFO 11-29 07:06:40 [core.py:1] the quick brown fox jumps over the lazy dog ",
    "\\r redraws": b"Capturing CUDA graphs:  50%|#####     | 33/67 [00:04<00:04,  8.0it/s]\r",
    "ANSI colour": b"\x1b[1;36m(EngineCore_DP0 pid=11)\x1b[0;0m \x1b[32mINFO\x1b[0m ",
    "invalid UTF-8": b"\xff\xfe caf\xc3\xa9 \xed\xa0\x80 ",
}


def _best(call: Callable[[], object], runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def _ours(line: bytes) -> None:
    records = clean_records(line)
    redraw_ages([r[:MAX_RECORD] for r in records])


def run() -> list[Row]:
    say("== 6. a line of 1 MiB: clean_records + redraw_ages, against bytes.decode + split ==")
    rows = []
    for kind, unit in KINDS.items():
        line = (unit * (MiB // len(unit) + 1))[:MiB]
        ours = _best(lambda line=line: _ours(line))
        reference = _best(lambda line=line: line.decode("utf-8", "replace").split("\r"))
        say(f"{kind:16s} ours {ours * 1e3:8.1f} ms   reference {reference * 1e3:6.1f} ms   {ours / reference:6.1f}x")
        rows.append(Row(f"a 1 MiB line of {kind}, ms", f"{ours * 1e3:.1f}", f"{reference * 1e3:.1f} (decode + split)",
                        f"{ours / reference:.1f}x", "< 1 s", ours < 1.0))
    say()
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
