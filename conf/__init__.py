"""lcx's Hydra config tree, installed as the data package ``lcx.conf``.

pyproject.toml maps the package ``lcx.conf`` to this directory (``[tool.setuptools] package-dir``)
and ships its YAML as package data, so ``pkg://lcx.conf`` finds the same files in a checkout
(editable install) and in an installed wheel. Hydra's package config source needs this
``__init__.py``; nothing here is code. The schemas and checks are :mod:`lcx.config`.
"""
