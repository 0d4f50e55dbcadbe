"""Every config key an entry point reads is known and typed (lcx.config.schema): a misspelt key,
with or without ``+``, is refused naming the nearest valid key; a wrong type is refused; the
values live only in the YAML files."""

import dataclasses
import pathlib
import subprocess
import sys

import pytest
import yaml
from hydra import compose, initialize_config_module

from lcx.config import run_config
from lcx.config import schema as S
from lcx.config.sections import DATA_CONFIGS, SECTIONS
from lcx.reports.config import EvalCheckpointConfig

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"


def _compose(*overrides, name="config"):
    with initialize_config_module("lcx.conf", version_base="1.3"):
        return compose(name, overrides=list(overrides))


@pytest.mark.parametrize(
    "override, nearest",
    [
        ("+train.stpes=1", "train.steps"),
        ("+checkpoint.evry=1", "checkpoint.every"),
        ("+data.val_fractoin=0.5", "data.val_fraction"),
        ("+hardware.cpu_device=4", "hardware.cpu_devices"),
        ("+distributed.num_process=2", "distributed.num_processes"),
        ("+memory.vocab_tilling=4", "memory.vocab_tiling"),
    ],
)
def test_appended_misspelt_keys_are_refused_naming_the_nearest(override, nearest):
    # the four of issue 17 exited 0 and trained exactly as without them
    key = override.lstrip("+").split("=")[0]
    with pytest.raises(ValueError, match=rf"{key}: unknown key; did you mean {nearest}\?"):
        run_config(_compose(override))


@pytest.mark.parametrize(
    "override, match",
    [
        ("train.steps=1.5", r"train.steps=1.5: must be a whole number"),
        ("train.lr=fast", r"train.lr='fast': must be a number"),
        ("checkpoint.async_save=no", r"checkpoint.async_save='no': must be true or false"),
        ("checkpoint.every=often", r"checkpoint.every='often': must be a whole number"),
        ("distributed.auto=1", r"distributed.auto=1: must be true or false"),
        ("hardware.cpu_devices=4.5", r"hardware.cpu_devices=4.5: must be a whole number"),
        ("data.val_fraction=[1]", r"data.val_fraction=\[1\]: must be a number"),
    ],
)
def test_wrong_types_are_refused(override, match):
    with pytest.raises(ValueError, match=match):
        run_config(_compose(override))


def test_model_layer_pattern_is_typed_from_yaml_and_the_command_line():
    """model.layer_pattern (a list of layer kinds, lcx.models.kinds) from a preset's YAML and from
    a Hydra override becomes a tuple of LayerKind; the resolved run stores its YAML form."""
    from lcx.models import LayerKind

    run = run_config(_compose("model=tiny_hybrid"))
    assert run.model.layer_pattern == (LayerKind("sliding", window=512),) * 2 + (LayerKind(),)
    assert run.resolved["model"]["layer_pattern"] == [
        {"kind": "sliding", "window": 512, "repeat": 2},
        {"kind": "global"},
    ]
    run = run_config(
        _compose(
            "model=tiny", "model.layer_pattern=[{kind: chunked, chunk: 64, repeat: 3}, {kind: global, rope: false}]"
        )
    )
    assert run.model.layer_pattern == (LayerKind("chunked", chunk=64),) * 3 + (LayerKind(rope=False),)
    assert run_config(_compose("model=tiny")).model.layer_pattern is None
    with pytest.raises(ValueError, match=r"model.layer_pattern\[0\]: layer kind sliding needs window"):
        run_config(_compose("model=tiny", "model.layer_pattern=[{kind: sliding}]"))
    with pytest.raises(ValueError, match=r"model.layer_pattern\[1\].windw: unknown key; did you mean window\?"):
        run_config(_compose("model=tiny", "model.layer_pattern=[{kind: global}, {kind: sliding, windw: 8}]"))


def test_every_shipped_config_fits_its_schema():
    run_config(_compose())
    for data in ("stdlib", "passkey"):
        run_config(_compose(f"data={data}"))
    for data in ("text", "jsonl", "parquet", "arrayrecord"):
        run_config(_compose(f"data={data}", "data.paths=[a.txt]"))  # data.paths is mandatory (???)
        with pytest.raises(ValueError, match=r"data.paths is required by lcx.train and unset: add data.paths=<value>"):
            run_config(_compose(f"data={data}"))
    for exp in sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")):
        cfg = _compose(f"experiment={exp}")
        if exp == "length_extension_study":  # model=hf: the base to extend is named on the command line
            with pytest.raises(ValueError, match=r"model=hf needs model.path=DIR"):
                run_config(cfg)
            continue
        if cfg.get("analysis_script") is None:
            run_config(cfg)
            continue
        # an analysis-only experiment is refused by lcx.train, naming its script
        assert exp in ("load_balance", "ledger_reproduction", "ledger_calibration"), exp
        with pytest.raises(ValueError, match=f"trains nothing.*python experiments/{exp}.py"):
            run_config(cfg)
    for hw in ("cpu", "tpu_v5p", "tpu7"):
        S.typed(_compose(f"hardware={hw}").hardware, SECTIONS["hardware"], "hardware")
    c = _compose("checkpoint.dir=x", name="eval_config")
    S.typed(c.eval, SECTIONS["eval"], "eval")
    S.typed(c.checkpoint, EvalCheckpointConfig, "checkpoint")
    c = _compose(name="plan_config")
    S.typed(c.planner, SECTIONS["planner"], "planner")
    S.typed(c.memory, SECTIONS["memory"], "memory")


