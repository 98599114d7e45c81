"""One study from start to report: plan the models, stand records in for gone run directories,
refuse what would mix settings or precisions, train what is missing (a few at a time), evaluate
and record each model as it ends, and rewrite the report each time."""
from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cll_scale.core.cli import csv_list
from cll_scale.core.outputs import DirLock, json_text, write_atomic
from cll_scale.data.manifest import Manifest
from cll_scale.evaluation.pool import lid_pool
from cll_scale.evaluation.evaluator import significance
from cll_scale.evaluation.report import summarize
from cll_scale.evaluation.translator import Translator, check_beam
from cll_scale.repro.evaluations import EvalSettings, Evaluations, cached_evaluation
from cll_scale.repro.plan import planned_precision
from cll_scale.repro.plan import Budget, plan_runs, settings_suffix
from cll_scale.repro.budgets import check_trained_budget
from cll_scale.repro.records import (check_one_precision, check_one_rule, check_trained_settings, finished, is_record,
                                     recipe_rules, training_identity, use_records, write_record)
from cll_scale.repro.report import write_report
from cll_scale.repro.scheduler import build_shards, train_all, train_command
from cll_scale.run.recipe import apply_overrides, check_recipe, load_recipe
from cll_scale.training.precision import ds_config_of
from cll_scale.training.rundir import chosen_export


@dataclass
class Study:
    """Everything a ``cll-repro`` command asks, as typed values (paths absolute)."""
    condition: str
    variants: list[str]
    corpus: Path                    # the Multi30k directory (--corpus)
    shards_root: Path
    runs_root: Path
    recipes: Path
    out: Path
    evaluation: EvalSettings
    budget: Budget = Budget.of(0, 0.0)
    settings: str = "small"
    seeds: list[int] | None = None
    overrides: list[str] = field(default_factory=list)    # --set, for every model
    cll_layers: str | None = None
    parallel: int = 1
    eval_only: bool = False
    allow_mixed_precision: bool = False
    precision: str = "auto"                                # --precision: what the models still to train train in
    lid_workers: int | None = None
    command: str = "cll-repro"                             # as the user typed it, for the report

    @property
    def engine_overrides(self) -> list[str]:
        """The engine settings ``--precision`` asks for, given to the trainings it starts only: they
        say where a model trains, not what it is (its precision is checked on its own)."""
        return [] if self.precision == "auto" else [f"train.ds_config={ds_config_of(self.precision)}"]

    @property
    def report_name(self) -> str:
        """A multi-seed study is its own report (``<condition>-seeds.md``) beside the one-seed one."""
        return (self.condition + settings_suffix(self.settings) + ("-cll-layers" if self.cll_layers else "")
                + ("-seeds" if self.seeds else ""))


