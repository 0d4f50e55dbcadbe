"""Every snippet and command in README.md and docs/ (tutorials/ too) runs, as written, and tables are current.

Sybil (https://sybil.readthedocs.io) finds the fenced code blocks of each page; the evaluators
below run them, in page order, in a fresh temporary directory per page that links the checkout's
``README.md``, ``docs/``, ``conf/`` and ``experiments/`` (so a path a page names relative to the
checkout exists, and a later block sees what an earlier command wrote: checkpoints.md trains, then
loads the checkpoint in Python).

What runs, and how long commands are shortened:

* ```` ```python ```` blocks: each in a fresh ``python`` process, so a block that needs 8 simulated
  CPU devices must set them up itself (as README's does); nothing of this test process leaks in.
  On a page whose commands write a checkpoint (``checkpoint.dir=``), its Python blocks after the
  first such command read that checkpoint, so they run in the slow test, after the commands have
  run for real; its blocks before it write the commands' inputs (a tutorial's tokenizer, corpus
  and model), so they run in both tests, before the commands are validated or run.
* ```` ```bash ```` blocks: every ``python -m lcx.train|plan|extend|eval ...`` command.
  Fast test: composed in this process with Hydra and validated as the entry point does before it
  touches a device: ``lcx.train`` with ``train.dry_run=true`` appended (the plan validated and the
  step's memory checked by the cost ledger, nothing compiled), ``lcx.extend`` / ``lcx.eval`` up to
  their first device, ``lcx.plan`` run whole (it is arithmetic). A multirun (``-m``) is validated
  job by job. Slow test (``@pytest.mark.slow``): each ``lcx.train`` / ``lcx.extend`` /
  ``lcx.eval`` command on ``hardware=cpu`` runs in a subprocess and must exit 0, shortened by
  appending :data:`SHORT` (which wins over the command's own value of the same key, so a
  multirun's sweep over ``train.seq_len`` runs its jobs at 256 tokens; ``model.n_layers`` is left
  out for ``model=hf``, whose checkpoint fixes the depth). It runs the pages whose
  commands depend on one another (one writes a checkpoint the next, or a Python block, reads:
  checkpoints.md, cluster.md's submitit_local multirun, long_context_features.md's extend then
  eval, docs/tutorials/extend_a_checkpoint.md from its inputs to its heat map), in order, and README's quick start; ``LCX_DOCS_RUN_ALL=1`` also runs every other
  command for real, each as its own test (18 tests, about 10 minutes at -n 2 on 2 loaded cores,
  against 3.5 for the default set).
* ```` ```text ```` blocks with ``$ python -m ...`` lines are documented refusals: the command
  must exit 2 and print the first line of the output the page shows.
* Not run: ``pip install ...`` (the environment is already installed), ``python -m pytest``
  (this suite), ``gcloud ...`` (needs a TPU VM: the ``lcx.train`` command inside it is validated),
  ``hydra/launcher=slurm`` multiruns and non-CPU hardware beyond validation (need the cluster).
  Placeholders (``<your corpus>``) are replaced by :data:`PLACEHOLDERS`.

* Commands quoted in running text (`` `python -m lcx.train train.seq_len=4095` ``): an ``lcx`` one
  must compose (every key and config group exists), an ``experiments/`` script must exist and
  know each ``--flag`` it is given; they are not run (the experiments take minutes to hours:
  ``docs/experiments.md``).

``python experiments/report.py --check`` runs too: a table that no longer matches its CSV in
``experiments/results/`` fails the suite.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import itertools
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
from sybil import Region, Sybil
from sybil.parsers.markdown import CodeBlockParser, SkipParser

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [
    "README.md",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "tutorials").glob("*.md")),
]
LINKED = ("README.md", "docs", "conf", "experiments", "tests")

SHORT = {
    "lcx.train": ["train.steps=1", "model.n_layers=1", "train.seq_len=256", "train.eval_every=0"],
    "lcx.extend": [
        "schedule.stages.0.steps=1",
        "schedule.stages.1.steps=1",
        "schedule.stages.1.warmup_steps=0",
        "model.n_layers=1",
        "train.eval_every=0",
    ],
    "lcx.eval": ["eval.lengths=[1024]", "eval.depths=[0.5]", "eval.per_depth=1"],
}
"""Overrides appended to a command in the slow test (the fast test appends ``train.dry_run=true``)."""

PLACEHOLDERS = {
    "<your preset>": "tpu_v5p hardware.chips=32",  # 4 nodes x 8 accelerators; checked against HBM, not this RAM
    "<a directory every host can write>": "ckpt",
    "<your corpus>": "README.md",
}
"""What a page's ``<...>`` placeholder stands for when its command is validated."""

