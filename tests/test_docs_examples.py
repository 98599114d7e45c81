"""The docs chain: every command of the ```bash blocks of README.md and docs/usage.md runs, in the
order a reader meets them, in one working directory laid out as a fresh clone, at `tiny` size.

The directory holds what a clone holds that the commands read (`recipes/`, `ds_configs/`) and sits
beside `../shared/data/multi30k`, which here is a small real corpus: the first lines of each Multi30k
file, split names kept. A command reads only what the docs or the reader made before it. Three
tables below are the whole difference between a reader's commands and the test's:
- SHRINK: how a command is made `tiny` and short (budgets, preset, sentence counts): the only place
  that names a command's flags, so a renamed flag is changed here and nowhere else;
- PLACEHOLDERS and USER_INPUT: the names the docs leave to the reader (EXPORT, in.de, ...), mapped
  to what an earlier example made or to a small file the test writes as the reader's own;
- NOT_RUN: the commands that cannot run here, each with its reason and the test that covers it.
Every other command must exit 0, and the outputs it names must exist after it. The commands run
in this process through their `main(argv)`; a `deepspeed` launch runs as a real process.
"""
from __future__ import annotations

import importlib
import io
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.conftest import OPUS_SAMPLE, ROOT, console_scripts, head_corpus
from tests.hf_fixtures import multi30k_pairs, write_pair

DOCS = ("README.md", "docs/usage.md")
CORPUS_LINES = 200          # of every Multi30k file: enough for SentencePiece and a few batches
BASH_BLOCK = re.compile(r"^```bash[ \t]*\n(.*?)^```", re.M | re.S)
ENV_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")

# The console scripts (setup.py) run in this process.
PROGRAMS = console_scripts()
LAUNCHERS = ("deepspeed",)          # run as a real process: it starts one process per rank

# Commands that cannot run here: a fragment that picks out exactly one command -> why, and which
# test covers it instead.
NOT_RUN = {
    "make quickstart": "minutes of training; tests/test_quickstart.py::test_the_quickstart_script_ends_with_its_summary",
    "make test": "the suite this test belongs to",
    "--format hf": "reads the Hugging Face hub (network); tests/test_build.py::test_parquet_in_hf_schema_builds "
                   "builds the same layout from local files",
    "cll-shards download": "network",
    "--hostfile": "a multi-node GPU cluster",
    "make bench-opus": "a benchmark (minutes); its stages are tests/test_synth.py and "
                       "tests/test_opus_shape.py::test_dry_run_prints_consistent_figures_and_leaves_the_run_dir_alone",
    "make demo": "serves until stopped; tests/test_quickstart.py::"
                 "test_make_demo_serves_the_quickstart_runs_asked_and_says_what_to_run_first",
    "cll-demo": "serves until stopped, and its models are the ones `make quickstart` trains; "
                "tests/test_demo.py serves it (the `server` fixture)",
    "scripts/demo_screenshot.py": "needs the models `make quickstart` trains and Chromium; the page it photographs "
                                  "is the one tests/test_demo.py::test_real_browser_translates_and_stays_local opens",
}

# A training shrunk to `tiny`: two steps of small batches, validated once at the end on a few
# sentences per direction (the end-of-run validation writes export-best/).
TINY_TRAINING = {"--preset": "tiny", "--max-steps": "2", "--set": ["data.batch_tokens=512", "valid.every=1000",
                                                                   "valid.max_sentences=8"]}
# What cll-repro gives each of its trainings for the same: the tiny preset goes through --set.
TINY_STUDY = ["preset=tiny", "data.batch_tokens=512", "train.grad_accum=1", "valid.every=1000",
              "valid.max_sentences=8"]


@dataclass
class Shrink:
    """How the commands holding ``fragment`` are shrunk: ``drop`` removes a flag and its value,
    ``put`` sets a flag's value (added when absent; None adds a switch; a list puts the flag once
    per value, after the command's own). Every rule that matches a command applies, in the table's order."""
    fragment: str
    put: dict = field(default_factory=dict)
    drop: tuple = ()
    why: str = ""


