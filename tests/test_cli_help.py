"""Every console command's --help, as a newcomer reads it: plain text, no issue numbers, no
reStructuredText markup (a docstring's ``code`` or :func:`name` printed raw)."""
from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys

import pytest

from cll_scale.core.cli import MODEL_METAVAR, plain_text
from tests.conftest import ROOT, console_scripts


def helps(parser: argparse.ArgumentParser) -> list[str]:
    """The parser's help and each subcommand's."""
    out = [parser.format_help()]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += helps(sub)
    return out


MARKUP = re.compile(r"``|:(?:func|class|meth|mod|attr|data|exc|obj|ref|doc):`|^\s*\.\. \w+::", re.M)
ISSUE = re.compile(r"\bissues? #?\d+", re.I)


@pytest.mark.parametrize("name", sorted(console_scripts()))
def test_help_has_no_issue_numbers_and_no_markup(name):
    texts = helps(importlib.import_module(console_scripts()[name]).build_parser())
    assert texts[0].startswith(f"usage: {name}")
    for text in texts:
        assert not ISSUE.findall(text), f"{name} --help names an issue: {ISSUE.findall(text)}"
        found = [line.strip() for line in text.splitlines() if MARKUP.search(line)]
        assert not found, f"{name} --help prints markup raw: {found[:3]}"


TORCH_FREE_HELP = sorted(console_scripts())


