"""What the fine-tuning commands share (``cll-bt``, ``cll-extend``): one process owns the output
directory, the settings a run was started with are recorded there and a re-run must match them,
and the run ends with a before/after evaluation.
"""
from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from cll_scale.core.jsonfiles import read_json_object
from cll_scale.core.outputs import SETTINGS, DirLock, OutputError, check_apart, check_owner, json_text, write_atomic
from cll_scale.data.inputs import source_length
from cll_scale.data.manifest import Manifest
from cll_scale.evaluation.evaluator import compare
from cll_scale.evaluation.pool import lid_pool
from cll_scale.evaluation.report import write_report
from cll_scale.evaluation.testsets import pairs_from_shards
from cll_scale.evaluation.translator import TranslateConfig, Translator, check_beam
from cll_scale.loops.settings import FineTuneSettings
from cll_scale.model.decode_config import DecodeConfig
from cll_scale.model.export import export_lang_tag
from cll_scale.run.build import build_run, set_threads
from cll_scale.run.recipe import build_section
from cll_scale.run.trainer import Trainer
from cll_scale.training import collectives
from cll_scale.training import engine as ds
from cll_scale.training.rundir import has_checkpoints


# May go in v0.3.0: cll-bt's and cll-extend's settings.json of before the rename called the
# microbatch budget max_tokens.
FINE_TUNING_RENAMED = {"max_tokens": "batch_tokens"}


def upgrade_fine_tuning_settings(settings: dict) -> dict:
    """The settings a cll-bt / cll-extend run recorded, under today's names."""
    return {FINE_TUNING_RENAMED.get(k, k): v for k, v in settings.items()}


def record_settings(out: Path, prog: str, settings: dict, may_change: set[str], restart: bool,
                    identity: dict | None = None) -> None:
    """Record ``settings`` in ``out`` on the first run; a re-run with others (except
    ``may_change``, e.g. more epochs or another evaluation) is an error naming each difference.
    ``restart`` discards a previous run of this command (never a directory it did not write).

    ``identity`` holds a content fingerprint of each input path: a run whose inputs (or itself)
    were moved resumes from their new paths when the contents are the same. A run that failed
    before writing anything but its settings may be re-run with other settings."""
    path = out / SETTINGS
    identity = identity or {}
    check_owner(out, prog)          # before --restart may delete anything
    if restart and out.exists():
        if not path.is_file():
            raise OutputError(f"--restart: {out} holds no {SETTINGS}, so it is not a {prog} run; "
                              f"refusing to delete it")
        for entry in out.iterdir():
            if entry.name != DirLock.NAME:      # the lock this process holds stays
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    produced = out.is_dir() and any(e.name not in (DirLock.NAME, SETTINGS) for e in out.iterdir())
    if path.is_file() and produced:
        recorded = read_json_object(path)
        old, old_identity = upgrade_fine_tuning_settings(recorded["settings"]), recorded.get("identity", {})

        def same(k: str) -> bool:
            if old.get(k) == settings.get(k) or k == "out":      # a moved run is the same run
                return True
            return k in PATH_SETTINGS and old_identity.get(k) is not None and old_identity.get(k) == identity.get(k)
        diff = [k for k in sorted(set(old) | set(settings)) if k not in may_change and not same(k)]
        if diff:
            listed = ", ".join(f"--{k.replace('_', '-')} {old.get(k)!r} (now {settings.get(k)!r})" for k in diff)
            moved = [k for k in diff if k in PATH_SETTINGS]
            hint = (f" If {', '.join('--' + k for k in moved)} only moved, give the new path of the same "
                    "contents (a run recorded before content fingerprints needs the old path, e.g. a symlink)."
                    if moved else "")
            raise OutputError(f"{out} holds a {prog} run started with other settings: {listed}. Re-run with "
                              f"the recorded settings to resume it, or pass --restart to discard it and begin "
                              f"again.{hint}")
    elif out.is_dir() and not path.is_file() and produced:
        raise OutputError(f"--out {out} is not empty and holds no {SETTINGS}: not a {prog} run to resume; "
                          f"choose another --out")
    write_atomic(path, json_text({"command": prog, "settings": settings, "identity": identity}, indent=1))