class Reproduction:
    def __init__(self, study: Study):
        self.study = s = study
        self.plan = plan_runs(s.condition, s.variants, s.settings, s.recipes, s.runs_root, s.seeds, s.overrides,
                              s.cll_layers)
        self.figs = s.out / s.report_name
        self.identities = {name: training_identity(self.plan.recipe_of[name], self.plan.overrides[name] + s.overrides,
                                                   s.budget) for name in self.plan.runs}
        self.runs = use_records(self.plan.runs, self.identities, self.figs / "records", s.budget)
        self.shards = s.shards_root / f"multi30k-{s.condition}"
        self.evaluations: Evaluations | None = None

    def check(self) -> None:
        """Before anything runs: the trained models have the settings asked, the ones to train
        will share their precision and training rules, and with --eval-only every export is there."""
        s, plan = self.study, self.plan
        for recipe in sorted(set(plan.recipe_of.values())):     # a misspelled --set, before the shards are built
            check_recipe(apply_overrides(load_recipe(recipe), s.overrides + s.engine_overrides),
                         f"{recipe.name} with --set {' --set '.join(s.overrides)}" if s.overrides else str(recipe))
        check_trained_budget(self.runs, s.budget)
        check_trained_settings(self.runs, plan.recipe_of, plan.overrides, s.overrides)
        if s.evaluation.omit_lang_tag:          # as cll-eval: refused where no model has a tag to omit
            Translator.check_tags_to_omit({name: self.tagged(name) for name in self.runs})
        if not s.eval_only:
            # Once per recipe, not per model: a seed's own overrides set train.seed and data.seed only.
            to_train = [name for name, d in self.runs.items() if not finished(d, s.budget)]
            planned = {r: planned_precision(r, s.overrides, s.precision)
                       for r in {plan.recipe_of[name] for name in to_train}}
            check_one_precision(self.runs, {name: planned[plan.recipe_of[name]] for name in to_train},
                                s.allow_mixed_precision)
            check_one_rule(self.runs, {name: recipe_rules(plan.recipe_of[name], plan.overrides[name] + s.overrides)
                                       for name in self.runs}, to_train)
            return
        absent = [str(chosen_export(d)) for d in self.runs.values() if not (chosen_export(d) / "export.json").exists()]
        if absent:
            raise ValueError(f"--eval-only: no trained model at {', '.join(absent)}; train first (without "
                             f"--eval-only) or point --runs-root at the runs")

    def tagged(self, name: str) -> bool:
        """Whether a model trains with the target-language tag (its recipe's data.add_lang_tag)."""
        recipe = apply_overrides(load_recipe(self.plan.recipe_of[name]), self.plan.overrides[name] + self.study.overrides)
        return bool(recipe.get("data", {}).get("add_lang_tag", True))

    def check_splits(self) -> None:
        """Once the shards are there and before anything trains or is decoded: the beam fits the
        vocabulary, and every split of --splits is one the models can be evaluated on, unless every
        model that would need it has its evaluation of it cached already (a record needs no test set)."""
        s, manifest = self.study, Manifest.load(self.shards)
        check_beam(s.evaluation.beam, manifest.tokenizer.vocab_size)      # the models' vocabulary is the shards'
        have = manifest.splits
        missing = [x for x in s.evaluation.splits if x not in have or have[x].role == "train"]
        if not missing:
            return
        needed = [name for name, d in self.runs.items()
                  if not finished(d, s.budget) or any(cached_evaluation(self.figs, name, x).get("settings")
                                                      != s.evaluation.key(d) for x in missing)]
        if needed:
            tests = [x for x, split in have.items() if split.role != "train"]
            raise ValueError(f"--splits {','.join(missing)}: the shards {self.shards} have no such test split (they "
                             f"have {', '.join(tests) or 'none'}), and {', '.join(needed)} would be evaluated on it "
                             f"(nothing was trained or decoded); leave it out of --splits, or build the shards from a "
                             f"corpus that has it (another --shards-root, --corpus)")

    def settle(self, name: str) -> None:
        """Evaluate a trained model now, and keep its record: a sitting that ends while other
        models train loses none of the finished ones."""
        if name in self.evaluations.done:
            return
        self.evaluations.of(name, self.runs[name])
        if not is_record(self.runs[name]) and finished(self.runs[name], self.study.budget):
            write_record(self.runs[name], self.figs / "records" / self.runs[name].name, self.identities[name])

    def report(self) -> Path:
        """The report of every model settled so far: a study that spans sittings shows what it
        has at the end of each, not only once its last model is trained."""
        s, done = self.study, self.evaluations.done
        settled = {name: d for name, d in self.runs.items() if name in done}
        pending = [name for name in self.runs if name not in settled]
        reports, paired = {}, {}
        for split in s.evaluation.splits:
            entries = {k: v for name in settled for k, v in done[name][split].items()}
            reports[split] = summarize(entries, f"Multi30k {split}", s.evaluation.beam, s.evaluation.lid,
                                       log=lambda m: print(m, file=sys.stderr))
            write_atomic(self.figs / f"{split}.json", json_text(reports[split].to_json(), indent=1, ensure_ascii=False))
            # The paired tests need the test set's sentences, from the shards: a report written again
            # from its records alone (a fresh checkout, scripts/rewrite_reports.py) has none to pair
            if len(settled) > 1 and self.evaluations.has_test_sets():
                paired[split] = significance(reports[split], list(settled), self.evaluations.test_set(split)[0],
                                             self.figs / "hyps" / split)
                write_atomic(self.figs / f"{split}_significance.json",
                             json_text(paired[split].to_json(), indent=1, ensure_ascii=False))
        path = write_report(s.condition, s.report_name, settled, reports, s.budget, s.command, s.out,
                            self.plan.groups if s.seeds else None, pending, paired)
        print(f"[cll-repro] wrote {path}: {len(settled)} of {len(self.runs)} models"
              + (f", still to train: {', '.join(pending)}" if pending else ""), file=sys.stderr)
        return path

    def train_missing(self) -> None:
        """The models trained in earlier sittings first (cached evaluations make that cheap), so
        the report holds them before the first training of this sitting ends."""
        s, commands, ready = self.study, [], []
        for name, run_dir in self.runs.items():
            cmd = train_command(self.plan.recipe_of[name], run_dir, self.shards, s.budget,
                                self.plan.overrides[name] + s.overrides + s.engine_overrides)
            if cmd:
                commands.append((name, run_dir, cmd))
            else:
                ready.append(name)
        for name in ready:
            self.settle(name)
        if ready and commands:
            self.report()

        def trained(name: str) -> None:
            self.settle(name)
            if len(self.evaluations.done) < len(self.runs):      # the last one's report is written after
                self.report()

        # On CPU an evaluation beside the next training slows both (scheduler.train_all), so there
        # the next one waits. On a GPU the next training starts at once (not measured here: the
        # decoding takes a share of the GPU, language ID runs on the host).
        train_all(commands, s.parallel, done=trained, overlap=self.evaluations.device != "cpu", budget=s.budget)

    def run(self) -> Path:
        self.check()
        s = self.study
        build_shards(s.condition, str(s.corpus), self.shards)
        self.check_splits()
        # One process a report: two studies of one name into one --out would interleave their
        # records and write the report over each other (its folder holds the lock, as a run's).
        lock = DirLock(self.figs, "cll-repro study").acquire()
        try:
            with lid_pool(s.lid_workers) as pool:         # its workers start with the first job scored
                self.evaluations = Evaluations(s.evaluation, self.shards, self.figs, pool)
                if not s.eval_only:
                    self.train_missing()
                for name in self.runs:
                    self.settle(name)
                return self.report()
        finally:
            lock.release()


def study_of(args: argparse.Namespace, argv: list[str] | None) -> Study:
    """The typed study cll-repro's flags ask for. The commands run from the project root: every
    path is made absolute."""
    command = "cll-repro " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    path = {name: Path(getattr(args, name)).resolve() for name in ("shards_root", "runs_root", "recipes", "out",
                                                                   "corpus")}
    evaluation = EvalSettings(tuple(args.splits.split(",")), args.beam, args.max_sentences, args.ablate_lsl,
                              args.omit_lang_tag, tuple(args.lid))
    return Study(args.condition, csv_list(args.variants), evaluation=evaluation,
                 budget=Budget.of(args.steps_per_model, args.minutes_per_model), settings=args.settings,
                 seeds=args.seeds, overrides=list(args.set), cll_layers=args.cll_layers, parallel=args.parallel,
                 eval_only=args.eval_only, allow_mixed_precision=args.allow_mixed_precision, precision=args.precision,
                 lid_workers=args.lid_workers, command=command, **path)


def reproduce(study: Study) -> int:
    """Run the study and print its report."""
    path = Reproduction(study).run()
    print(path.read_text())
    return 0
