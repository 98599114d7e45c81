"""A finished run's budget against the study's: the one a run's last sitting trained under (its
config.json), and the refusal of a study that would report it under a smaller one."""
from __future__ import annotations

from pathlib import Path

from cll_scale.repro.plan import Budget
from cll_scale.repro.records import finished, is_record
from cll_scale.training.rundir import RunDir


def trained_budget(run_dir: Path) -> Budget | None:
    """The budget a run directory's last sitting trained under (its config.json's max_steps and
    max_minutes, which cll-repro sets from its budget); None without a config.json."""
    if not RunDir(run_dir).has_config():
        return None
    train = RunDir(run_dir).config().get("train", {})
    return Budget(int(train.get("max_steps") or 0), float(train.get("max_minutes") or 0.0))


def check_trained_budget(runs: dict[str, Path], budget: Budget) -> None:
    """Refuse, before anything runs, run directories that count as finished under this budget but
    were trained under another: one trained 4 steps is finished for a 2-step budget too, and its
    report and record would then name 2 steps above a model of 4. (A run that is not finished
    trains on to the new budget; a record stands in only for its own budget, :func:`use_records`.)"""
    def amount(b: Budget) -> str:
        return " or ".join([f"{b.steps:,} steps"] * bool(b.steps) + [f"{b.minutes:g} minutes"] * bool(b.minutes))

    other = {name: trained for name, run_dir in runs.items()
             if not is_record(run_dir) and (trained := trained_budget(run_dir)) is not None
             and trained != budget and finished(run_dir, budget)}
    if other:
        raise ValueError(f"the study asks {amount(budget)} a model, but " + "; ".join(
            f"{name} was trained for {amount(b)}" for name, b in other.items())
            + ": a finished model is not cut back to a smaller budget. Ask the budget it was trained for (or a "
              "larger one, to train it on), or train into another --runs-root and --out")
