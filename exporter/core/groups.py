"""A start that spans hosts: its group, as the command lines of its processes and the engine's lines say it.

Each host's agent sees its own part of a start that runs as one engine on several hosts (vLLM's
`--nnodes`/`--node-rank`/`--master-addr`, SGLang's `--dist-init-addr`, torchrun's rendezvous). What makes
the parts one start is the place their hosts meet: the rendezvous address every host's command line and
lines name alike, which becomes the `group` label; with it, how many hosts there are and which one this is.
The fields are named the same wherever they are read: in the flags of exporter/grammars/launch.toml and in
the named groups of a grammar's rules (docs/fleet.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from exporter.core.model import Group

# What a flag pattern or a rule may read, by its named groups: the meeting place whole (`group_address`,
# `host:port`, a `tcp://` prefix dropped) or in parts (`group_host`, `group_port`); the number of hosts and
# this host's rank; and the ranks in all beside those on this host, from which the number of hosts follows.
FIELDS = frozenset({"group_address", "group_host", "group_port", "nnodes", "node_rank", "world_size",
                    "local_world_size"})
COUNTS = ("nnodes", "node_rank", "world_size", "local_world_size")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*://")


def read(fields: Mapping[str, str]) -> Group:
    """The group the fields say, as far as they say it. The address is taken as written (less its scheme and
    a trailing slash), never completed with a default port: every host's command line spells it alike, so
    that the same start has the same group on every host, however far each got."""
    address = fields.get("group_address")
    if address is None and (host := fields.get("group_host")):
        port = fields.get("group_port")
        address = f"{host}:{port}" if port else host
    if address is not None:
        address = SCHEME.sub("", address).rstrip("/") or None
    counts = {name: int(fields[name]) for name in COUNTS if fields.get(name, "").isdigit()}
    return Group(address=address, **counts)


def launched(flags: Iterable[re.Pattern[str]], cmdlines: Iterable[str]) -> Group:
    """The group the command lines of a start's processes say: each flag pattern searched in each command
    line, the first value of each field kept (the main process's command line comes first)."""
    fields: dict[str, str] = {}
    patterns = tuple(flags)
    for cmdline in cmdlines:
        for pattern in patterns:
            for found in pattern.finditer(cmdline):
                for name, value in found.groupdict().items():
                    if value is not None:
                        fields.setdefault(name, value)
    return read(fields)