def test_defaults_live_in_one_place():
    # every field without a code default is set by the YAML file of its section, and the YAML
    # sets no key the schema lacks: the values exist once, in conf/
    top = yaml.safe_load((CONF / "config.yaml").read_text())
    for section in ("train", "checkpoint", "distributed"):
        fields = {f.name for f in dataclasses.fields(SECTIONS[section])}
        required = {f.name for f in dataclasses.fields(SECTIONS[section]) if f.default is dataclasses.MISSING}
        assert set(top[section]) <= fields and required <= set(top[section]), section
    for name, schema in DATA_CONFIGS.items():
        fields = {f.name for f in dataclasses.fields(schema)}
        own = yaml.safe_load((CONF / "data" / f"{name}.yaml").read_text())
        if "defaults" in own:  # a thin preset (data=parquet): its base's values, a few of its own
            (base,) = [d for d in own.pop("defaults") if d != "_self_"]
            assert DATA_CONFIGS[base] is schema and set(own) < fields, name
            continue
        assert set(own) == fields, name
    from lcx.training.config import CheckpointConfig

    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(CheckpointConfig))


def test_command_line_misspelling_names_the_nearest_key():
    # without `+` Hydra refuses the key too, but its message does not say which key was meant
    with pytest.raises(ValueError, match=r"train.stpes: unknown key; did you mean train.steps\?"):
        S.check_overrides(["model=tiny", "train.stpes=1"])
    S.check_overrides(["model=tiny", "train.steps=1", "-m", "hydra.run.dir=x", "plan.mesh.data=2", "data.paths=[a]"])
    for argv, msg in (
        (["+train.stpes=1"], "did you mean train.steps?"),
        (["train.stpes=1"], "did you mean train.steps?"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "lcx.train", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 2 and msg in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize(
    "tool,arg,near",
    [("lcx.plan", "+hardwre.chips=128", "hardware"), ("lcx.train", "++foo=1", None), ("lcx.eval", "+evl.x=1", "eval")],
)
def test_an_appended_key_under_an_unknown_top_level_name_is_refused(tool, arg, near):
    # '+' makes Hydra add the key instead of refusing it, and nothing would read it
    with pytest.raises(ValueError, match="unknown top-level key") as e:
        S.check_overrides([arg], tool)
    assert arg in str(e.value) and (near is None or f"did you mean {near}?" in str(e.value))
    # keys a config of the tool has (a section, a group, an experiment's own section) still pass
    S.check_overrides(["+train.steps=1", "+experiment=longctx_4m_v5p", "+published.mfu=0.5"], "lcx.plan")
    S.check_overrides(["+hydra/launcher=basic", "+ledger_calibration.hold_out_sources=[a]"], tool)


def test_importing_lcx_registers_nothing_and_register_is_idempotent():
    # registration is the explicit lcx.config.register() (lcx.cli.launch, tests/conftest.py), not an
    # import side effect; a second call changes nothing
    code = (
        "from hydra.core.config_store import ConfigStore\n"
        "from omegaconf import OmegaConf\n"
        "import lcx, lcx.config, lcx.config.schema, lcx.config.plan, lcx.sharding.config, lcx.train, lcx.plan, lcx.eval, lcx.extend\n"
        "repo = ConfigStore.instance().repo\n"
        "assert 'schema' not in repo and 'schema.yaml' not in repo.get('plan', {}), sorted(repo)\n"
        "assert not OmegaConf.has_resolver('lcx_uid')\n"
        "lcx.config.register(); lcx.config.register()\n"
        "assert 'schema.yaml' in repo['plan'] and 'train.yaml' in repo['schema'], sorted(repo)\n"
        "assert OmegaConf.has_resolver('lcx_uid')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_hydra_finds_the_top_level_conf_through_the_package():
    # an editable install maps the package lcx.conf to this checkout's conf/ (a wheel carries a copy:
    # tests/test_wheel.py), and the plan presets are read from the same place
    import importlib.resources

    from lcx.sharding.config import PRESET_DIR

    assert pathlib.Path(str(importlib.resources.files("lcx.conf"))).resolve() == CONF.resolve()
    assert PRESET_DIR.resolve() == (CONF / "plan").resolve()


def test_a_list_given_as_a_string_gets_a_hint_that_parses():
    with pytest.raises(
        ValueError, match=r"hardware.topology='4x4x3': must be a list, e.g. hardware.topology=\[4,4,3\]"
    ):
        S._check_value("hardware.topology", "4x4x3", list[int])
    assert S._check_value("hardware.topology", [4, 4, 3], list[int]) == [4, 4, 3]
