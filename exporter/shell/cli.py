"""Command line: argv → Config → sources, agent, registry and HTTP server; signals; logging."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from exporter import __version__
from exporter.core.config import DOCKER, PODS, STATE_PATH, Config, parse_duration, parse_listen, parse_pattern, parse_unit
from exporter.core.grammar import ENGINES

logger = logging.getLogger("llmstartup")


def _typed(parse: Callable[[str], object]) -> Callable[[str], object]:
    """Wrap a parser so argparse reports its ValueError message as the flag's error."""

    def convert(text: str) -> object:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = parse.__name__
    return convert


def add_source_flags(parser: argparse.ArgumentParser, units: bool = True) -> None:
    """The flags every command that reads a live host shares; `units`: it takes --unit (wait names its
    one unit as an argument instead)."""
    if units:
        parser.add_argument(
            "--unit", action="append", default=[], type=_typed(parse_unit), metavar="NAME[=ENGINE]",
            help="a unit to follow (a systemd unit, or a pod's container as NAMESPACE/POD/CONTAINER), optionally "
            "with its engine (vllm); repeat for more. Default: discover model-server units and containers from "
            "their processes' command lines",
        )
    parser.add_argument("--journal.namespace", dest="namespace", metavar="NS", help="read this journald namespace")
    parser.add_argument("--journal.directory", dest="directory", type=Path, metavar="DIR", help="read journal files in DIR")
    parser.add_argument("--sample.interval", dest="interval", type=_typed(parse_duration), default=2.0,
                        metavar="DURATION", help="how often processes and GPUs are sampled (default 2s)")
    parser.add_argument("--silence.threshold", dest="silence", type=_typed(parse_duration), default=60.0,
                        metavar="DURATION", help="no log line for this long makes a unit silent (default 60s)")
    parser.add_argument("--stall.threshold", dest="stall", type=_typed(parse_duration), default=300.0,
                        metavar="DURATION", help="nothing moving for this long makes a unit stalled (default 5m)")
    parser.add_argument("--collector.gpu", dest="gpu", action=argparse.BooleanOptionalAction, default=True,
                        help="sample GPU memory through NVML (default on; harmless without a GPU)")
    parser.add_argument("--collector.stacks", dest="stacks", action=argparse.BooleanOptionalAction, default=False,
                        help="sample the Python stacks of silent units with py-spy, to tell a spin from silent work "
                        "and show where a unit is stuck (default off; needs root or CAP_SYS_PTRACE)")
    parser.add_argument("--path.cgroupfs", dest="cgroup_root", type=Path, metavar="DIR",
                        help="the cgroup v2 mount (default: found in /proc/self/mountinfo)")
    parser.add_argument("--collector.containers", dest="containers", action=argparse.BooleanOptionalAction,
                        default=True, help="follow Kubernetes pods' and Docker's containers too (default on)")
    parser.add_argument("--path.pods", dest="pods", type=Path, default=PODS, metavar="DIR",
                        help="kubelet's pod logs, with its links to them in DIR/../containers (default /var/log/pods)")
    parser.add_argument("--path.docker", dest="docker", type=Path, default=DOCKER, metavar="DIR",
                        help="Docker's data root (default /var/lib/docker)")
    parser.add_argument("--collector.containers.unit-include", dest="container_include", type=_typed(parse_pattern),
                        metavar="REGEX", help="only containers whose unit (NAMESPACE/POD/CONTAINER, or the Docker "
                        "container's name) matches, whole (default all)")
    parser.add_argument("--collector.containers.unit-exclude", dest="container_exclude", type=_typed(parse_pattern),
                        metavar="REGEX", help="no container whose unit matches, whole")


