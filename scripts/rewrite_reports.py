"""Rewrite committed ``cll-repro`` reports from their records alone, into another directory, and
say whether each came out byte-identical: the check that a change to cll-repro left its reports
as they were. Nothing is trained or decoded (a record has no weights; its evaluations are cached
beside the report; a finished run still on this machine is read from the same cache), and no
shard is built.

    .venv/bin/python scripts/rewrite_reports.py docs/results/triangle-seeds.md docs/results/centered-seeds.md
    .venv/bin/python scripts/rewrite_reports.py --all          # every report under docs/results with records

The report's own ``Command:`` line says how it was made; it is parsed with cll-repro's parser,
and only ``--out`` is moved to a scratch copy of the report's records and cached evaluations. The
markdown and the per-split JSON are compared; the PNGs are drawn again but not compared (their
bytes follow matplotlib's version). With ``--write`` the markdown and the per-split JSON are
written over the committed ones, for a change meant to alter the reports (a new column): review
the result with ``git diff``. A report's part written by hand (after ``repro.report.BY_HAND``) is
kept.
"""
from __future__ import annotations

import argparse
import errno
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cll_scale.core.cli import add_debug_argument  # noqa: E402
from cll_scale.core.errors import run_guarded  # noqa: E402
from cll_scale.evaluation.pool import lid_pool  # noqa: E402
from cll_scale.repro.cli import build_parser  # noqa: E402
from cll_scale.repro.study import study_of  # noqa: E402
from cll_scale.repro.evaluations import Evaluations  # noqa: E402
from cll_scale.repro.records import finished, is_record  # noqa: E402
from cll_scale.repro.study import Reproduction  # noqa: E402

COMMAND = re.compile(r"^Command: `(cll-repro .*)`$", re.M)
PROG = "rewrite_reports.py"


def with_records(results: Path) -> list[Path]:
    """The reports under ``results`` whose folder holds records."""
    return sorted(d.parent.with_suffix(".md") for d in results.rglob("records")
                  if d.parent.with_suffix(".md").is_file())


def rewrite(report: Path, scratch: Path, write: bool = False) -> tuple[Path, list[str]]:
    """The report written again under ``scratch``, and the files that differ from the committed ones
    (``write``: then copied over them, the markdown and the per-split JSON).
    What cannot be rewritten is a ValueError naming the report: no ``Command:`` line, a command
    that today's cll-repro refuses (a variant without a recipe), no model left to rewrite it from."""
    if not report.is_file():
        raise FileNotFoundError(errno.ENOENT, "no such report", str(report))
    command = COMMAND.search(report.read_text(encoding="utf-8"))
    if not command:
        raise ValueError(f"{report}: no `Command: cll-repro ...` line, so there is nothing to rewrite it with")
    argv = shlex.split(command.group(1))[1:]
    parser = build_parser()

    def refuse(message: str):       # argparse's way would print cll-repro's usage and exit
        raise ValueError(message)
    parser.error = refuse
    try:
        study = study_of(parser.parse_args(argv), argv)
        study.out = scratch
        kept = report.with_suffix("")
        for part in ("records", "evaluated"):
            if (kept / part).is_dir():
                shutil.copytree(kept / part, scratch / kept.name / part)
        scratch.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(report, scratch / report.name)      # its part written by hand is kept
        r = Reproduction(study)
    except ValueError as err:
        raise ValueError(f"{report}: its Command: line cannot be run today: {err}") from None
    with lid_pool(0) as pool:
        r.evaluations = Evaluations(study.evaluation, r.shards, r.figs, pool)
        for name, run_dir in r.runs.items():
            # a record, or a finished run still on this machine (its evaluation is cached too)
            if is_record(run_dir) or finished(run_dir, study.budget):
                r.settle(name)
        if not r.evaluations.done:
            raise ValueError(f"{report}: none of its {len(r.runs)} models has a record in {kept / 'records'} or a "
                             f"finished run in {study.runs_root}: nothing to rewrite it from (were its records "
                             f"moved away?)")
        path = r.report()
    outputs = [path, *sorted(r.figs.glob("*.json"))]

    def same(p: Path) -> bool:      # a file the committed report lacks (a newer kind of JSON) differs
        committed = report.parent / p.relative_to(scratch)
        return committed.is_file() and p.read_bytes() == committed.read_bytes()
    differ = [p.name for p in outputs if not same(p)]
    if write:
        for p in outputs:
            shutil.copyfile(p, report.parent / p.relative_to(scratch))
    return path, differ


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reports", nargs="*", type=Path)
    p.add_argument("--all", action="store_true", help="every report under docs/results with records")
    p.add_argument("--write", action="store_true",
                   help="write the markdown and per-split JSON over the committed ones (after a change that "
                        "is meant to alter the reports: review it with git diff)")
    add_debug_argument(p)
    args = p.parse_args(argv)
    reports = with_records(ROOT / "docs" / "results") if args.all else args.reports
    if not reports:
        p.error("name reports, or --all")

    def body() -> int:
        bad = 0
        for report in reports:
            with tempfile.TemporaryDirectory() as tmp:
                _, differ = rewrite(report.resolve(), Path(tmp), args.write)
            print(f"{report}: " + ("byte-identical" if not differ else
                                   f"{'REWRITTEN' if args.write else 'DIFFERS'}: {', '.join(differ)}"))
            bad += bool(differ)
        return 1 if bad and not args.write else 0
    return run_guarded(PROG, body, args.debug)


if __name__ == "__main__":
    sys.exit(main())