ENTRY = {
    "lcx.train": "train",
    "lcx.plan": "plan",
    "lcx.extend": "extend",
    "lcx.eval": "evaluate",
    "lcx.export": "export",
}
CONFIG = {
    "lcx.train": "config",
    "lcx.plan": "plan_config",
    "lcx.extend": "config",
    "lcx.eval": "eval_config",
    "lcx.export": "export_config",
    "lcx.generate": "generate_config",
}
COMMAND = re.compile(r"python -m (lcx\.\w+)(.*)")
NOT_RUN = re.compile(r"^\s*(pip install|python -m pytest|gcloud|cd |#|$)")


class _Validated(Exception):
    """Raised in place of starting devices: everything before it was validated."""


def _commands(source: str) -> list[tuple[str, list[str]]]:
    """The ``python -m lcx.<tool>`` commands of a block: (tool, arguments), placeholders replaced."""
    out = []
    for line in source.replace("\\\n", " ").splitlines():
        m = COMMAND.search(line)
        if m is None:
            continue
        rest = m.group(2)
        for k, v in PLACEHOLDERS.items():
            rest = rest.replace(k, v)
        if rest.count("'") % 2:  # the closing quote of gcloud's --command='...'
            rest = rest[: rest.rindex("'")]
        out.append((m.group(1), shlex.split(rest, comments=True)))
    return out


def _jobs(args: list[str]) -> list[list[str]]:
    """The override lists of the jobs a command launches: one, or a multirun's sweep expanded."""
    if "-m" not in args:
        return [args]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([a for a in args if a != "-m"])
    choices = [
        [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.input_line]
        for o in parsed
    ]
    return [list(c) for c in itertools.product(*choices)]


def _compose(tool: str, overrides: list[str]):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="lcx.conf", version_base="1.3"):
        return compose(config_name=CONFIG[tool], overrides=overrides)


def _validate(tool: str, args: list[str], tmp: pathlib.Path) -> None:
    """Compose the command in process and run its entry point up to its first device."""
    from lcx import cli
    from lcx.config.schema import check_overrides

    check_overrides([a for a in args if a != "-m"], tool)
    fn = getattr(importlib.import_module(tool), ENTRY[tool])
    for job in _jobs(args):
        cfg = _compose(tool, [*job, "train.dry_run=true"] if tool == "lcx.train" else job)
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(tmp)  # relative paths a page's command names (model.path=hf/...) are the page's
            mp.setattr(cli, "output_dir", lambda: str(tmp / "run"))
            mp.setattr(cli, "start_devices", lambda *a, **k: (_ for _ in ()).throw(_Validated()))
            with contextlib.suppress(_Validated), contextlib.redirect_stdout(io.StringIO()):
                fn(cfg)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES", "PYTEST_ADDOPTS", "HYDRA_FULL_ERROR"):
        env.pop(k, None)  # nothing that would stand in for a block's own device set-up
    return env


