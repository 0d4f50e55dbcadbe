"""The edge of lcx: the composed Hydra config turned into typed, frozen values, once.

Each entry point calls one reader of :mod:`lcx.config.run` (:func:`run_config` for ``lcx.train``,
:func:`schedule_config` for ``lcx.extend``, :func:`plan_query`, :func:`eval_query`, :func:`export_query`, :func:`generate_query`) and
hands each function the section it needs; below the entry points and this package nothing reads
OmegaConf. The typed classes live with the code that reads them and are the schema
(:mod:`lcx.config.sections`, checked by :mod:`lcx.config.schema`; the plan's:
:mod:`lcx.config.plan`).

The YAML tree is not here: it lives in the repository's top-level ``conf/``, installed as the data
package ``lcx.conf`` (pyproject ``[tool.setuptools] package-dir``) and found by Hydra through
``pkg://lcx.conf``. Importing this package registers nothing; the entry points call
:func:`register` (:func:`lcx.cli.launch`), and so must any code that composes with Hydra's
``compose`` API (tests/conftest.py does, for the tests).
"""

import secrets

from lcx.config.run import eval_query, export_query, generate_query, plan_query, run_config, schedule_config, stages


def register() -> None:
    """Register, once per process (later calls change nothing), what the YAML tree refers to:

    - ``plan/schema`` (:func:`lcx.config.plan.register_schema`), the base of every ``plan=`` preset;
    - ``schema/<name>`` (:func:`lcx.config.sections.register_schemas`): train, checkpoint, data, ...;
    - the ``${lcx_uid:}`` resolver: six random hex digits, drawn once per process (cached), in the
      default run and sweep directories next to a microsecond time, so two runs launched in the
      same second (or the same microsecond, on two machines sharing a file system) never share a
      directory.
    """
    from omegaconf import OmegaConf

    from lcx.config.plan import register_schema
    from lcx.config.sections import register_schemas

    register_schema()
    register_schemas()
    if not OmegaConf.has_resolver("lcx_uid"):
        OmegaConf.register_new_resolver("lcx_uid", lambda: secrets.token_hex(3), use_cache=True)


__all__ = [
    "eval_query",
    "export_query",
    "generate_query",
    "plan_query",
    "register",
    "run_config",
    "schedule_config",
    "stages",
]
