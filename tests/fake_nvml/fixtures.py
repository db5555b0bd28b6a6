"""Pytest fixtures and a state-file writer for the fake libnvidia-ml.so.1 (see README.md here).

Import the fixtures into a conftest.py to use them:

    from tests.fake_nvml.fixtures import fake_nvml, fake_nvml_lib, fake_nvml_lib_no_v3  # noqa: F401

pynvml loads libnvidia-ml.so.1 once per process, through the dynamic loader, which reads
LD_LIBRARY_PATH when the process starts: run the program under test in a subprocess with
`env=nvml.env()`.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

import pytest

from tests.fake_nvml.build import LIBRARY, BuildUnavailable, build
from tests.needs import missing

GiB = 2**30
H200_MEMORY = 143_771 * 2**20  # an H200's total as NVML reports it (nvidia-smi: 143771MiB)
KINDS = ("compute", "graphics", "mps")


def default_uuid(index: int) -> str:
    return f"GPU-{0x0F3C0000 + index:08x}-7a1e-4b2c-9d3f-{0xA0C0FFEE0000 + index:012x}"


def default_bus_id(index: int) -> str:
    return f"00000000:{0x18 + 0x10 * index:02X}:00.0"


@dataclass
class Device:
    """One GPU. uuid and pci_bus_id default from its index when left empty."""

    uuid: str = ""
    name: str = "NVIDIA H200"
    pci_bus_id: str = ""
    memory_total: int | None = H200_MEMORY  # None: no `memory` line, NVML says NotSupported
    memory_used: int = 0
    utilization: tuple[int, int] | None = (0, 0)  # (gpu %, memory %); None: NotSupported
    lost: bool = False


@dataclass
class Process:
    gpu: int
    pid: int
    used: int | None  # bytes; None: NVML_VALUE_NOT_AVAILABLE, which pynvml turns into None
    kind: str = "compute"  # compute | graphics | mps


@dataclass
class Xid:
    gpu: int
    xid: int
    seq: int


@dataclass
class FakeNvml:
    """The fake driver's state, written to state_path atomically (temp file + rename).

    Change the fields and call write(), or call the helpers (each writes at once). A program
    that uses the fake sees every write on its next NVML call.
    """

    state_path: Path
    lib_dir: Path | None = None
    driver_version: str = "550.54.15"
    init: str | int = "ok"  # or an NVML return code for nvmlInit* to return (9, 18, ...)
    devices: list[Device] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)  # NVML function names that block
    failing: dict[str, int] = field(default_factory=dict)  # NVML function name → return code
    xids: list[Xid] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)  # raw lines appended as they are

    def __post_init__(self) -> None:
        self.state_path = Path(self.state_path)
        if self.lib_dir is not None:
            self.lib_dir = Path(self.lib_dir)

    # -- the file --------------------------------------------------------------------------------

    def render(self) -> str:
        lines = [f"driver_version {self.driver_version}", f"init {self.init}"]
        for index, device in enumerate(self.devices):
            uuid = device.uuid or default_uuid(index)
            bus_id = device.pci_bus_id or default_bus_id(index)
            lines.append(f"device {index} {uuid} {bus_id} {device.name}")
            if device.memory_total is not None:
                lines.append(f"memory {index} {device.memory_total} {device.memory_used}")
            if device.utilization is not None:
                lines.append(f"utilization {index} {device.utilization[0]} {device.utilization[1]}")
            if device.lost:
                lines.append(f"lost {index}")
        for p in self.processes:
            if p.kind not in KINDS:
                raise ValueError(f"process kind {p.kind!r} is not one of {KINDS}")
            lines.append(f"process {p.gpu} {p.pid} {'na' if p.used is None else p.used} {p.kind}")
        lines += [f"block {fn}" for fn in self.blocked]
        lines += [f"fail {fn} {int(code)}" for fn, code in self.failing.items()]
        lines += [f"xid {x.gpu} {x.xid} {x.seq}" for x in self.xids]
        lines += self.extra
        return "\n".join(lines) + "\n"

    def write(self) -> None:
        self.write_text(self.render())

    def write_text(self, text: str) -> None:
        """Replace the state file with text (any state, even a malformed one), atomically."""
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.state_path.name}.", dir=self.state_path.parent)
        try:
            with os.fdopen(fd, "w") as file:
                file.write(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.state_path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """base (default os.environ) with FAKE_NVML_STATE and the fake first on LD_LIBRARY_PATH."""
        env = dict(os.environ if base is None else base)
        env["FAKE_NVML_STATE"] = str(self.state_path)
        if self.lib_dir is not None:
            paths = [str(self.lib_dir), *filter(None, env.get("LD_LIBRARY_PATH", "").split(":"))]
            env["LD_LIBRARY_PATH"] = ":".join(paths)
        return env

    # -- helpers, each writes the file ----------------------------------------------------------

    def add_device(self, **fields: object) -> int:
        """Append a Device(**fields); returns its index."""
        self.devices.append(Device(**fields))  # type: ignore[arg-type]
        self.write()
        return len(self.devices) - 1

    def add_process(self, gpu: int, pid: int, used: int | None, kind: str = "compute") -> None:
        self.processes.append(Process(gpu, pid, used, kind))
        self.write()

    def remove_processes(self, pid: int, gpu: int | None = None) -> None:
        self.processes = [p for p in self.processes if not (p.pid == pid and gpu in (None, p.gpu))]
        self.write()

    def set_memory(self, gpu: int, used: int, total: int | None = None) -> None:
        device = self.devices[gpu]
        device.memory_used = used
        if total is not None:
            device.memory_total = total
        self.write()

    def set_init(self, result: str | int) -> None:
        """"ok", or the NVML return code nvmlInit* returns (e.g. 9 DRIVER_NOT_LOADED)."""
        self.init = result
        self.write()

    def lose(self, gpu: int) -> None:
        self.devices[gpu].lost = True
        self.write()

    def recover(self, gpu: int) -> None:
        self.devices[gpu].lost = False
        self.write()

    def block(self, function: str) -> None:
        """Make every call of this NVML function (exact exported name) hang until unblock()."""
        if function not in self.blocked:
            self.blocked.append(function)
        self.write()

    def unblock(self, function: str) -> None:
        self.blocked = [fn for fn in self.blocked if fn != function]
        self.write()

    @contextmanager
    def blocking(self, function: str) -> Iterator[None]:
        self.block(function)
        try:
            yield
        finally:
            self.unblock(function)

    def fail(self, function: str, code: int) -> None:
        """Make this NVML function return code (e.g. 999 UNKNOWN, 3 NOT_SUPPORTED)."""
        self.failing[function] = int(code)
        self.write()

    def unfail(self, function: str) -> None:
        self.failing.pop(function, None)
        self.write()

    def xid(self, gpu: int, xid: int) -> int:
        """Raise a critical Xid on gpu; returns its sequence number. Each is delivered once per
        event set by nvmlEventSetWait_v2."""
        seq = max((x.seq for x in self.xids), default=0) + 1
        self.xids.append(Xid(gpu, xid, seq))
        self.write()
        return seq


def _build_or_skip(out_dir: Path, no_v3: bool) -> Path:
    try:
        build(out_dir, no_v3=no_v3)
    except BuildUnavailable as error:
        missing(f"cannot build the fake NVML: {error}")
    return out_dir


@pytest.fixture(scope="session")
def fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the fake libnvidia-ml.so.1, built once per session; for LD_LIBRARY_PATH.

    Skipped where gcc or the nvml.h of nvidia-nvml-dev is missing (failed under CI); a compile error fails.
    """
    directory = _build_or_skip(tmp_path_factory.mktemp("fake_nvml"), no_v3=False)
    assert (directory / LIBRARY).is_file()
    return directory


@pytest.fixture(scope="session")
def fake_nvml_lib_no_v3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As fake_nvml_lib, built with -DFAKE_NVML_NO_V3: no _v3 process listings (an older driver)."""
    return _build_or_skip(tmp_path_factory.mktemp("fake_nvml_no_v3"), no_v3=True)


@pytest.fixture
def fake_nvml(fake_nvml_lib: Path, tmp_path: Path) -> FakeNvml:
    """A FakeNvml on tmp_path/nvml.state using fake_nvml_lib, already written: driver loaded, no GPU."""
    nvml = FakeNvml(tmp_path / "nvml.state", fake_nvml_lib)
    nvml.write()
    return nvml
