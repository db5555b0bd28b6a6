"""`.venv/bin/python -m bench`: every benchmark of bench/README.md, in about 20 minutes, as root (the soak,
`python -m bench.soak --minutes N`, is separate: it runs as long as it is told).

Each figure is printed with the reference it is measured against in the same run, and the ratio;
nothing is asserted. Exits 0 when every benchmark ran (whether or not its goal was met), 1 when one
could not run, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback

from bench.common import Row, load_average, machine, say

BENCHMARKS = ("ingest", "steady", "stall", "web", "lines", "restart", "stacks", "series")  # steady is items 2 and 3: they share one rig
QUIET = 0.5


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through every cleanup


def table(rows: list[Row], where: str) -> str:
    out = [f"Machine: {where}", "",
           "| figure | ours | reference | ratio | goal | met? |", "|---|---|---|---|---|---|"]
    for r in rows:
        met = "?" if r.met is None else ("yes" if r.met else "**no**")
        out.append(f"| {r.figure} | {r.ours} | {r.reference} | {r.ratio} | {r.goal} | {met} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--only", action="append", choices=BENCHMARKS,
                        help="run only this benchmark (repeatable); 'steady' is items 2 and 3")
    parser.add_argument("--entries", type=int, default=300_000, help="journal entries of item 1 (300000)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured in item 2 (60)")
    parser.add_argument("--scrapes", type=int, default=300, help="scrapes of each /metrics in item 3 (300)")
    parser.add_argument("--restart-lines", type=int, action="append", dest="restart_lines_given",
                        help="serving lines before a restart in item 7 (repeatable; default 1000000 and 10000000)")
    args = parser.parse_args(argv)
    args.restart_lines = tuple(args.restart_lines_given or (1_000_000, 10_000_000))
    chosen = args.only or list(BENCHMARKS)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)

    where = machine()
    load = load_average()
    say(f"machine: {where}")
    say(f"load average (1 min) at start: {load:.2f}")
    if load > QUIET:
        say(f"WARNING: the load average is above {QUIET}: other work on this machine inflates the steady-state "
            "CPU figures (item 2) and the latencies; run again when the machine is quiet")
    if os.geteuid() != 0 and ({"steady", "stall", "restart", "stacks"} & set(chosen)):
        say("items 2-4, 7 and 8 run units in a private journald namespace and need root; run as root")
        return 1
    say()

    from bench import ingest, lines, restart, series, stacks, stall, steady, web

    runs = {"ingest": lambda: ingest.run(args.entries),
            "steady": lambda: steady.run(args.window, args.scrapes),
            "stall": stall.run,
            "web": web.run,
            "lines": lines.run,
            "restart": lambda: restart.run(args.restart_lines),
            "stacks": stacks.run,
            "series": series.run}
    rows: list[Row] = []
    failed = []
    started = time.monotonic()
    for name in BENCHMARKS:
        if name not in chosen:
            continue
        try:
            rows += runs[name]()
        except Exception as error:  # noqa: BLE001 - report it and go on with the others
            failed.append(name)
            say(f"{name}: could not run: {error}")
            traceback.print_exc(file=sys.stdout)
            say()
    say(f"== summary ({time.monotonic() - started:.0f} s; load average at the end {load_average():.2f}) ==")
    say(table(rows, where))
    if failed:
        say(f"\nnot run: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