SHRINK = [
    Shrink("--format opus100", put={"--vocab-size": "400"},
           why="the reader's corpus here is OPUS-100's format sample: a few lines a pair, too few for 8,000 pieces"),
    Shrink("cll-shards synth", put={"--scale": "0.00002", "--scale-eval": None},
           why="about a thousand pairs in OPUS-100's layout, its dev and test sets scaled alike"),
    Shrink("cll_scale.train", put=TINY_TRAINING, drop=("--max-minutes",), why="a deepspeed launch of cll-train"),
    Shrink("cll-train", put=TINY_TRAINING, drop=("--max-minutes",)),
    # Each resume trains on: the first training ran 2 steps, the two-rank resume takes it to 3,
    # the one-process resume to 4.
    Shrink("cll_scale.train --recipe recipes/multi30k_centered_fcll.yaml --resume", put={"--max-steps": "3"}),
    Shrink("cll-train --recipe recipes/multi30k_centered_fcll.yaml --resume", put={"--max-steps": "4"}),
    Shrink("--dry-run", put={"--dry-run-steps": "1", "--set": ["train.ds_config=auto"]},
           why="the recipe's engine settings are a GPU's (bf16 on CUDA); here the CPU's"),
    Shrink("cll-translate", put={"--beam": "1"}),
    Shrink("cll-eval", put={"--max-sentences": "3", "--beam": "1"}),
    Shrink("cll-repro", put={"--steps-per-model": "2", "--max-sentences": "3", "--beam": "1", "--set": TINY_STUDY,
                             "--splits": "test_2016_flickr", "--variants": "baseline,fcll", "--parallel": "2"},
           drop=("--minutes-per-model",),
           why="two variants trained at once (the test has the machine to itself) and one test split: the five "
               "studies would train 13 models; every variant's recipe of every setting is "
               "found by tests/test_repro.py::test_each_settings_family_finds_its_own_four_triangle_recipes"),
    Shrink("--seeds 1,2,3", put={"--seeds": "1"},
           why="a seed report of one seed (every seed trains alike); the mean ± std over seeds is checked by "
               "tests/test_repro.py::test_repro_writes_the_report_and_resumes"),
    Shrink("cll-analyze", put={"--beam": "1"}),
    Shrink("cll-analyze attribution", put={"--steps": "4"}),
    Shrink("cll-analyze attribution --model runs", put={"--sentences": "2", "--heatmaps": "1"}),
    Shrink("cll-bt", put={"--epochs": "1", "--max-rows": "16", "--eval-max-sentences": "3", "--beam": "1",
                          "--eval-beam": "1"}),
    Shrink("cll-extend", put={"--max-steps": "2", "--max-pairs": "150", "--eval-max-sentences": "3",
                              "--eval-beam": "1", "--batch-tokens": "512"}),
]

# The names the docs leave to the reader, as the run fills them in: any export is the first one
# trained above them.
PLACEHOLDERS = {"EXPORT": "runs/multi30k-centered-fcll/export"}


def user_input(clone: Path, corpus: Path) -> dict[str, Path]:
    """The reader's own files the docs name: written here, small."""
    (clone / "in.de").write_text("Ein Hund rennt über die Wiese.\nZwei Kinder spielen im Sand.\n", encoding="utf-8")
    (clone / "mixed.tsv").write_text("fr\tEin Hund rennt über die Wiese.\ncs\tA man is riding a bike.\n",
                                     encoding="utf-8")
    shutil.copytree(OPUS_SAMPLE / "opus-100-corpus", clone / "opus-100-corpus")
    parquet = clone / "path" / "to" / "opus-100-parquet"
    for pair in ("de-en", "en-fr"):
        write_pair(parquet, pair, "train", multi30k_pairs(corpus, pair, "train", CORPUS_LINES))
        write_pair(parquet, pair, "validation", multi30k_pairs(corpus, pair, "val", 20))
        write_pair(parquet, pair, "test", multi30k_pairs(corpus, pair, "test_2016_flickr", 20))
    return {"in.de": clone / "in.de", "mixed.tsv": clone / "mixed.tsv",
            "opus-100-corpus": clone / "opus-100-corpus", "path/to/opus-100-parquet": parquet}


