"""Durations, unit names and listen addresses: what the flags accept and what they refuse."""

import pytest

from exporter.core.config import parse_duration, parse_listen, parse_unit


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("90s", 90, id="seconds"),
        pytest.param("5m", 300, id="minutes"),
        pytest.param("1h30m", 5400, id="compound"),
        pytest.param("500ms", 0.5, id="milliseconds"),
        pytest.param("2.5", 2.5, id="plain seconds"),
        pytest.param("1.5m", 90, id="fractional minutes"),
    ],
)
def test_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5 minutes", "m5", "5x", "-1s", "0", "1h 30m", "inf", "nan"])
def test_bad_duration(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("vllm", ("vllm.service", None)),
        ("vllm-glm5.service=vllm", ("vllm-glm5.service", "vllm")),
        ("llama@1.service", ("llama@1.service", None)),
    ],
)
def test_unit(text, want):
    assert parse_unit(text) == want


@pytest.mark.parametrize("text", ["", "a b", "x/y", "=vllm"])
def test_bad_unit(text):
    with pytest.raises(ValueError, match="not a unit name"):
        parse_unit(text)


@pytest.mark.parametrize(
    ("text", "want"),
    [("127.0.0.1:9847", ("127.0.0.1", 9847)), ("[::1]:80", ("::1", 80)), (":9847", ("0.0.0.0", 9847))],
)
def test_listen(text, want):
    assert parse_listen(text) == want


@pytest.mark.parametrize("text", ["9847", "host:", "host:0", "host:70000", "host:http"])
def test_bad_listen(text):
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen(text)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        pytest.param(["wait", "vllm", "--unit", "other"], "unrecognized arguments: --unit other",
                     id="wait names its one unit as its argument, never with --unit"),
        pytest.param(["wait"], "the following arguments are required: UNIT", id="wait without a unit"),
        pytest.param(["status", "--stall.threshold", "soon"], "'soon' is not a duration", id="a bad duration"),
        pytest.param(["serve", "--no-such-flag"], "unrecognized arguments: --no-such-flag", id="an unknown flag"),
    ],
)
def test_bad_command_lines_exit_2_with_the_reason(argv, says, capsys):
    from exporter.shell import cli

    with pytest.raises(SystemExit) as exit:
        cli.main(argv)
    assert exit.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "stacks", "every"),
    [
        pytest.param([], False, 60, id="defaults: off; a silent unit looked at once a minute"),
        pytest.param(["--collector.stacks"], True, 60, id="on"),
        pytest.param(["--collector.stacks", "--silence.threshold", "4s", "--stall.threshold", "8s",
                      "--sample.interval", "1s"], True, 1, id="short thresholds: four looks between silence and stall"),
        pytest.param(["--silence.threshold", "10m", "--stall.threshold", "5m"], False, 2,
                     id="a stall threshold below the silence: every sample"),
    ],
)
def test_the_stacks_flag_and_how_often_a_silent_unit_is_looked_at(argv, stacks, every):
    from exporter.shell.cli import build_parser, config_from

    config = config_from(build_parser().parse_args(["serve", *argv]))
    assert (config.stacks, config.limits.stacks, config.limits.stack_every) == (stacks, stacks, every)