# What a stopped fine-tuning says: its output directory holds the state, so the same command resumes.
RESUME_HINT = "re-run the same command to resume"
PATH_SETTINGS = ("model", "data", "corpus", "out")   # compared as absolute paths: `x` and `./x` are one


def path_identity(path: str | Path) -> str | None:
    """A fingerprint of what an input path holds: its manifest.json or export.json (each names
    every file's sha256), else the names and sizes of its files; None for a path that is not there."""
    import hashlib
    p = Path(path)
    if not p.exists():
        return None
    digest = hashlib.sha256()
    marker = next((p / m for m in ("export.json", "manifest.json") if (p / m).is_file()), None)
    if marker is not None:
        digest.update(marker.read_bytes())
    elif p.is_dir():
        for f in sorted(q for q in p.iterdir() if q.is_file()):
            digest.update(f"{f.name}\0{f.stat().st_size}\n".encode())
    else:
        digest.update(p.read_bytes())
    return digest.hexdigest()


def resolved_settings(settings: dict) -> tuple[dict, dict]:
    """The settings as recorded (input paths absolute) and the content fingerprint of each input."""
    settings = {k: str(Path(v).resolve()) if k in PATH_SETTINGS and v else v for k, v in settings.items()}
    return settings, {k: path_identity(settings[k]) for k in PATH_SETTINGS if k != "out" and settings.get(k)}


def check_not_cut_back(flag: str, asked: int, done: int, out: str | Path, what: str, restart: bool) -> None:
    """A rerun of cll-bt or cll-extend may ask for more training (``may_change``), never for less
    than its run has done: the model it evaluates is the one after all of it, and its settings.json
    and report would then name the smaller amount (``--restart`` starts over)."""
    if done > asked and not restart:
        raise ValueError(f"{flag} {asked}: {out} has done {done:,} {what}, and its model is the one after them; "
                         f"ask {flag} {done} (or more, to go on), or --restart")


def open_output(out: Path, prog: str, settings: dict, may_change: set[str], restart: bool,
                rank: int) -> DirLock | None:
    """Rank 0 locks ``out`` and checks the recorded settings; every rank learns the verdict."""
    settings, identity = resolved_settings(settings)

    def lock_and_record() -> DirLock:
        lock = DirLock(out, prog + " run").acquire()
        try:
            record_settings(out, prog, settings, may_change, restart, identity)
        except BaseException:
            lock.abandon()
            raise
        return lock
    return collectives.on_rank0(lock_and_record, str(out))


def check_fine_tuning_inputs(cfg: "FineTuneSettings", manifest: Manifest, data: str, out: str,
                             inputs: dict[str, str]) -> None:
    """What cll-bt and cll-extend check before any work, named by the flags the user typed: an
    evaluation split that the data lacks or a beam wider than its vocabulary (either would fail
    after generation and training), a
    microbatch that cannot hold the data's longest pair, an output that is one of the inputs."""
    tests = [n for n, split in manifest.splits.items() if split.role == "test"]
    unknown = [s for s in cfg.eval_splits if s not in manifest.splits]
    if unknown:
        raise ValueError(f"--eval-splits {','.join(unknown)}: {data} has no such split (test splits: "
                         f"{', '.join(tests) or 'none'})")
    # The before/after evaluation comes after all the work: its beam is checked now, against the
    # data's vocabulary (the starting model's; cll-extend's grown model has more).
    check_beam(cfg.eval_beam, manifest.tokenizer.vocab_size, "--eval-beam")
    longest = source_length(manifest.max_length, True)
    if cfg.batch_tokens < longest:
        raise ValueError(f"--batch-tokens {cfg.batch_tokens} cannot hold the longest pair of {data} "
                         f"({manifest.max_length} tokens + tag + eos): give at least {longest}")
    check_apart(out, inputs)


