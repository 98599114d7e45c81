"""A config boundary for every number (the second misuse round, docs/reliability.md): each numeric
setting is finite, a count is a whole number, a range is checked where the flag is named, and every
JSON file the project writes is strict JSON."""
import json
import math
from pathlib import Path

import pytest

from cll_scale.core.errors import EXIT_FILES, EXIT_INPUT
from cll_scale.core.outputs import json_text
from cll_scale.core.settings import coerce_number
from cll_scale.data.stream import StreamConfig
from cll_scale.model.config import ModelConfig
from cll_scale.run.recipe import TrainConfig, _coerce, apply_overrides, build_section, load_recipe, section_classes
from cll_scale.training.optim import OptimConfig
from cll_scale.training.rundir import CheckpointConfig
from tests.conftest import run_cli
from tests.test_misuse import one_line_error
from tests.test_train import common


# -- findings 7, 20: non-finite and fractional settings -------------------------------------------

@pytest.mark.parametrize("cls, key, value, needle", [
    (OptimConfig, "clip_norm", float("nan"), "optim.clip_norm must be a finite number"),
    (OptimConfig, "lr", "inf", "optim.lr must be a finite number"),
    (StreamConfig, "temperature", "nan", "data.temperature must be a finite number"),
    (StreamConfig, "pool_blocks", 2.5, "data.pool_blocks must be a whole number, not 2.5"),
    (ModelConfig, "lsl_dim", "16.5", "model.lsl_dim must be a whole number"),
    (CheckpointConfig, "export", "yes", "checkpoint.export must be true or false"),
    (TrainConfig, "max_steps", "many", "train.max_steps: 'many' is not an integer"),
])
def test_every_numeric_setting_is_checked_at_the_boundary(cls, key, value, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        section = {c: name for name, c in section_classes().items()}[cls]
        _coerce(cls, section, {key: value})


def test_numbers_that_mean_the_same_are_accepted():
    assert coerce_number("optim.lr", "7e-4", float) == 7e-4          # YAML reads 7e-4 as a string
    assert coerce_number("train.max_steps", 1e3, int) == 1000 and isinstance(coerce_number("x", 1e3, int), int)
    assert coerce_number("train.max_minutes", 0, float) == 0.0
    assert _coerce(ModelConfig, "model", {"residual_layer": None}) == {"residual_layer": None}   # optional stays optional


def test_bad_numbers_from_the_command_line_name_the_setting(m30k_centered, tmp_path, cmd):
    for setting, needle in (("optim.clip_norm=nan", "optim.clip_norm must be a finite number"),
                            ("data.pool_blocks=2.5", "data.pool_blocks must be a whole number"),
                            ("data.temperature=nan", "data.temperature must be a finite number")):
        res = cmd("cll_scale.train", *common(m30k_centered, tmp_path / "run", 2, "--set", setting))
        one_line_error(res, "cll-train", EXIT_INPUT, needle)
        assert not (tmp_path / "run" / "config.json").exists()


def test_the_project_writes_strict_json_only():
    assert json_text({"a": [1.5, None]}) == '{"a": [1.5, null]}'
    with pytest.raises(ValueError, match="optim.clip_norm is not finite"):
        json_text({"optim": {"clip_norm": math.nan}})
    json.loads(json_text({"x": 1e300}), parse_constant=lambda c: pytest.fail(f"non-strict {c}"))
    # a measurement that may be non-finite (a skipped step's gradient norm in metrics.jsonl): null
    assert json_text({"grad_norm": math.inf, "loss": [1.0, math.nan]}, non_finite_as_null=True) == \
        '{"grad_norm": null, "loss": [1.0, null]}'


def test_a_recipe_that_is_not_utf8_is_named(tmp_path):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("train:\n  run_dir: runs/gr\xfc\xdfe\n".encode("latin-1"))
    with pytest.raises(ValueError, match=f"{bad}: not UTF-8 text"):
        load_recipe(bad)


# -- finding 6: decoding limits ------------------------------------------------------------------------

def test_huge_decoding_limits_are_clamped_and_an_impossible_minimum_refused(tiny_export, tmp_path, capsys, cmd,
                                                                           caplog):
    from cll_scale.translate import main
    src = tmp_path / "in.txt"
    src.write_text("Ein Hund läuft über die Wiese.\n")
    base = ["--model", str(tiny_export), "--tgt-lang", "fr", "--input", str(src), "--beam", "1"]
    code, out, err = run_cli(main, [*base, "--max-len-a", "1e19", "--min-len", "3"], capsys)
    assert code == 0 and len(out.strip().split()) >= 1, (out, err)      # not an empty line
    code, out, err = run_cli(main, [*base, "--min-len", "1000"], capsys)
    assert code == EXIT_INPUT and "--min-len 1000 exceeds the longest output" in err and out == ""
    caplog.set_level("WARNING")        # a warning, logged (that one reaches stderr: tests/test_std_streams.py)
    res = cmd("cll_scale.translate", *base, "--min-len", "40", "--max-len-a", "0", "--max-len-b", "5")
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert res.returncode == 0 and any("--min-len 40 exceeds the longest output allowed for some sentences" in w
                                       for w in warned), (warned, res.stderr)
    # a beam wider than the vocabulary is refused before any decoding (found in the third round: it
    # filled the memory in the top-k instead)
    beam = list(base)
    beam[beam.index("--beam") + 1] = "1000000000"
    code, out, err = run_cli(main, beam, capsys)
    assert code == EXIT_INPUT and "--beam 1,000,000,000 exceeds this model's vocabulary" in err and out == "", err


# -- finding 8: --resume of nothing ------------------------------------------------------------------

def test_resume_of_a_directory_that_does_not_exist_is_an_error(m30k_centered, tmp_path, cmd):
    res = cmd("cll_scale.train", *common(m30k_centered, tmp_path / "typo", 2), "--resume")
    line = one_line_error(res, "cll-train", EXIT_FILES, "--resume:", "does not exist")
    assert "drop --resume" in line and not (tmp_path / "typo").exists()


# -- findings 13, 14, 19, 9: seeds, ports, hosts, paths ------------------------------------------------

def test_seeds_ports_and_hosts_are_checked_where_the_flag_is_named(tiny_export, tmp_path, capsys):
    from demo.app import check_host
    from demo.cli import main as demo_main
    for argv, needle in ((["--port", "70000"], "--port: 70000: a TCP port is 1-65535"),
                         (["--port", "-1"], "--port: -1: a TCP port is 1-65535")):
        with pytest.raises(SystemExit) as exit_:
            demo_main(["--model", str(tiny_export), *argv])
        assert exit_.value.code == EXIT_INPUT and needle in capsys.readouterr().err
    with pytest.raises(ValueError, match="--host 999.1.1.1: not an address"):
        check_host("999.1.1.1")
    check_host("127.0.0.1")
    code, _, err = run_cli(demo_main, ["--model", str(tiny_export), "--examples", str(tmp_path / "nonexistent")],
                           capsys)
    assert code == EXIT_FILES and f"{tmp_path / 'nonexistent'}: --examples: no such directory" in err
    with pytest.raises(ValueError, match="train.seed must be >= 0"):
        TrainConfig(seed=-1)
    from data_tools.cli import main as shards_main
    with pytest.raises(SystemExit) as exit_:
        shards_main(["build", "--corpus", str(tmp_path), "--out", str(tmp_path / "o"), "--seed", "-1"])
    assert exit_.value.code == EXIT_INPUT and "-1 is negative" in capsys.readouterr().err


# -- issue 36: sections owned by components, flags from their metadata ------------------------------

def test_every_recipe_setting_is_a_flag_with_its_default_and_help_written_once():
    import argparse
    import dataclasses

    from cll_scale.core.cli import default_text
    from cll_scale.model.config import PRESETS
    from cll_scale.run.recipe import recipe_flags
    from cll_scale.train import build_parser, recipe_from_args
    actions = {a.dest: a for a in build_parser()._actions if a.help != argparse.SUPPRESS}
    flagged = 0
    for section, cls in section_classes().items():
        for f in dataclasses.fields(cls):
            if "help" not in f.metadata:
                assert section == "model" and f.name in ("vocab_size", "pad_id", "bos_id", "eos_id", "languages",
                                                          "central_language"), (section, f.name)  # the manifest's
                continue
            action = actions[f"{section}.{f.name}"]
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            # the default a recipe that leaves the setting out trains with: the preset's for a size
            shown = PRESETS["small"].get(f.name, default) if section == "model" else default
            assert f.metadata["help"] in action.help, (section, f.name)
            assert default_text(shown) is None or f"{default_text(shown)})" in action.help, (section, f.name)
            # one spelling shown: the recipe key, or the short name the setting declares
            assert action.default is None and action.option_strings == [f.metadata.get("flag",
                                                                                       f"--{section}.{f.name}")]
            flagged += 1
    assert flagged >= 60
    # A flag is read as --set reads it, and --set has the last word.
    args = build_parser().parse_args(["--optim.warmup-steps", "10", "--max-steps", "7", "--valid.best_metric", "",
                                      "--variant", "sd", "--set", "optim.warmup_steps=20"])
    assert sorted(recipe_flags(args)) == ["model.variant=sd", "optim.warmup_steps=10", "train.max_steps=7",
                                          "valid.best_metric="]
    assert recipe_from_args(args) == {"model": {"variant": "sd"}, "optim": {"warmup_steps": 20},
                                      "train": {"max_steps": 7}, "valid": {"best_metric": ""}}


def test_cll_shards_flags_come_from_the_build_config():
    import argparse
    import dataclasses

    from cll_scale.core.cli import config_from_args
    from cll_scale.data.shards import BuildConfig
    from data_tools.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["build"]
    actions = {a.dest: a for a in sub._actions if a.help != argparse.SUPPRESS}
    for f in dataclasses.fields(BuildConfig):
        action = actions[f.name]
        assert f.metadata["help"] in action.help
        if f.default is not dataclasses.MISSING:
            assert action.default == f.default
            assert f.default in (False, None) or f"(default: {f.default})" in action.help
    args = parser.parse_args(["build", "--corpus", "x", "--out", "o", "--spm-type", "unigram", "--overwrite"])
    cfg = config_from_args(BuildConfig, args)
    assert (cfg.out_dir, cfg.model_type, cfg.overwrite, cfg.vocab_size) == ("o", "unigram", True, 8000)


def test_a_corpus_is_named_by_corpus_in_every_command_and_the_old_spellings_still_read(capsys, monkeypatch, tmp_path):
    """cll-shards build and cll-repro name the corpus they read --corpus, as cll-eval does; the
    spellings of before (--input, --multi30k) are read as it with one notice, and a build without
    a corpus is refused in one line."""
    from cll_scale.repro.cli import build_parser as repro_parser
    from data_tools.cli import build_parser as shards_parser
    from data_tools.cli import main as shards_main
    from cll_scale.core import compat
    monkeypatch.setattr(compat, "_NOTICES", set())      # each notice is printed once a process
    assert shards_parser().parse_args(["build", "--input", "x", "--out", "o"]).corpus == "x"
    assert repro_parser().parse_args(["--condition", "triangle", "--multi30k", "m"]).corpus == "m"
    err = capsys.readouterr().err
    assert "--input is now --corpus" in err and "--multi30k is now --corpus" in err, err
    assert shards_main(["build", "--out", str(tmp_path / "o")]) == 2
    assert "cll-shards build needs --corpus" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_settings_that_moved_to_their_section_are_read_with_one_notice(capsys):
    from cll_scale.core.compat import MOVED, upgrade
    old = {"train": {"lr": 1e-3, "valid_every": 250, "ckpt_every": 250, "log_every": 25, "seed": 2}}
    new = upgrade(old, "old.yaml")
    assert new == {"train": {"seed": 2}, "optim": {"lr": 1e-3}, "valid": {"every": 250},
                   "checkpoint": {"every": 250}, "log": {"every": 25}}
    notice = capsys.readouterr().err.strip().splitlines()
    assert len(notice) == 1 and "old.yaml" in notice[0] and "train.valid_every -> valid.every" in notice[0]
    assert upgrade(old) == new and capsys.readouterr().err == ""        # records are read silently
    upgrade(old, "old.yaml")
    assert capsys.readouterr().err == ""                                 # said once a process
    with pytest.raises(ValueError, match="train.lr and optim.lr are the same setting"):
        upgrade({"train": {"lr": 1e-3}, "optim": {"lr": 1e-4}})
    for old_key, new_key in MOVED.items():        # every target exists in its section
        section, key = new_key.split(".")
        assert key in {f.name for f in __import__("dataclasses").fields(section_classes()[section])}, old_key


def test_the_shipped_recipes_name_each_setting_in_its_section():
    """The project's own recipes are read without the moved-settings notice: they would stop
    loading when the old names go."""
    import yaml
    from cll_scale.core.compat import upgrade
    recipes = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))
    assert len(recipes) > 20
    old = [path.name for path in recipes if upgrade(yaml.safe_load(path.read_text())) != yaml.safe_load(path.read_text())]
    assert not old, old