def _history_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state.path", dest="state_path", type=Path, default=STATE_PATH, metavar="FILE",
                        help="the agent's history, read for what a start should take; never created nor "
                        "written (default /var/lib/llmstartup/history.db, when it exists)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmstartup",
        description="Follow LLM model-server units through startup and tell a hang from silent work.",
    )
    parser.add_argument("--version", action="version", version=f"llmstartup {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser("serve", help="run the agent and serve /metrics",
                                description="Run the agent: follow units and serve /metrics.")
    add_source_flags(serve)
    serve.add_argument("--web.listen-address", dest="listen", type=_typed(parse_listen), default=("127.0.0.1", 9847),
                       metavar="HOST:PORT", help="where to serve /metrics (default 127.0.0.1:9847, loopback only)")
    serve.add_argument("--web.config.file", dest="web_config", type=Path, metavar="FILE",
                       help="TLS, basic auth and response headers, in the Prometheus exporter-toolkit format "
                       "(the file node_exporter takes); checked at start")
    serve.add_argument("--state.path", dest="state_path", type=Path, default=STATE_PATH, metavar="FILE",
                       help="the history of starts, which teaches what a start should take "
                       "(default /var/lib/llmstartup/history.db)")
    serve.add_argument("--log.level", dest="log_level", default="info",
                       choices=["debug", "info", "warning", "error"], help="default info")

    status = commands.add_parser(
        "status", help="where each unit is now, and whether it is moving",
        description="One line per unit: phase, time in phase and since the start, age of the last log line, "
        "which signals move and how fast, and the verdict. Reads the journal and samples the processes itself, "
        "so it works over plain SSH on a host without the agent.")
    status.add_argument("units", nargs="*", type=_typed(parse_unit), metavar="UNIT",
                        help="units to show (default: every model-server unit found)")
    status.add_argument("--format", choices=["text", "json"], default="text", help="default text")
    add_source_flags(status)
    _history_flag(status)

    wait = commands.add_parser(
        "wait", help="block until a unit is ready (0), failed (1), stalled (2) or the timeout passes (3)",
        description="Block until UNIT is ready (exit 0), failed (1), stalled (2), or --timeout passes (3); "
        "a unit that does not exist is exit 4. Prints each phase change and a heartbeat with the evidence.")
    wait.add_argument("unit_name", type=_typed(parse_unit), metavar="UNIT")
    wait.add_argument("--timeout", type=_typed(parse_duration), default=1800.0, metavar="DURATION",
                      help="give up after this long (default 30m)")
    wait.add_argument("--heartbeat", type=_typed(parse_duration), default=30.0, metavar="DURATION",
                      help="print the evidence this often when nothing changes (default 30s; "
                      "on a terminal a live status line instead)")
    wait.add_argument("--format", choices=["text", "json"], default="text",
                      help="json: one JSON object a line (event change, heartbeat, end), for scripts; default text")
    add_source_flags(wait, units=False)
    _history_flag(wait)

    replay = commands.add_parser(
        "replay", help="where did a saved log's startup go, and where did it hang",
        description="Feed a saved log through the same core: a journal file, journalctl -o json/export/short/"
        "short-iso/short-precise output, docker logs -t, or an engine's plain output (detected). Prints each "
        "unit's last start: its phases with start and duration, the silent gaps, and the outcome.")
    replay.add_argument("file", metavar="FILE|-", help="the log; - reads standard input")
    replay.add_argument("--engine", choices=[e for e in ENGINES if e != "generic"],
                        help="the engine (default: told from the lines)")
    replay.add_argument("--unit", dest="units", action="append", default=[], metavar="NAME",
                        type=_typed(lambda text: parse_unit(text)[0]),
                        help="only this unit (repeatable); also the name for a plain engine log")
    replay.add_argument("--format", choices=["text", "json"], default="text", help="default text")
    replay.add_argument("--silence.threshold", dest="silence", type=_typed(parse_duration), default=60.0,
                        metavar="DURATION", help="a gap between lines this long is a silent gap (default 60s)")
    replay.add_argument("--year", type=int, help="the year of a log whose lines print none "
                        "(default: the file's modification year)")

    demo = commands.add_parser("demo", help="watch a scripted vLLM startup in a private journal (root)",
                               description="Start a private journald namespace, a demo unit printing a real-format "
                               "vLLM startup, and the agent; show phase and verdict live. Ctrl-C stops it all.")
    demo.add_argument("--web.listen-address", dest="listen", type=_typed(parse_listen), default=("127.0.0.1", 9847),
                      metavar="HOST:PORT", help="where to serve /metrics while the demo runs")
    return parser


