"""The commands a study runs: the shard build, and one ``cll-train`` process per model, a few at
a time, each settled as it ends; a SIGTERM to cll-repro reaches them all."""
from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from cll_scale.data.corpora import PAPER_ORDER, read_multiway
from cll_scale.data.shards import BuildConfig, kept_build
from cll_scale.repro.plan import Budget
from cll_scale.repro.progress import Progress
from cll_scale.repro.records import finished, run_state

ROOT = Path(__file__).resolve().parents[2]
# The languages of the non-centered conditions, in the order that makes their directions (paper
# §4.1), as cll-shards build takes them without --langs.
CONDITION_LANGS = {condition: ",".join(langs) for condition, langs in PAPER_ORDER.items()}


class StepFailed(RuntimeError):
    """A command cll-repro ran failed, or was stopped after a checkpoint; its exit code is passed
    on. ``log``: the file its output went to, whose own one-line message is repeated here (without
    one, the command printed it above)."""

    def __init__(self, what: str, code: int, log: Path | None = None):
        stopped = stop_signal(code)
        head = (f"{what} was stopped by {stopped.name} after a checkpoint; rerun to resume"
                if stopped else f"{what} failed (exit {code})")
        if log:
            head += f" (its output: {log})" + (f": {said}" if (said := last_message(log)) else "")
        elif not stopped:
            head += "; its message is above"
        super().__init__(head)
        self.exit_code = code


# The signals a training stops on after saving its checkpoint (its exit code is 128 + the signal).
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1}


def stop_signal(code: int) -> signal.Signals | None:
    """The signal a training stopped on after its checkpoint (its exit code: 128 + it), else None."""
    return signal.Signals(code - 128) if code > 128 and code - 128 in STOP_SIGNALS else None


def outcome(code: int) -> str:
    """How a training process ended, in words, by its exit code."""
    return "trained" if code == 0 else "stopped after a checkpoint, rerun to resume" if stop_signal(code) \
        else f"failed (exit {code})"


def last_message(log: Path) -> str | None:
    """The one-line message a command ended its output with (``cll-train: error: …``), else the
    log's last line; None when the log is missing or empty."""
    try:
        lines = [line.strip() for line in Path(log).read_text(encoding="utf-8", errors="replace").splitlines()
                 if line.strip()]
    except OSError:
        return None
    return next((line for line in reversed(lines) if line.startswith("cll-")), lines[-1] if lines else None)


class Stopped(RuntimeError):
    """cll-repro was told to stop (a scheduler's SIGTERM): the trainings it ran were stopped the
    same way, and each saved its checkpoint."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}; the trainings it ran saved their "
                         f"checkpoints, and the same command continues them")
        self.exit_code = 128 + signum


def sh(cmd: list[str], what: str) -> None:
    code = subprocess.run(cmd, cwd=ROOT).returncode
    if code:
        raise StepFailed(what, code)


def build_shards(condition: str, corpus: str, shards: Path) -> None:
    """The condition's shards of ``corpus`` (the Multi30k directory): built, or kept where ``shards``
    holds this very build (:func:`~cll_scale.data.shards.kept_build` refuses one of another corpus or
    condition, and names the settings of one built otherwise); the corpus is read first, so a wrong
    --corpus is an error before anything trains."""
    langs = CONDITION_LANGS.get(condition)
    settings = kept_build(read_multiway(corpus, condition, langs.split(",") if langs else None),
                          BuildConfig(out_dir=str(shards)))
    if settings is not None:
        if settings:
            print(f"[cll-repro] using the shards {shards}, built with {', '.join(settings)} (cll-repro builds "
                  f"with cll-shards' defaults)", file=sys.stderr)
        return
    cmd = [sys.executable, "-m", "data_tools", "build", "--corpus", corpus, "--condition", condition,
           "--out", str(shards)]
    if langs:
        cmd += ["--langs", langs]
    sh(cmd, f"building the {condition} shards")


def train_command(recipe: Path, run_dir: Path, shards: Path, budget: Budget, overrides: list[str]) -> list[str] | None:
    """The cll-train command that trains (or resumes) one model; None when it is finished."""
    state = run_state(run_dir)
    if finished(run_dir, budget, state):
        print(f"[cll-repro] {run_dir.name}: finished ({state['last']['step']} steps), skipping", file=sys.stderr)
        return None
    cmd = [sys.executable, "-m", "cll_scale.train", "--recipe", str(recipe), "--data", str(shards),
           "--run-dir", str(run_dir), "--max-minutes", str(budget.minutes), "--max-steps", str(budget.steps)]
    for o in overrides:
        cmd += ["--set", o]
    if (run_dir / "checkpoints" / "latest").exists():
        cmd.append("--resume")
    print(f"[cll-repro] {' '.join(shlex.quote(c) for c in cmd)}", file=sys.stderr)
    return cmd


def train(recipe: Path, run_dir: Path, shards: Path, budget: Budget, overrides: list[str]) -> None:
    """Train (or resume, or skip when finished) one model, in this process's turn."""
    cmd = train_command(recipe, run_dir, shards, budget, overrides)
    if cmd:
        train_all([(run_dir.name, run_dir, cmd)], parallel=1)