def test_an_old_recipe_takes_new_overrides_and_an_old_override_is_mapped(tmp_path, capsys):
    from cll_scale.run.recipe import apply_overrides
    old = tmp_path / "old.yaml"
    old.write_text("train:\n  lr: 1.0e-3\n  valid_every: 250\n  seed: 3\n")
    recipe = apply_overrides(load_recipe(old), ["valid.every=5", "train.log_every=7"])
    assert recipe == {"train": {"seed": 3}, "optim": {"lr": 1e-3}, "valid": {"every": 5}, "log": {"every": 7}}
    err = capsys.readouterr().err
    assert "train.valid_every -> valid.every" in err and "--set train.log_every is now log.every" in err
    both = tmp_path / "both.yaml"
    both.write_text("train:\n  lr: 1.0e-3\noptim:\n  lr: 2.0e-3\n")
    with pytest.raises(ValueError, match="both.yaml: train.lr and optim.lr are the same setting"):
        load_recipe(both)


def test_the_names_issue_53_changed_still_work_everywhere_a_user_wrote_them(m30k_centered, tmp_path, capsys):
    """Three settings were all called max_tokens and the run's shard directory was train.data:
    old recipes, --set, old flags, version-1 manifests and cll-bt's old settings.json still read,
    and a record's identity is hashed under the old names so kept records still match."""
    import argparse

    from cll_scale.core.cli import add_config_arguments
    from cll_scale.core.compat import as_first_named
    from cll_scale.loops.finetune import upgrade_fine_tuning_settings
    from cll_scale.data.manifest import Manifest
    from cll_scale.data.shards import BuildConfig
    from cll_scale.loops.backtranslate import BTConfig
    from cll_scale.run.recipe import apply_overrides
    old = tmp_path / "old.yaml"
    old.write_text("data:\n  max_tokens: 2048\ntrain:\n  data: shards/x\n")
    recipe = apply_overrides(load_recipe(old), ["data.max_tokens=1024"])
    assert recipe == {"data": {"batch_tokens": 1024}, "train": {"shards": "shards/x"}}
    err = capsys.readouterr().err
    assert "data.max_tokens -> data.batch_tokens" in err and "--set data.max_tokens is now data.batch_tokens" in err
    assert as_first_named(recipe) == {"data": {"max_tokens": 1024}, "train": {"data": "shards/x"}}
    for cls, field, more in ((BuildConfig, "max_length", ["--out", "o"]),
                             (BTConfig, "batch_tokens", ["--model", "m", "--data", "d", "--out", "o"])):
        parser = argparse.ArgumentParser()
        add_config_arguments(parser, cls)
        assert getattr(parser.parse_args(["--max-tokens", "77", *more]), field) == 77, cls
    now = json.loads((m30k_centered / "manifest.json").read_text())
    assert now["schema_version"] == 2 and "max_length" in now
    v1 = {**{("max_tokens" if k == "max_length" else k): v for k, v in now.items()}, "schema_version": 1}
    assert Manifest.from_json(v1).max_length == now["max_length"]
    assert upgrade_fine_tuning_settings({"max_tokens": 512, "epochs": 2}) == {"batch_tokens": 512, "epochs": 2}


