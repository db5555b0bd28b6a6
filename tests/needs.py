"""What a test needs from the machine (a tool `.ci/setup` installs, root): skipped where it is missing,
a failure under CI (`CI=true`), where a missing set-up step is a broken build, not a reason to skip.

    pytestmark = needs(shutil.which("promtool"), "promtool (Debian package prometheus)")
    ...
    if shutil.which("promtool") is None:
        missing("promtool (Debian package prometheus)")

tests/conftest.py applies the `needs` mark before each test, marks `system` the tests that need root,
and lists every skip, with its reason, at the end of the run.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

UNDER_CI = os.environ.get("CI", "").lower() == "true"


def missing(what: str) -> NoReturn:
    """Skip the test (or the module, at import) for want of `what`; under CI, fail instead."""
    __tracebackhide__ = True  # the skip is reported where the caller is
    if UNDER_CI:
        pytest.fail(f"missing under CI (CI=true): {what}; `bash .ci/setup`, run as root, provides it", pytrace=False)
    pytest.skip(what, allow_module_level=True)


def needs(found: object, what: str, root: bool = False) -> pytest.MarkDecorator:
    """A mark: the test runs only where `found` is true, for want of `what` it is skipped (failed under
    CI). `root`: it needs root (cgroups, a journald), and is marked `system` so `-m "not system"` skips it."""
    return pytest.mark.needs(bool(found), what, root=root)


def module(name: str, what: str) -> ModuleType:
    """Import a test dependency that `.ci/setup` installs (`what` says which package), or `missing`."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        missing(f"{what}: {error}")
