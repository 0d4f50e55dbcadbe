"""pyproject.toml's lower bounds are exactly the floor stack CI tests.

``.ci/run`` installs lcx on Python 3.11 with ``constraints/floor-py311.txt`` (through
``PIP_CONSTRAINT``) and runs the README's test command there, beside the current stack on Python
3.12. These tests keep the claim honest: every runtime dependency has a ``>=`` bound, the
constraints file pins each to exactly that bound, and, in the floor job, the installed versions
are the pinned ones.
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parent.parent
FLOOR = ROOT / "constraints" / "floor-py311.txt"


def _lower_bounds() -> dict[str, str]:
    """``{name: version}`` for each runtime dependency's ``>=`` bound in pyproject.toml."""
    bounds = {}
    for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(line)
        lower = [s.version for s in req.specifier if s.operator == ">="]
        assert len(lower) == 1, f"{line!r}: give exactly one '>=' lower bound (the floor CI tests)"
        bounds[canonicalize_name(req.name)] = lower[0]
    return bounds


def _pins() -> dict[str, str]:
    """``{name: version}`` for each ``name==version`` line of the floor constraints file."""
    pins = {}
    for raw in FLOOR.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"{FLOOR.name}: {raw!r} is not a 'name==version' pin"
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_pyproject_lower_bounds_are_the_floor_pins():
    bounds, pins = _lower_bounds(), _pins()
    differ = {n: (bounds.get(n), pins.get(n)) for n in bounds.keys() | pins.keys() if bounds.get(n) != pins.get(n)}
    assert not differ, (
        f"pyproject.toml bound vs {FLOOR.name} pin (name: (bound, pin)): {differ}; "
        "set both to the version the floor job tests"
    )


@pytest.mark.skipif(
    pathlib.Path(os.environ.get("PIP_CONSTRAINT", "/nonexistent")).resolve() != FLOOR.resolve(),
    reason="only in the floor job (PIP_CONSTRAINT=constraints/floor-py311.txt)",
)
def test_floor_job_runs_the_floor_versions():
    installed = {n: importlib.metadata.version(n) for n in _pins()}
    assert installed == _pins(), f"the floor job installed {installed}, not the floor pins"