def test_the_old_generated_flags_are_hidden_aliases_of_the_new_settings(capsys):
    """Issue 66: the docs say old names still load, but --data.max_tokens and --train.data were
    "unrecognized arguments". Every moved or renamed setting keeps its flag, read as the new one
    with a notice and kept out of --help; the old and the new flag together are refused."""
    from cll_scale.core.compat import MOVED
    from cll_scale.train import build_parser, recipe_from_args
    parser = build_parser()
    args = parser.parse_args(["--data.max_tokens", "1024", "--train.data", "shards/x", "--train.valid-every", "7"])
    assert recipe_from_args(args) == {"data": {"batch_tokens": 1024}, "train": {"shards": "shards/x"},
                                      "valid": {"every": 7}}
    err = capsys.readouterr().err
    assert "--data.max_tokens is now --data.batch_tokens" in err and "--train.data is now --train.shards" in err
    shown = parser.format_help()
    assert not [old for old in MOVED if f"--{old}" in shown or f"--{old.replace('_', '-')}" in shown]
    for old, new in MOVED.items():            # every old flag parses, to its new setting
        assert recipe_from_args(parser.parse_args([f"--{old}", "3"])) == apply_overrides({}, [f"{new}=3"]), old
    with pytest.raises(ValueError, match="--data.max_tokens and --data.batch_tokens are the same setting"):
        recipe_from_args(parser.parse_args(["--data.max_tokens", "1024", "--data.batch_tokens", "512"]))