@pytest.mark.integration
def test_help_answers_without_importing_torch():
    """Each command's --help in one fresh interpreter (a test process has torch loaded already),
    torch looked for after each: the parsers read the settings' dataclasses, never the components."""
    modules = [console_scripts()[name] for name in TORCH_FREE_HELP]
    code = ("import importlib, sys\n"
            f"for module in {modules!r}:\n"
            "    try:\n"
            "        importlib.import_module(module).main(['--help'])\n"
            "    except SystemExit:\n"
            "        pass\n"
            "    print(module, 'torch' in sys.modules, file=sys.stderr)\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.count("usage: ") == len(modules), res.stderr[-2000:]
    verdicts = dict(line.split() for line in res.stderr.strip().splitlines()[-len(modules):])
    assert verdicts == {module: "False" for module in modules}, verdicts


def parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """(command, parser) for every console command and subcommand."""
    out = []
    for name, module in sorted(console_scripts().items()):
        stack = [(name, importlib.import_module(module).build_parser())]
        while stack:
            label, parser = stack.pop()
            out.append((label, parser))
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    stack += [(f"{label} {sub}", p) for sub, p in action.choices.items()]
    return out


def shown(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS
            and not isinstance(a, argparse._HelpAction)]


def test_every_flag_has_one_spelling_and_its_default_in_the_help():
    for label, parser in parsers():
        for action in shown(parser):
            assert len(action.option_strings) == 1, f"{label}: {action.option_strings} spell one flag"
            quiet = action.default in (None, False, (), [], argparse.SUPPRESS) or action.required
            assert quiet or "default" in (action.help or ""), f"{label} {action.option_strings[0]}: no default shown"


def test_one_form_of_model_one_lsl_switch_and_device_auto_everywhere():
    seen = {"--model": 0, "--device": 0, "--ablate-lsl": 0}
    for label, parser in parsers():
        for action in shown(parser):
            flag = action.option_strings[0]
            if flag == "--model":
                assert action.metavar == MODEL_METAVAR, f"{label} --model {action.metavar}"
            if flag == "--device":
                assert action.default == "auto", f"{label} --device defaults to {action.default}"
            assert "lsl" not in flag or flag == "--ablate-lsl" or flag.startswith("--model."), f"{label}: {flag}"
            seen[flag] = seen.get(flag, 0) + 1
    assert seen["--model"] >= 7 and seen["--device"] >= 4 and seen["--ablate-lsl"] == 3, seen


def test_a_named_model_is_a_path_where_a_command_takes_one_model():
    from cll_scale.backtranslate import build_parser as bt_parser
    from cll_scale.core.cli import config_from_args, parse_models
    from cll_scale.loops.settings import BTConfig
    from cll_scale.translate import build_parser as translate_parser
    assert translate_parser().parse_args(["--model", "fcll=runs/f/export"]).model == "runs/f/export"
    args = bt_parser().parse_args(["--model", "fcll=runs/f/export", "--data", "d", "--out", "o"])
    assert config_from_args(BTConfig, args).model == "runs/f/export"
    assert parse_models(["fcll=runs/f/export", "runs/b/export", "runs/a=b/export"]) == {
        "fcll": "runs/f/export", "b": "runs/b/export", "a=b": "runs/a=b/export"}


@pytest.fixture
def fresh_notices(monkeypatch):
    """Each old spelling warns once a process: a test sees its own warnings."""
    from cll_scale.core import compat
    monkeypatch.setattr(compat, "_NOTICES", set())


def test_an_old_spelling_is_read_as_the_flag_of_today_with_one_warning_line(fresh_notices, capsys):
    from cll_scale.run.recipe import recipe_flags
    from cll_scale.train import build_parser as train_parser
    from cll_scale.translate import build_parser as translate_parser
    args = translate_parser().parse_args(["--model", "m", "--no-lsl", "--max-tokens", "500"])
    assert args.ablate_lsl is True and args.beam_tokens == 500
    err = capsys.readouterr().err.splitlines()
    assert err == ["[cll-scale] --no-lsl is now --ablate-lsl (read as such; the old spelling will go)",
                   "[cll-scale] --max-tokens is now --beam-tokens (read as such; the old spelling will go)"], err
    args = train_parser().parse_args(["--optim.warmup-steps", "10", "--train.shards", "s", "--train.max_steps", "3",
                                      "--optim.warmup-steps", "12"])
    assert sorted(recipe_flags(args)) == ["optim.warmup_steps=12", "train.max_steps=3", "train.shards=s"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and "--optim.warmup-steps is now --optim.warmup_steps" in err[0], err   # once each
    assert "--train.shards is now --data" in err[1] and "--train.max_steps is now --max-steps" in err[2], err


@pytest.mark.parametrize("argv, words", [
    (["--beam", "2.5"], "--beam must be a whole number, not '2.5'"),
    (["--len-penalty", "nan"], "--len-penalty must be a finite number, not 'nan'"),
    (["--max-len-b", "ten"], "--max-len-b: 'ten' is not an integer"),
])
def test_a_generated_flag_is_read_by_the_one_coercion(argv, words, capsys):
    """cll-translate's decoding flags and cll-train's recipe flags meet the same check
    (core.settings.coerce_number), so they say the same thing of the same mistake."""
    from cll_scale.core.settings import coerce_number
    from cll_scale.translate import main
    with pytest.raises(SystemExit) as exit_:
        main(["--model", "m", "--tgt-lang", "de", *argv])
    assert exit_.value.code == 2 and words in capsys.readouterr().err
    flag, text = argv
    with pytest.raises(ValueError, match=words.split(flag)[1].strip(" :")):
        coerce_number(flag, text, float if flag == "--len-penalty" else int)


def test_every_command_module_is_thin():
    """A console command parses its flags and calls the layer below: 80 lines at most."""
    for name, module in console_scripts().items():
        path = ROOT / (module.replace(".", "/") + ".py")
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= 80, f"{name}: {path.relative_to(ROOT)} has {lines} lines"


def test_plain_text_takes_the_markup_out_and_keeps_the_words():
    doc = ("``cll-eval``: scores (:mod:`cll_scale.evaluation.scoring`) through "
           ":class:`~cll_scale.evaluation.translator.Translator` and :func:`score_job`.")
    assert plain_text(doc) == "cll-eval: scores (cll_scale.evaluation.scoring) through Translator and score_job."
