"""Build the fake libnvidia-ml.so.1 (fake_nvml.c beside this file) against the official nvml.h.

The header comes from the pip package nvidia-nvml-dev (in the project's `test` extra); it is
never copied into the repository. By hand:

    python tests/fake_nvml/build.py OUT_DIR [--no-v3]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIBRARY = "libnvidia-ml.so.1"
HEADER_PACKAGE = "nvidia-nvml-dev"
OLDER_HEADER_PACKAGES = ("nvidia-nvml-dev-cu12", "nvidia-nvml-dev-cu11")  # same header, older names
CFLAGS = ["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-pthread"]


class BuildUnavailable(RuntimeError):
    """What the build needs is not on this machine (gcc, or the nvml.h of nvidia-nvml-dev)."""


def find_header() -> Path:
    """nvml.h as installed by nvidia-nvml-dev (e.g. site-packages/nvidia/cu13/include/nvml.h).

    $FAKE_NVML_HEADER, when set, names the header (or the folder holding it) instead.
    """
    override = os.environ.get("FAKE_NVML_HEADER")
    if override:
        path = Path(override)
        path = path / "nvml.h" if path.is_dir() else path
        if not path.is_file():
            raise BuildUnavailable(f"FAKE_NVML_HEADER={override}: no nvml.h there")
        return path
    for name in (HEADER_PACKAGE, *OLDER_HEADER_PACKAGES):
        try:
            distribution = importlib.metadata.distribution(name)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    else:
        raise BuildUnavailable(
            f"nvml.h not found: the pip package {HEADER_PACKAGE} is not installed in {sys.prefix} "
            f"(pip install {HEADER_PACKAGE}, or install the project's test extra)"
        )
    headers = sorted(
        Path(distribution.locate_file(f)) for f in distribution.files or () if f.name == "nvml.h"
    )
    for header in headers:
        if header.is_file():
            return header
    raise BuildUnavailable(
        f"{distribution.metadata['Name']} {distribution.version} is installed but ships no nvml.h "
        f"(looked for */nvml.h in its file list: {[str(h) for h in headers] or 'none'})"
    )


def find_gcc() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildUnavailable("gcc not found on PATH (apt-get install gcc)")
    return gcc


def build(out_dir: Path, no_v3: bool = False) -> Path:
    """Compile the fake into out_dir/libnvidia-ml.so.1 and return that path.

    no_v3 leaves out the _v3 process listings (-DFAKE_NVML_NO_V3), as on an older driver.
    Raises BuildUnavailable when gcc or the header is missing, and RuntimeError with gcc's output
    when the code does not compile (a bug to fix, not a reason to skip).
    """
    header = find_header()
    gcc = find_gcc()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / LIBRARY
    # Compile next to the target and rename: a program loading the library never sees half of it.
    fd, tmp = tempfile.mkstemp(prefix=f".{LIBRARY}.", dir=out_dir)
    os.close(fd)
    command = [
        gcc,
        *CFLAGS,
        f"-I{header.parent}",
        *(["-DFAKE_NVML_NO_V3"] if no_v3 else []),
        f"-Wl,-soname,{LIBRARY}",
        "-o",
        tmp,
        str(SOURCE),
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(
                f"building the fake NVML failed ({' '.join(command)}):\n{result.stdout}{result.stderr}"
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("out_dir", type=Path, help=f"folder to write {LIBRARY} into")
    parser.add_argument("--no-v3", action="store_true", help="leave out the _v3 process listings")
    args = parser.parse_args(argv)
    try:
        print(build(args.out_dir, no_v3=args.no_v3))
    except (BuildUnavailable, RuntimeError) as error:
        print(f"build.py: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