# -- issue 51, class A: a flag's value is read by its setting's type, never a path as YAML --------

@pytest.mark.parametrize("flag, value", [
    ("--run-dir", "runs/a6 #1"),        # finding 1: YAML dropped " #1" as a comment
    ("--run-dir", "runs/a7: x"),        # finding 2: YAML made a mapping of it
    ("--run-dir", "yes"),               # finding 3: YAML made a boolean (and null, None)
    ("--run-dir", "null"),
    ("--data", "shards on"),
])
def test_a_path_flag_is_taken_as_typed(flag, value):
    from cll_scale.train import build_parser, recipe_from_args
    recipe = recipe_from_args(build_parser().parse_args(["--preset", "tiny", flag, value]))
    field = {"--run-dir": "run_dir", "--data": "shards"}[flag]
    assert getattr(build_section("train", recipe["train"]), field) == value


@pytest.mark.parametrize("override, key, expected", [         # finding 9: strings iterated
    ("train.freeze=encoder.*", ("train", "freeze"), ["encoder.*"]),
    ("train.freeze=[encoder.*, decoder.layers.0.*]", ("train", "freeze"), ["encoder.*", "decoder.layers.0.*"]),
    ("data.directions=de-fr,fr-cs", ("data", "directions"), ["de-fr", "fr-cs"]),
    ("data.directions=[de-fr, fr-cs]", ("data", "directions"), ["de-fr", "fr-cs"]),
    ("model.cll_layers=0,1", ("model", "cll_layers"), [0, 1]),
    ("model.cll_layers=1", ("model", "cll_layers"), [1]),
    ("optim.betas=0.9,0.95", ("optim", "betas"), (0.9, 0.95)),
    ("model.residual_sublayer=null", ("model", "residual_sublayer"), None),
])
def test_a_list_setting_takes_a_list_or_commas_and_never_iterates_a_string(override, key, expected):
    section, name = key
    values = apply_overrides({}, [override])[section]
    if section == "model":
        values = {"languages": ["de", "fr", "cs"], "variant": "custom" if name == "cll_layers" else "fcll", **values}
    assert getattr(build_section(section, values), name) == expected