@dataclass
class Command:
    doc: str
    line: int
    env: dict
    argv: list            # program first, without the redirections
    stdin: str | None = None
    stdout: str | None = None

    @property
    def text(self) -> str:
        return " ".join(self.argv)

    def where(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def parse(words: list[str], doc: str, line: int) -> Command:
    env = {}
    while words and ENV_PREFIX.match(words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    cmd = Command(doc, line, env, [])
    it = iter(words)
    optional = False
    for word in it:
        if word in ("<", ">"):
            setattr(cmd, "stdin" if word == "<" else "stdout", next(it))
        elif word.startswith("["):         # the docs' [--flag N]: an optional part, left out here
            optional = not word.endswith("]")
        elif optional:
            optional = not word.endswith("]")
        else:
            cmd.argv.append(word)
    return cmd


def doc_commands(root: Path = ROOT) -> list[Command]:
    """Every command of the docs' bash blocks in order: `\\` continuations joined, comments
    stripped, env prefixes and < > redirections kept apart."""
    commands = []
    for doc in DOCS:
        text = (root / doc).read_text(encoding="utf-8")
        for block in BASH_BLOCK.finditer(text):
            first = text.count("\n", 0, block.start(1)) + 1
            pending, start = "", None
            for i, raw in enumerate(block.group(1).splitlines()):
                start = first + i if start is None else start
                if raw.rstrip().endswith("\\"):
                    pending += raw.rstrip()[:-1] + " "
                    continue
                words = shlex.split(pending + raw, comments=True)
                if words:
                    commands.append(parse(words, doc, start))
                pending, start = "", None
    return commands


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, w in enumerate(argv[:-1]) if w == flag]


def shrink(argv: list[str], rule: Shrink) -> list[str]:
    argv = list(argv)
    for flag in rule.drop + tuple(k for k, v in rule.put.items() if not isinstance(v, list)):
        while flag in argv:
            i = argv.index(flag)
            takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            del argv[i:i + 1 + takes_value]
    for flag, value in rule.put.items():
        for v in value if isinstance(value, list) else [value]:
            argv += [flag] if v is None else [flag, v]
    return argv


def placeholder(word: str) -> str | None:
    """The placeholder a word is or ends in (``NAME=EXPORT``), if any."""
    value = word.rpartition("=")[2]
    return value if value in PLACEHOLDERS else None


def fill(word: str) -> str:
    name = placeholder(word)
    return word if name is None else word[:len(word) - len(name)] + PLACEHOLDERS[name]


def expected_outputs(cmd: Command) -> list[str]:
    """What a command says it makes: its --out, the file its output goes to, a training's export."""
    outs = flag_values(cmd.argv, "--out") + ([cmd.stdout] if cmd.stdout else [])
    trains = cmd.argv[0] == "cll-train" or "cll_scale.train" in cmd.argv
    if trains and "--dry-run" not in cmd.argv:
        run_dir = (flag_values(cmd.argv, "--run-dir") or [None])[-1]
        if run_dir is None:
            recipe = yaml.safe_load(Path(flag_values(cmd.argv, "--recipe")[-1]).read_text(encoding="utf-8"))
            run_dir = recipe["train"]["run_dir"]
        outs.append(f"{run_dir}/export/export.json")
    if cmd.argv[0] == "cll-repro":          # runs/repro/results/<condition>[-<settings>][-seeds].md
        settings = (flag_values(cmd.argv, "--settings") or ["small"])[-1]
        name = flag_values(cmd.argv, "--condition")[-1] + ("" if settings == "small" else "-" + settings.replace("_", "-"))
        outs.append(f"runs/repro/results/{name}{'-seeds' if '--seeds' in cmd.argv else ''}.md")
    return outs


def run_in_process(cmd: Command, monkeypatch, capsys) -> tuple[int, str]:
    main = importlib.import_module(PROGRAMS[cmd.argv[0]]).main
    with monkeypatch.context() as mp:
        for key, value in cmd.env.items():
            mp.setenv(key, value)
        opened = []
        if cmd.stdin:
            opened.append(io.TextIOWrapper(open(cmd.stdin, "rb"), encoding="utf-8"))
            mp.setattr(sys, "stdin", opened[-1])
        if cmd.stdout:
            opened.append(io.TextIOWrapper(open(cmd.stdout, "wb"), encoding="utf-8"))
            mp.setattr(sys, "stdout", opened[-1])
        try:
            code = main(cmd.argv[1:])
        except SystemExit as stop:
            code = stop.code
        finally:
            for f in opened:
                f.close()
    out = capsys.readouterr()
    return code, (out.out + out.err)[-3000:]


LAUNCH_TIMEOUT = 600      # seconds; the two-rank example takes well under a minute on two quiet cores


def run_launcher(cmd: Command, clone: Path) -> tuple[int, str]:
    venv_bin = str(Path(sys.executable).parent)
    env = dict(os.environ, **cmd.env, PYTHONPATH=str(ROOT), PATH=venv_bin + os.pathsep + os.environ["PATH"])
    # its own session, so that a launch that hangs is ended with its ranks, not the launcher alone
    proc = subprocess.Popen(cmd.argv, cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return f"killed after {LAUNCH_TIMEOUT} s", output[-3000:]
    return proc.returncode, output[-3000:]


def test_the_extraction_reads_blocks_continuations_comments_and_redirections(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("text\n```bash\nmake quickstart   # the main job\n```\n```\nnot run\n```\n")
    (tmp_path / "docs" / "usage.md").write_text(
        "```bash\n# a comment line\nA=1 cll-x --a 'b c' \\\n    --d e < in.txt > out.txt   # why\n"
        "cll-y --z [--opt N]\n     # a comment that goes on\n```\n")
    got = [(c.doc, c.line, c.env, c.argv, c.stdin, c.stdout) for c in doc_commands(tmp_path)]
    assert got == [("README.md", 3, {}, ["make", "quickstart"], None, None),
                   ("docs/usage.md", 3, {"A": "1"}, ["cll-x", "--a", "b c", "--d", "e"], "in.txt", "out.txt"),
                   ("docs/usage.md", 5, {}, ["cll-y", "--z"], None, None)]


def test_a_shrink_replaces_drops_and_adds_flags():
    rule = Shrink("cll-x", put={"--epochs": "1", "--set": ["a.b=1"], "--switch": None}, drop=("--max-minutes", "--flag"))
    assert shrink(["cll-x", "--epochs", "4", "--max-minutes", "15", "--flag", "--set", "c.d=2"], rule) == \
        ["cll-x", "--set", "c.d=2", "--epochs", "1", "--set", "a.b=1", "--switch"]


def test_the_tests_named_for_what_is_not_run_or_shrunk_exist():
    named = re.findall(r"(tests/\w+\.py)(?:::(\w+))?", " ".join([*NOT_RUN.values(), *(r.why for r in SHRINK)]))
    assert named
    for path, name in named:
        assert (ROOT / path).is_file(), path
        assert not name or f"def {name}(" in (ROOT / path).read_text(encoding="utf-8"), f"{path}::{name}"


@pytest.mark.integration
@pytest.mark.whole_machine          # the two-rank deepspeed example
def test_the_docs_examples_run_in_order_on_a_fresh_clone(multi30k, tmp_path, monkeypatch, capsys):
    corpus = head_corpus(multi30k, tmp_path / "shared" / "data" / "multi30k", lambda name: True, CORPUS_LINES)
    clone = tmp_path / "clone"
    clone.mkdir()
    for name in ("recipes", "ds_configs"):
        shutil.copytree(ROOT / name, clone / name)
    files = user_input(clone, corpus)
    monkeypatch.chdir(clone)
    # cll-repro's default corpus is ../shared/data/multi30k beside the checkout its code is in:
    # in a clone, this one; here the code is the test's checkout.
    monkeypatch.setenv("MULTI30K", str(corpus))
    # The processes the commands start (cll-repro's trainings) take one thread each, as the ranks
    # of the two-rank example do: the run is sized for one core.
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))

    commands = doc_commands()
    skipped, ran, rules_used, filled, read = [], [], set(), set(), set()
    for cmd in commands:
        reasons = [f for f in NOT_RUN if f in cmd.text]
        if reasons:
            skipped += reasons
            continue
        assert cmd.argv[0] in PROGRAMS or cmd.argv[0] in LAUNCHERS, f"no way to run {cmd.where()}"
        source = cmd.text
        for i, rule in enumerate(SHRINK):
            if rule.fragment in source:
                cmd.argv = shrink(cmd.argv, rule)
                rules_used.add(i)
        filled |= {placeholder(w) for w in cmd.argv} - {None}
        cmd.argv = [fill(w) for w in cmd.argv]
        read |= {w for w in cmd.argv + [cmd.stdin] if w in files}
        started = time.perf_counter()
        if cmd.argv[0] in LAUNCHERS:
            code, output = run_launcher(cmd, clone)
        else:
            code, output = run_in_process(cmd, monkeypatch, capsys)
        ran.append((round(time.perf_counter() - started, 1), cmd.text))
        assert code == 0, f"{cmd.where()}\nexit {code}:\n{output}"
        missing = [p for p in expected_outputs(cmd) if not (clone / p).exists()]
        assert not missing, f"{cmd.where()}\nmade no {missing}:\n{output}"
        if cmd.stdin and cmd.stdout:       # a line out for each line in (a two-step model's may be empty)
            lines = [len((clone / f).read_text(encoding="utf-8").splitlines()) for f in (cmd.stdin, cmd.stdout)]
            assert lines[0] == lines[1], f"{cmd.where()}: {lines[0]} lines in, {lines[1]} out"
    print("\n".join(f"{t:6.1f} s  {text}" for t, text in ran))

    assert sorted(skipped) == sorted(NOT_RUN), "each NOT_RUN entry names exactly one command of the docs"
    assert rules_used == set(range(len(SHRINK))), \
        f"shrink rules that match no command: {[SHRINK[i].fragment for i in set(range(len(SHRINK))) - rules_used]}"
    assert filled == set(PLACEHOLDERS), f"placeholders no command holds: {set(PLACEHOLDERS) - filled}"
    assert read == set(files), f"user input no command read: {set(files) - read}"
