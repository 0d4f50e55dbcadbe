"""Test session setup: 8 simulated CPU devices, float32 matmuls, strict dtype promotion.

The device count must be set before the JAX backend initialises, so this runs at import time.
"""

import os
import sys

from jaxtyping import install_import_hook

# Every lcx module is shape- and type-checked at runtime in tests (jaxtyping + beartype): the hook
# must be in place before the first `import lcx`, which is why it sits above everything else.
sys.path.insert(0, os.path.dirname(__file__))
install_import_hook("lcx", "_typecheck.typechecker")

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_default_matmul_precision", "highest")
jax.config.update("jax_numpy_dtype_promotion", "strict")

import pytest  # noqa: E402

from lcx.config import register  # noqa: E402

# the schemas and resolvers the YAML tree refers to, for tests that call Hydra's compose() (the
# entry points register them in lcx.cli.launch; importing lcx registers nothing)
register()


@pytest.fixture(scope="session")
def devices():
    d = jax.devices()
    assert len(d) == 8, f"tests need 8 simulated CPU devices, got {len(d)}"
    return d