@pytest.mark.parametrize("source, needle", [
    ({"optim": {"betas": 0.9}}, "optim.betas must be a list, e.g. [0.9, 0.98] or 0.9,0.98; not 0.9"),
    (["optim.betas=0.9"], "optim.betas must be two numbers in [0, 1), e.g. [0.9, 0.98]"),
    ({"model": {"cll_layers": {"a": 1}}}, "model.cll_layers must be a list, e.g. [0, 2] or 0,2"),
    (["model.cll_layers=[0, x]"], "model.cll_layers[1]: 'x' is not an integer"),
    ({"train": {"run_dir": True}}, "train.run_dir must be a string, not True (in a YAML recipe, put it in quotes"),
    ({"train": {"freeze": [1]}}, "train.freeze must be a list of strings"),
])
def test_a_value_of_the_wrong_shape_is_refused_with_an_example(source, needle):
    recipe = apply_overrides({}, source) if isinstance(source, list) else source
    (section, values), = recipe.items()
    with pytest.raises(ValueError) as err:
        build_section(section, {"languages": ["de"], **values} if section == "model" else values)
    assert needle in str(err.value)


# -- issue 51, class B: settings that change what the model learns are checked ---------------------

@pytest.mark.parametrize("name, text, needle", [         # finding 4: the first optim block was dropped
    ("r.yaml", "optim:\n  lr: 1.0e-3\ndata:\n  seed: 2\noptim:\n  warmup_steps: 10\n",
     "'optim' given twice in one mapping (first on line 1)"),
    ("r.yaml", "optim:\n  lr: 1.0e-3\n  lr: 2.0e-3\n", "'lr' given twice in one mapping (first on line 2)"),
    ("r.json", '{"optim": {"lr": 0.001}, "optim": {"warmup_steps": 10}}', "'optim' given twice in one object"),
])
def test_a_recipe_that_gives_a_key_twice_is_refused(tmp_path, name, text, needle):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        load_recipe(path)
    assert needle in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize("model, needle", [             # findings 10, 11: IndexError at the first step
    ({"vocab_size": 10}, "model.vocab_size 10 is smaller than the shards' vocabulary (1000 subwords)"),
    ({"languages": ["de"]}, "model.languages=['de'], central None (the shards': ['de', 'fr', 'cs'], central None)"),
    ({"eos_id": 7}, "model.eos_id=7 (the shards' 3)"),
])
def test_a_model_that_does_not_fit_the_shards_is_refused_at_start(model, needle):
    from cll_scale.run.recipe import build_configs
    from cll_scale.data.manifest import TokenizerInfo
    tok = TokenizerInfo("spm.model", "", 1000, 0, 1, 2, 3, {})
    build_configs({"preset": "tiny", "model": {"vocab_size": 1024}}, ["de", "fr", "cs"], None, tok)  # larger: fine
    with pytest.raises(ValueError) as err:
        build_configs({"preset": "tiny", "model": model}, ["de", "fr", "cs"], None, tok, where="r.yaml")
    assert needle in str(err.value) and "from the shards" in str(err.value)


