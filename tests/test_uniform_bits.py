"""Uniform (one-kind) models are bitwise the program they were before layer kinds.

``tests/fixtures/uniform_model_bits.json`` was recorded (``tests/_uniform_bits.py``) from the code
before the forward scanned over layer-pattern periods: the loss, the logits and every gradient
leaf of eight tiny configs on one device, and one under a ring plan on 8 simulated devices. Each
must come out bit for bit the same. The bits depend on the JAX version and the CPU's instruction
set, so a machine whose environment has no record skips, naming both.
"""

from __future__ import annotations

import json

import _uniform_bits as U
import pytest
from _compile_cache import compile_cache


@pytest.fixture(scope="module")
def recorded():
    data = json.loads(U.FIXTURE.read_text())
    env = U.environment()
    if env not in data:
        pytest.skip(
            f"no uniform-model bits recorded for [{env}] (recorded: {sorted(data)}); run tests/_uniform_bits.py"
        )
    return data[env]


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    with compile_cache(tmp_path_factory.mktemp("xla_cache")):
        yield


@pytest.mark.parametrize("name", sorted(U.configs()))
def test_uniform_model_is_bitwise_unchanged(recorded, name):
    one, _ = U.plans()
    assert U.record(U.configs()[name], one) == recorded[name]


def test_uniform_model_under_ring_is_bitwise_unchanged(recorded, devices):
    _, ring = U.plans()
    assert U.record(U.ring_config(), ring) == recorded[f"ring8_{U.RING_CONFIG}"]


def test_fingerprint_tells_one_ulp():
    """The fingerprint is bitwise: one ULP in one element changes it (so the test above can fail)."""
    import numpy as np

    a = np.linspace(-1, 1, 64, dtype=np.float32)
    b = a.copy()
    b[17] = np.nextafter(b[17], np.float32(2))
    assert U.fingerprint(a) != U.fingerprint(b)
