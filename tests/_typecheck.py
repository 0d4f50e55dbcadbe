"""The runtime type checker the test session installs over the whole ``lcx`` package.

``tests/conftest.py`` installs jaxtyping's import hook with this checker before anything imports
lcx, so every annotated function and dataclass in lcx checks its arguments (array shapes and
dtypes through jaxtyping, everything else through beartype) in every test. ``is_pep484_tower``
lets an ``int`` stand where ``float`` is annotated, as PEP 484's numeric tower says.
"""

from beartype import BeartypeConf, beartype

typechecker = beartype(conf=BeartypeConf(is_pep484_tower=True))