# -- issue 66, class C: sizes checked by the memory they need, before anything is allocated --------

@pytest.mark.parametrize("change, needle", [
    (["--set", "model.ffn_dim=2000000000"], "model.ffn_dim=2,000,000,000"),
    (["--set", "model.max_positions=3e9", "--dry-run"], "model.max_positions=3,000,000,000"),
    (["--set", "model.d_model=1e6", "--dry-run"], "model.d_model=1,000,000"),
    (["--set", "data.mix_rows=2000000000"], "the mixed pool (data.mix_rows=2,000,000,000 x ~310 B)"),
])
def test_a_size_that_cannot_fit_in_memory_is_refused_before_anything_is_allocated(m30k_centered, tmp_path, capsys,
                                                                                   change, needle):
    """A model size with a few zeros too many ended in the allocator's RuntimeError traceback and
    left a `.lock` in a new run directory; data.mix_rows=2e8 swapped the machine with no step
    after a minute. Each is one line, before the run directory exists."""
    from cll_scale.train import main
    run = tmp_path / "new-run"
    code, _, err = run_cli(main, [*common(m30k_centered, run, 2), *change], capsys)
    assert code == EXIT_INPUT and needle in err and "needs more memory than the" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not run.exists()


def test_the_parameter_count_is_the_built_models(tmp_path):
    """The count the memory check uses is the model's own, for every layout."""
    from cll_scale.model.config import PRESETS
    from cll_scale.model.model import CLLTransformer
    for preset, variant, pre_norm in (("tiny", "fcll", False), ("tiny", "sd", True), ("small", "baseline", True)):
        cfg = ModelConfig(**{**PRESETS[preset], "pre_norm": pre_norm}, vocab_size=1000, languages=["de", "fr", "cs", "en"],
                          central_language="en", variant=variant)
        assert cfg.parameter_count() == sum(p.numel() for p in CLLTransformer(cfg).parameters())