def config_from(args: argparse.Namespace) -> Config:
    return Config(
        units=tuple(args.unit),
        namespace=args.namespace,
        directory=args.directory,
        listen=getattr(args, "listen", Config.listen),
        interval=args.interval,
        silence=args.silence,
        stall=args.stall,
        # status and wait learn from the agent's history when there is one; they never start one
        state_path=args.state_path,
        history_writes=args.command == "serve",
        gpu=args.gpu,
        stacks=args.stacks,
        cgroup_root=args.cgroup_root,
        web_config=getattr(args, "web_config", None),
        pods=args.pods if args.containers else None,
        docker=args.docker if args.containers else None,
        container_include=args.container_include,
        container_exclude=args.container_exclude,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        # serve logs its transitions; the operator's commands print their own and log only trouble
        level=getattr(args, "log_level", "warning").upper(),
        format="level=%(levelname)s logger=%(name)s msg=%(message)s",
        stream=sys.stderr,
    )
    if args.command == "demo":
        from exporter.shell.demo.run import run_demo

        return run_demo(args.listen)
    if args.command == "replay":
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `replay big.log | head` ends quietly
        return run_replay(args)
    if args.command == "status":
        from exporter.shell.foreground import run_status

        args.unit += args.units
        return _clear_errors(lambda: run_status(config_from(args), args.format, sys.stdout))
    if args.command == "wait":
        from exporter.shell.foreground import run_wait

        args.unit = [args.unit_name]
        return _clear_errors(lambda: run_wait(config_from(args), args.timeout, args.heartbeat, sys.stdout,
                                              fmt=args.format))
    return run_serve(config_from(args))


def run_replay(args: argparse.Namespace) -> int:
    from exporter.core import replay, report
    from exporter.core.model import Limits
    from exporter.sources import saved_log

    def progress(done: int, total: int) -> None:
        sys.stderr.write(f"\rreplay: {done / total:4.0%} of {total / 2**20:.0f} MiB")

    units = args.units
    try:
        if journal := saved_log.journal_file(args.file):  # read in parallel, skimmed (journal_skim)
            from exporter.sources.journal_skim import skim

            chosen, entries = skim(journal, args.silence, frozenset(units), args.engine)
        else:
            chosen, entries = {}, saved_log.entries(args.file, units[0] if units else "", args.year,
                                                    progress if sys.stderr.isatty() else None)
        run = replay.Replay(args.engine, Limits(silence=args.silence), default_unit=units[0] if units else "",
                            only=units, chosen=chosen)
        run.feed(entries)
    except OSError as error:
        logger.error("cannot read %s: %s", args.file, error.strerror or error)
        return 1
    except KeyboardInterrupt:
        return 130
    if sys.stderr.isatty():
        sys.stderr.write("\r\x1b[K")
    results = run.results()
    if not results:
        logger.error("no model-server startup found in %s (%d lines read)", args.file, run.lines)
        return 1
    if args.format == "json":
        docs = [report.replay_document(r) for r in results]
        json.dump(docs[0] if len(docs) == 1 else docs, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for result in results:
            sys.stdout.writelines(line + "\n" for line in report.replay_text(result))
    gc.freeze()  # the command ends here: its collection at exit need not walk all the replay built
    return 0


def _clear_errors(command: Callable[[], int]) -> int:
    from exporter.shell.runtime import StartError

    try:
        return command()
    except StartError as error:
        logger.error("%s", error)
        return 1
    except KeyboardInterrupt:
        return 130


def run_serve(config: Config, stop: threading.Event | None = None) -> int:
    """Run the agent until SIGTERM/SIGINT (or `stop`); 0 on a clean stop, 1 when it cannot start."""
    from exporter.shell.runtime import Runtime, StartError

    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():  # before anything starts: a stop is never lost
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    try:
        runtime = Runtime.start(config)
    except StartError as error:
        logger.error("%s", error)
        return 1
    try:
        runtime.agent.run(stop)
    finally:
        runtime.close()
    return 0
