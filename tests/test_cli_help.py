"""Every console command's --help, as a newcomer reads it: plain text, no issue numbers, no
reStructuredText markup (a docstring's ``code`` or :func:`name` printed raw)."""
from __future__ import annotations

import argparse
import ast
import importlib
import re
import subprocess
import sys

import pytest

from cll_scale.core.cli import plain_text
from tests.conftest import ROOT


def console_scripts() -> dict[str, str]:
    """name -> module, as setup.py declares them."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    entry = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "entry_points"))
    return {line.split("=")[0]: line.split("=")[1].split(":")[0] for line in entry["console_scripts"]}


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


@pytest.mark.integration
@pytest.mark.parametrize("module", ["cll_scale.translate", "cll_scale.evaluate"])
def test_help_answers_without_importing_torch(module):
    code = (f"import sys\nfrom {module} import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, file=sys.stderr)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.startswith("usage: "), res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1] == "False", f"{module} --help imported torch"


def test_plain_text_takes_the_markup_out_and_keeps_the_words():
    doc = ("``cll-eval``: scores (:mod:`cll_scale.evaluation.scoring`) through "
           ":class:`~cll_scale.evaluation.translator.Translator` and :func:`score_job`.")
    assert plain_text(doc) == "cll-eval: scores (cll_scale.evaluation.scoring) through Translator and score_job."
