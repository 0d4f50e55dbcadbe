"""A persistent XLA compilation cache for one test module's in-process compiles.

``lcx.training.loop.train`` builds fresh jitted functions on every call, so two runs of the same
model and plan compile the same programs again (the model and optimizer initialisers, and the
train step when the schedule is the same too): ~13 s of a ~17 s tiny run on 2 cores. With the
cache on, the second compile of an identical program is a read from disk; programs that differ
(another plan, learning rate or step count) still compile, so nothing a test checks changes.
The subprocess tests do the same through ``JAX_COMPILATION_CACHE_DIR``.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Iterator

import jax
from jax.experimental.compilation_cache import compilation_cache

_OPTIONS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)


@contextlib.contextmanager
def compile_cache(path: pathlib.Path) -> Iterator[None]:
    """Cache every compile of this process in ``path`` (every entry, however quick or small),
    then restore the previous settings, so other test modules compile as before."""
    before = {k: getattr(jax.config, k) for k in _OPTIONS}
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()  # the cache is set up once per process: re-read the dir
    try:
        yield
    finally:
        for k, v in before.items():
            jax.config.update(k, v)
        compilation_cache.reset_cache()