def _run(argv: list[str], cwd: pathlib.Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def _runs_here(tool: str, args: list[str]) -> bool:
    """Whether the slow test runs the command for real (a CPU run, not a cluster or a TPU preflight)."""
    if tool == "lcx.plan" or "train.dry_run=true" in args or "hydra/launcher=slurm" in args:
        return False
    cfg = _compose(tool, _jobs(args)[0])
    return str(cfg.hardware.name) == "cpu"


def run_bash(example) -> str | None:
    ns = example.namespace
    if "gcloud" not in example.parsed:
        for line in example.parsed.replace("\\\n", " ").splitlines():
            if not (NOT_RUN.match(line) or COMMAND.search(line)):
                return f"{example.path}:{example.line}: no runner for {line!r} (tests/test_docs.py)"
    for tool, args in _commands(example.parsed):
        if "plan.attention.kernel=tokamax" in args and importlib.util.find_spec("tokamax") is None:
            ns["skipped"].append(f"{tool} {' '.join(args)} (tokamax is not installed: Python < 3.12)")
            continue
        ns["commands"] += 1
        if "checkpoint.dir=" in " ".join(args):
            ns["writes_files"] = True
        if ns["tier"] == "fast":
            _validate(tool, args, ns["tmp"])
        else:
            failure = _run_short(tool, args, ns["tmp"])
            if failure:
                return f"{example.path}:{example.line}: {failure}"
    return None


def _run_short(tool: str, args: list[str], cwd: pathlib.Path) -> str | None:
    """Run a command for real, shortened by :data:`SHORT`; None, or what went wrong."""
    if not _runs_here(tool, args):
        return None
    short = _short(tool, args)
    p = _run([sys.executable, "-m", tool, *args, *short], cwd)
    if p.returncode != 0:
        return f"{tool} {' '.join(args + short)} exited {p.returncode}:\n{p.stderr[-3000:]}"
    return None


def _short(tool: str, args: list[str]) -> list[str]:
    """:data:`SHORT`'s overrides for a command; a ``model=hf`` checkpoint keeps its own depth."""
    if "model=hf" in args:
        return [o for o in SHORT.get(tool, []) if not o.startswith("model.n_layers=")]
    return SHORT.get(tool, [])


def run_refusals(example) -> str | None:
    """``$ cmd`` lines in a text block: the command exits 2 with the first line shown after it."""
    ns = example.namespace
    blocks = re.split(r"^\$ ", example.parsed, flags=re.M)[1:]
    if ns["tier"] != "fast":
        return None
    for block in blocks:
        command, _, shown = block.partition("\n")
        tool, args = _commands(command)[0]
        ns["commands"] += 1
        p = _run([sys.executable, "-m", tool, *args], ns["tmp"])
        said = " ".join((p.stdout + p.stderr).split())
        first = " ".join(shown.splitlines()[0].split())
        if p.returncode != 2 or first not in said:
            return f"{example.path}:{example.line}: {command!r} exited {p.returncode}, expected 2 and {first!r}; said {said[-2000:]!r}"
    return None


def run_python(example) -> str | None:
    ns = example.namespace
    if ns["tier"] == "fast" and ns.get("writes_files", False):
        return None  # it reads a checkpoint the slow test writes
    # the slow test runs only pages that write checkpoints: every block, in page order
    ns["snippets"] += 1
    p = _run([sys.executable, "-c", example.parsed], ns["tmp"])
    if p.returncode != 0:
        return f"{example.path}:{example.line}: the Python block exited {p.returncode}:\n{p.stderr[-3000:]}"
    return None


INLINE = re.compile(r"`(python (?:-m lcx\.\w+|experiments/\w+\.py)[^`]*)`")


def check_inline(example) -> str | None:
    """A command quoted in running text: an ``lcx`` one composes (every key and group exists), an
    ``experiments/`` script exists and knows every ``--flag`` it is given."""
    if example.namespace["tier"] != "fast":
        return None
    text = " ".join(example.parsed.split())
    example.namespace["inline"] += 1
    if text.startswith("python experiments/"):
        script, *args = shlex.split(text)[1:]
        source = (ROOT / script).read_text() if (ROOT / script).is_file() else None
        if source is None:
            return f"{example.path}:{example.line}: {script} does not exist"
        unknown = [a for a in args if a.startswith("--") and f'"{a.split("=")[0]}"' not in source]
        return f"{example.path}:{example.line}: {script} has no {unknown}" if unknown else None
    if "<" in text:  # a pattern such as experiment=<name>, not a command
        return None
    ((tool, args),) = _commands(text)
    from lcx.config.schema import check_overrides

    check_overrides([a for a in args if a != "-m"], tool)
    for job in _jobs(args):
        _compose(tool, job)
    return None


def inline_commands(document):
    """Sybil parser: the inline code spans of running text that are commands."""
    for m in INLINE.finditer(document.text):
        yield Region(m.start(), m.end(), m.group(1), check_inline)


SYBIL = Sybil(
    parsers=[
        CodeBlockParser("python", run_python),
        CodeBlockParser("bash", run_bash),
        CodeBlockParser("text", run_refusals),
        SkipParser(),
        inline_commands,
    ]
)


def _page(page: str, tier: str, tmp_path: pathlib.Path) -> dict:
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    document = SYBIL.parse(ROOT / page)
    document.namespace.update(tier=tier, tmp=tmp_path, commands=0, snippets=0, inline=0, skipped=[])
    for example in document:
        example.evaluate()
    return document.namespace


@pytest.mark.parametrize("page", PAGES)
def test_page_commands_validate_and_snippets_run(page, tmp_path):
    ns = _page(page, "fast", tmp_path)
    for s in ns["skipped"]:
        print(f"{page}: not run: {s}")


def _slow_units() -> tuple[list[str], list[tuple[str, int]]]:
    """Pages whose commands depend on one another (one writes a checkpoint that the next, or a
    Python block, reads) run as a whole; every other command runs on its own."""
    pages, commands, seen = [], [], set()
    for page in PAGES:
        found = [c for ex in SYBIL.parse(ROOT / page) if ex.region.evaluator is run_bash for c in _commands(ex.parsed)]
        if any("checkpoint.dir=" in " ".join(args) for _, args in found):
            pages.append(page)
            continue
        for i, (tool, args) in enumerate(found):
            if tool == "lcx.plan" or "train.dry_run=true" in args:
                continue  # the fast test ran it whole
            if (tool, *args) not in seen:  # the same command on two pages runs once
                seen.add((tool, *args))
                commands.append((page, i))
    if os.environ.get("LCX_DOCS_RUN_ALL") != "1":
        commands = commands[:1]  # README's quick start; the rest are dry-run validated by the fast test
    return pages, commands


SLOW_PAGES, SLOW_COMMANDS = _slow_units()


@pytest.mark.slow
@pytest.mark.parametrize("page", SLOW_PAGES)
def test_page_commands_run(page, tmp_path):
    _page(page, "slow", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("page,index", SLOW_COMMANDS)
def test_command_runs(page, index, tmp_path):
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    found = [c for ex in SYBIL.parse(ROOT / page) if ex.region.evaluator is run_bash for c in _commands(ex.parsed)]
    tool, args = found[index]
    if "plan.attention.kernel=tokamax" in args and importlib.util.find_spec("tokamax") is None:
        pytest.skip("kernel=tokamax needs tokamax (Python >= 3.12)")
    if not _runs_here(tool, args):
        pytest.skip(f"{tool} {' '.join(args)}: validated only (a cluster, a TPU preset or lcx.plan)")
    failure = _run_short(tool, args, tmp_path)
    assert failure is None, f"{page}: {failure}"


def test_tables_match_their_csvs():
    p = _run([sys.executable, str(ROOT / "experiments" / "report.py"), "--check"], ROOT, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
