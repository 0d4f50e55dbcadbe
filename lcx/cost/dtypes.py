"""Bytes per element of the dtypes the cost ledger prices."""

from __future__ import annotations

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (a name: ``float32``, ``bfloat16``, ...).

    Raises:
      ValueError: a dtype not in :data:`DTYPE_BYTES`.
    """
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]