@dataclass
class Comparison:
    """What a fine-tuning command compares when its work is done: each model's export, the shard
    directory whose test splits score them, and the corpus name the tables give as their source."""
    models: dict[str, str | Path]
    data: str | Path
    corpus: str | Path
    manifest: Manifest | None = None      # data's, as the command read it (rank 0; the others evaluate nothing)


def run_command(prog: str, cfg, restart: bool, may_change: set[str], check: Callable[[object], Manifest],
                work: Callable[[int, int, object, Manifest], Comparison]) -> dict[str, str]:
    """The run of cll-bt and cll-extend: one thread per rank, the process group, ``check(cfg)``
    (which returns the --data manifest it read), ``--out`` owned and locked (``may_change``: the
    settings a rerun may change; anything else would mix two runs), ``work(rank, world, device,
    manifest)`` on every rank, then the before/after tables on rank 0 ({} on the others)."""
    set_threads()
    rank, world, _ = ds.init_distributed()
    manifest = check(cfg)
    out = Path(cfg.out)
    lock = open_output(out, prog, asdict(cfg), may_change, restart, rank)
    try:
        device = ds.device()
        done = work(rank, world, device, manifest)
        collectives.shutdown()        # before rank 0's evaluation, which needs no group: a rank waiting
                             # out a long evaluation in a collective would hit the group's timeout
        if rank != 0:
            return {}
        return before_after(done.models, done.data, cfg.eval_splits, done.corpus, cfg.eval_beam,
                            cfg.eval_max_sentences, out, device, done.manifest)
    finally:
        if lock is not None:
            lock.release()


def before_after(models: dict[str, str | Path], data: str | Path, splits: list[str], test_name: str, beam: int,
                 max_sentences: int, out: Path, device, manifest: Manifest) -> dict[str, str]:
    """Evaluate the starting model and the fine-tuned one on each test split: {split: table}
    (``manifest``: data's, read once by the command)."""
    splits = splits or [n for n, s in manifest.splits.items() if s.role == "test"]
    unknown = [s for s in splits if s not in manifest.splits]
    if unknown:
        raise ValueError(f"--eval-splits {', '.join(unknown)}: {data} has {', '.join(manifest.splits)}")
    tc = TranslateConfig(DecodeConfig(beam=beam))
    translators = {name: Translator.load(path, device, tc) for name, path in models.items()}
    tables = {}
    with lid_pool() as pool:
        for split in splits:
            report = compare(translators, pairs_from_shards(data, split, manifest), f"{test_name}:{split}", beam,
                             max_sentences=max_sentences, log=lambda s: print(s, file=sys.stderr), pool=pool)
            tables[split] = write_report(report, out / "eval" / split)
    return tables


def fine_tuning_recipe(cfg: FineTuneSettings, data: str | Path, run_dir: str | Path, optim: dict,
                       valid: dict | None = None, **train) -> dict:
    """The cll-train recipe of a fine-tuning run (back-translation epochs, extension): ``cfg``'s
    shared settings and the checkpoint/log cadence both use, written once and checked section by
    section before any work, plus ``optim`` (the schedule), ``valid`` and ``train`` (start, budget)."""
    recipe = {"train": {"shards": str(data), "run_dir": str(run_dir), "ds_config": cfg.ds_config, "seed": cfg.seed,
                        **train},
              "optim": optim, "valid": {"every": 500, **(valid or {})},
              "checkpoint": {"every": 250, "keep_last": 2}, "log": {"every": 25},
              # The tags follow the model fine-tuned: a model trained without them continues without them.
              "data": {"batch_tokens": cfg.batch_tokens, "seed": cfg.seed,
                       "add_lang_tag": export_lang_tag(train["init_from"])}}
    for section in ("train", "optim", "valid", "checkpoint", "log"):
        build_section(section, recipe[section])      # an unknown or invalid setting fails here, by name
    return recipe


def train_run(recipe: dict) -> None:
    """Train a fine-tuning recipe, resuming its run where a checkpoint exists (re-running the
    command continues it)."""
    resume = has_checkpoints(Path(recipe["train"]["run_dir"]) / "checkpoints")
    Trainer(build_run(recipe, resume=resume), resume_hint=RESUME_HINT).train()