def test_a_failed_start_leaves_no_lock_nor_the_directory_it_made(m30k_centered, tmp_path, capsys):
    """A start that fails while building (here: a freeze glob that matches nothing) removes the
    lock file and the run directory it created."""
    from cll_scale.train import main
    run = tmp_path / "new-run"
    code, _, err = run_cli(main, [*common(m30k_centered, run, 2), "--set", "train.freeze=nothing.*"], capsys)
    assert code == EXIT_INPUT and "matches no parameter" in err, err
    assert not run.exists()


def test_selecting_by_bleu_without_decoding_is_refused(m30k_centered, tmp_path, capsys):
    """valid.best_metric valid_bleu without valid.decode_sentences trained to the end and wrote no
    export-best/, without a word: BLEU is never measured then."""
    from cll_scale.train import main
    run = tmp_path / "run"
    code, _, err = run_cli(main, [*common(m30k_centered, run, 2), "--valid.best-metric", "valid_bleu"], capsys)
    assert code == EXIT_INPUT and "valid.best_metric valid_bleu needs valid.decode_sentences > 0" in err, err
    assert not run.exists()
    build_section("valid", {"best_metric": "valid_bleu", "decode_sentences": 20})        # with decoding: fine


def test_shards_longer_than_the_models_positions_are_refused_at_start(small_multiway, tmp_path, capsys):
    """Issue 66, C: shards built with --max-length 3000 trained the `tiny` preset (512 positions)
    until the step that drew a long pair. The manifest's longest input is checked at start."""
    from cll_scale.train import main
    from data_tools.cli import main as shards_main
    shards = tmp_path / "long"
    code, _, err = run_cli(shards_main, ["build", "--corpus", str(small_multiway), "--vocab-size", "400",
                                         "--max-length", "3000", "--out", str(shards)], capsys)
    assert code == 0, err
    run = tmp_path / "run"
    code, _, err = run_cli(main, [*common(shards, run, 2), "--set", "data.batch_tokens=4096"], capsys)
    assert code == EXIT_INPUT and "model.max_positions 512 is shorter than the shards' longest input (3000 subwords + " \
        "tag and </s>: 3002 positions); build the shards with --max-length 510 or less" in err, err
    assert not run.exists()
    code, _, err = run_cli(main, [*common(shards, run, 1), "--set", "model.max_positions=3002", "--set",
                                  "data.batch_tokens=4096", "--dry-run", "--dry-run-steps", "1"], capsys)
    assert code == 0, err