def _start(name: str, run_dir: Path, cmd: list[str], parallel: int) -> tuple:
    """One training process; with others beside it, its output goes to ``<run dir>/train.log``."""
    log, log_path = None, None
    if parallel > 1:
        log_path = run_dir / "train.log"
        run_dir.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "a")
    return name, subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log and subprocess.STDOUT), log, log_path


def train_all(commands: list[tuple[str, Path, list[str]]], parallel: int, done=None, overlap: bool = True,
              budget: Budget | None = None) -> None:
    """Run the training commands in order, ``parallel`` at a time (one GPU holds several small
    models; each process picks its own free port). With more than one at a time each writes its
    output to ``<run dir>/train.log``; the first failure stops the others and is raised.
    ``done(name)`` runs as each training ends well, while the others go on; with ``overlap`` the
    freed slot takes the next training first, so the evaluation ``done`` runs shares the device
    with it. Without it the next training waits for ``done``: on CPU both would contend for the
    same cores (2 cores, two threads each: a training ran 5.5x slower beside an evaluation than
    alone, and the evaluation decoded 11.6x slower), so one after the other ends sooner. A SIGTERM
    to cll-repro (a job scheduler's stop) is passed on to the running trainings, which checkpoint
    their step and stop: without that they would go on alone, holding their run directories.
    With ``budget``, how far each training has come is shown as :class:`Progress` says."""
    def stop(signum, frame):
        raise Stopped(signum)
    previous = signal.signal(signal.SIGTERM, stop)
    waiting, running, ended = list(commands), [], []
    progress = Progress(budget, parallel) if budget else None
    run_dirs = {name: run_dir for name, run_dir, _ in commands}
    shown = 0.0

    def fill():
        while waiting and len(running) < parallel:
            running.append(_start(*waiting.pop(0), parallel))

    try:
        while waiting or running or ended:
            if overlap:                  # the next trainings start first, so no slot waits on done()
                fill()
            while ended:
                done(ended.pop(0))
            fill()
            time.sleep(0.5)
            if progress and time.monotonic() - shown >= 5:      # metrics.jsonl gains a line every log.every steps
                progress.show([(item[0], run_dirs[item[0]]) for item in running])
                shown = time.monotonic()
            for item in list(running):
                name, proc, log, log_path = item
                if proc.poll() is None:
                    continue
                running.remove(item)
                if progress:
                    progress.show([(name, run_dirs[name])], ended=outcome(proc.returncode))
                if log:
                    log.close()
                if proc.returncode:
                    raise StepFailed(f"training {name}", proc.returncode, log_path)
                if done:
                    ended.append(name)
    finally:
        if progress:
            progress.close()
        signal.signal(signal.SIGTERM, previous)
        for _, proc, _, _ in running:
            proc.terminate()         # SIGTERM: each checkpoints its current step and stops
        for _, proc, log, _ in running:
            proc.wait()
            if log:
                log.close()
