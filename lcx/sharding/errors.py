"""The error every refused plan raises (before anything compiles)."""

from __future__ import annotations


class PlanError(ValueError):
    """A plan that cannot work for the given devices, model or batch. Raised before compiling."""
