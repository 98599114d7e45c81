"""The checkpointer as a specification, in one process: a checkpoint counts once ``latest`` names
it (the commit point), a damaged newest checkpoint is set aside and the one before it resumed,
retention keeps the newest ``keep_last`` complete checkpoints, and the engine and the registered
states come back, at the same world size or, through a universal checkpoint, at another.

A real ZeRO-2 DeepSpeed engine (fp32, the run's client optimizer and schedule) on a two-layer
model, in the one-process gloo world cll-train makes without a launcher: the file runs in seconds.
"""
import json

import pytest
import torch

from cll_scale.core import faults
from cll_scale.training import collectives
from cll_scale.training import engine as ds
from cll_scale.training.checkpointer import Checkpointer, CheckpointError, upgrade_client_state
from cll_scale.training.optim import GuardedAdamW, OptimConfig
from cll_scale.training.rundir import (META, CheckpointConfig, checkpoint_problem, checkpoint_world_size, latest_tag,
                                       resumable_tag, tag_for)


@pytest.fixture(scope="module", autouse=True)
def one_process_world():
    """The world ``init_distributed`` makes without a launcher, left for the tests that run after
    these in the same process: leaving it takes its rendezvous variables away again."""
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() != 1:
        pytest.skip("a process group of several ranks is already up")
    created = not torch.distributed.is_initialized()
    ds.init_distributed()
    yield
    if created:
        collectives.shutdown()


# -- what a run hands the checkpointer ---------------------------------------------------------

class Tally:
    """A state the same on every rank (as the trainer's TrainState): how many steps were taken."""

    def __init__(self):
        self.steps = 0

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = state["steps"]


class Place:
    """A per-rank state (as the stream's position): where this rank stands, and whether it was
    last restored as its own rank's state (``strict_world``) or as rank 0's at another world size."""

    def __init__(self):
        self.where, self.strict_world = 0, None

    def state_dict(self) -> dict:
        return {"where": self.where}

    def load_state_dict(self, state: dict, strict_world: bool = True) -> None:
        self.where, self.strict_world = state["where"], strict_world


OPTIM = OptimConfig(lr=1e-2, warmup_steps=2, clip_norm=1.0)


def new_engine(run_dir, universal: bool = False):
    """A ZeRO-2 fp32 engine with the run's client optimizer and schedule, its weights the same
    each time (a resume must bring the trained ones back)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    config = ds.make_ds_config("cpu_fp32.json", OPTIM, grad_accum=1, world_size=1, run_dir=run_dir,
                               load_universal=universal)

    def guard(module):
        return GuardedAdamW(list(module.parameters()), clip_norm=OPTIM.clip_norm, partitioned=True,
                            **OPTIM.adamw_kwargs())
    return ds.initialize(model, config, guard, OPTIM.scheduler)


def train(engine, first: int, last: int, tally: Tally | None = None, place: Place | None = None) -> None:
    """Steps ``first``..``last``, each on its own fixed batch."""
    for step in range(first, last + 1):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(step))
        engine.backward(engine(x).pow(2).mean())
        engine.step()
        if tally:
            tally.steps = step
        if place:
            place.where = 10 * step


def weights(engine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in engine.module.named_parameters()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def checkpointer(run_dir, keep_last: int = 3) -> tuple[Checkpointer, Tally, Place]:
    """A checkpointer with the states a run registers: one shared ("train", which every
    checkpoint holds) and one per rank."""
    ckpt = Checkpointer(CheckpointConfig(every=1, keep_last=keep_last), run_dir, rank=0)
    tally, place = Tally(), Place()
    ckpt.register("train", tally)
    ckpt.register("place", place, per_rank=True)
    return ckpt, tally, place


def saved_run(run_dir, steps: list[int], keep_last: int = 3):
    """Train to each of ``steps`` and save there. Returns the checkpointer, the engine and the
    weights at each saved step."""
    ckpt, tally, place = checkpointer(run_dir, keep_last)
    engine, at, done = new_engine(run_dir), {}, 0
    for step in steps:
        train(engine, done + 1, step, tally, place)
        ckpt.save(engine, step)
        at[step], done = weights(engine), step
    return ckpt, engine, at


def step_dirs(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.is_dir())


def resume(run_dir):
    """What a new process does: a fresh engine and states, restored from the checkpoint the
    checkpointer picks. Returns (engine, tally, place, tag, universal, log)."""
    ckpt, tally, place = checkpointer(run_dir)
    log: list[str] = []
    tag, universal = ckpt.resumable_tag(1, log.append)
    engine = new_engine(run_dir, universal)
    ckpt.load(engine, tag, 1, universal)
    return engine, tally, place, tag, universal, log


# -- the commit point ----------------------------------------------------------------------------

class Killed(BaseException):
    """The process dying. ``faults.crash`` would end pytest with it; here the fault raises this
    instead, which nothing in ``save`` catches, as nothing catches a SIGKILL."""


def die():
    raise Killed()


def test_a_save_killed_before_latest_names_it_is_not_resumed(tmp_path, monkeypatch):
    """The crash_in_save fault fires after the step's files and its cll_meta.json are written,
    before ``latest`` is rewritten: ``latest`` still names the previous checkpoint, and a resume
    takes that one, quietly, although the newer directory is all there."""
    ckpt, engine, at = saved_run(tmp_path, [1])
    monkeypatch.setenv("CLL_FAULT", "crash_in_save@2")
    monkeypatch.setattr(faults, "_fired", set())
    monkeypatch.setattr(faults, "crash", die)
    train(engine, 2, 2)
    with pytest.raises(Killed):
        ckpt.save(engine, 2)
    monkeypatch.delenv("CLL_FAULT")
    ckpts = tmp_path / "checkpoints"
    assert any((ckpts / tag_for(2)).glob("*optim_states.pt")) and (ckpts / tag_for(2) / META).is_file()
    assert latest_tag(ckpts) == tag_for(1)
    assert resumable_tag(ckpts) == (tag_for(1), "")
    resumed, tally, _, tag, _, log = resume(tmp_path)
    assert tag == tag_for(1) and log == [] and tally.steps == 1
    assert same(weights(resumed), at[1]) and not same(weights(resumed), weights(engine))


def test_a_step_directory_without_its_meta_was_never_committed(tmp_path):
    """DeepSpeed's files alone (a save killed before rank 0 listed them) are not a checkpoint,
    even when nothing else is left to say which checkpoint is the latest."""
    ckpt, engine, _ = saved_run(tmp_path, [1])
    train(engine, 2, 2)
    ckpts = tmp_path / "checkpoints"
    ds.save_checkpoint(engine, ckpts, tag_for(2), ckpt.client_state())
    (ckpts / "latest").unlink()
    assert any((ckpts / tag_for(2)).glob("*model_states.pt"))
    assert checkpoint_problem(ckpts, tag_for(2)) == f"no readable {META} (never committed)"
    tag, warning = resumable_tag(ckpts)
    assert tag == tag_for(1) and "has no latest file; resuming from step00000001" in warning


def test_a_failed_write_raises_a_checkpoint_error_and_leaves_latest_alone(tmp_path):
    """An unwritable step directory (here a file in its way; on a real run a full disk) is a
    CheckpointError that names the intact previous checkpoint."""
    ckpt, engine, _ = saved_run(tmp_path, [1])
    train(engine, 2, 2)
    (tmp_path / "checkpoints" / tag_for(2)).write_text("in the way")
    with pytest.raises(CheckpointError, match="step 2 checkpoint .* the previous checkpoint step00000001 is intact"):
        ckpt.save(engine, 2)
    assert latest_tag(tmp_path / "checkpoints") == tag_for(1)


def test_a_step_already_saved_is_not_written_again(tmp_path):
    """Validation may save the step the schedule saves too, and a run resumed with its budget spent
    reaches the step ``latest`` names: neither rewrites the committed checkpoint."""
    ckpt, engine, _ = saved_run(tmp_path, [1])
    meta = tmp_path / "checkpoints" / tag_for(1) / META
    written = meta.stat().st_mtime_ns
    train(engine, 2, 2)                                   # the engine moved on; the checkpoint must not
    assert ckpt.save(engine, 1) == tag_for(1)
    again, _, _ = checkpointer(tmp_path)
    assert again.save(engine, 1) == tag_for(1)
    assert meta.stat().st_mtime_ns == written and checkpoint_problem(tmp_path / "checkpoints", tag_for(1)) is None


# -- damaged checkpoints -------------------------------------------------------------------------

def truncate(path):
    path.write_bytes(path.read_bytes()[:100])


DAMAGES = {
    # damage: (what it does to step 2, what checkpoint_problem says about it)
    "model states truncated": (lambda d: truncate(next(d.glob("*model_states.pt"))),
                               "mp_rank_00_model_states.pt has 100 bytes, {size} when it was written"),
    "optimizer states deleted": (lambda d: next(d.glob("*optim_states.pt")).unlink(),
                                 "zero_pp_rank_0_mp_rank_00_optim_states.pt missing"),
    "meta unreadable": (lambda d: (d / META).write_text('{"step": 2, "files": {'),
                        f"no readable {META} (never committed)"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_previous_one_resumed(tmp_path, damage):
    """Damaged means: a file that cll_meta.json lists is missing or has another size than when it
    was committed, or cll_meta.json itself cannot be read. The resume warns naming both
    checkpoints, moves the damaged one to damaged-<tag> (out of every later glob, so the run never
    meets it again) and points ``latest`` at the one it resumed from."""
    _, _, at = saved_run(tmp_path, [1, 2])
    ckpts = tmp_path / "checkpoints"
    size = json.loads((ckpts / tag_for(2) / META).read_text())["files"]["mp_rank_00_model_states.pt"]
    spoil, problem = DAMAGES[damage]
    spoil(ckpts / tag_for(2))
    assert checkpoint_problem(ckpts, tag_for(2)) == problem.format(size=size)
    assert checkpoint_problem(ckpts, tag_for(1)) is None
    engine, tally, place, tag, universal, log = resume(tmp_path)
    assert (tag, universal) == (tag_for(1), False)
    assert log[0] == (f"warning: {ckpts / 'latest'} names step00000002 ({problem.format(size=size)}); "
                      f"resuming from step00000001, the newest complete checkpoint")
    assert "moved the damaged step00000002 aside to damaged-step00000002" in log[1]
    assert step_dirs(tmp_path) == ["damaged-step00000002", "step00000001"]
    assert latest_tag(ckpts) == tag_for(1)
    assert same(weights(engine), at[1]) and (tally.steps, place.where) == (1, 10)


def test_latest_naming_a_missing_checkpoint_falls_back_and_nothing_complete_is_an_error(tmp_path):
    saved_run(tmp_path, [1, 2])
    ckpts = tmp_path / "checkpoints"
    (ckpts / "latest").write_text("step00000099")
    assert resumable_tag(ckpts) == (tag_for(2), f"{ckpts / 'latest'} names step00000099 (missing); resuming "
                                                f"from step00000002, the newest complete checkpoint")
    for tag in (1, 2):
        truncate(next((ckpts / tag_for(tag)).glob("*model_states.pt")))
    with pytest.raises(ValueError, match="no complete checkpoint to resume from") as err:
        resumable_tag(ckpts)
    assert "step00000002: mp_rank_00_model_states.pt has 100 bytes" in str(err.value)
    assert "step00000001: mp_rank_00_model_states.pt has 100 bytes" in str(err.value)
    assert resumable_tag(tmp_path / "empty") == (None, "")          # a new run: nothing to resume


# -- retention -----------------------------------------------------------------------------------

def test_retention_keeps_the_newest_keep_last_complete_checkpoints(tmp_path):
    """Each commit deletes the oldest checkpoints beyond keep_last (with their universal copies);
    the one just written is always kept, and export-best/ (outside checkpoints/) is never touched."""
    best = tmp_path / "export-best" / "export.json"
    best.parent.mkdir()
    best.write_text('{"best": {"metric": "valid_nll", "step": 1}}')
    ckpt, tally, place = checkpointer(tmp_path, keep_last=2)
    engine = new_engine(tmp_path)
    kept = []
    for step in range(1, 5):
        train(engine, step, step, tally, place)
        ckpt.save(engine, step)
        if step == 1:
            (tmp_path / "checkpoints" / "step00000001_universal").mkdir()
        kept.append(step_dirs(tmp_path))
    assert kept == [["step00000001", "step00000001_universal"],
                    ["step00000001", "step00000001_universal", "step00000002"],
                    ["step00000002", "step00000003"],
                    ["step00000003", "step00000004"]]
    assert latest_tag(tmp_path / "checkpoints") == tag_for(4)
    assert best.read_text() == '{"best": {"metric": "valid_nll", "step": 1}}'
    single, tally, place = checkpointer(tmp_path, keep_last=1)
    train(engine, 5, 5, tally, place)
    single.save(engine, 5)
    assert step_dirs(tmp_path) == ["step00000005"]


def test_a_damaged_or_uncommitted_checkpoint_never_counts_towards_keep_last(tmp_path):
    """keep_last counts complete checkpoints: with keep_last=2 a damaged step 2 does not push out
    the complete step 1, and an uncommitted leftover older than the new checkpoint goes too."""
    ckpt, engine, _ = saved_run(tmp_path, [1, 2], keep_last=2)
    ckpts = tmp_path / "checkpoints"
    truncate(next((ckpts / tag_for(2)).glob("*model_states.pt")))
    train(engine, 3, 3)
    ds.save_checkpoint(engine, ckpts, tag_for(3), ckpt.client_state())      # killed before its commit
    train(engine, 4, 4)
    ckpt.save(engine, 4)
    assert step_dirs(tmp_path) == ["step00000001", "step00000004"]
    assert all(checkpoint_problem(ckpts, t) is None for t in step_dirs(tmp_path))


# -- what a checkpoint brings back ---------------------------------------------------------------

def test_the_engine_and_the_registered_states_come_back_and_training_goes_on_identically(tmp_path):
    """At the same world size: weights, optimizer moments and schedule from DeepSpeed, each
    registered state from the client state (a per-rank one as its own rank's), and the next step
    is the step the uninterrupted run took."""
    ckpt, engine, at = saved_run(tmp_path, [2])
    lr = engine.get_lr()
    train(engine, 3, 3)
    after = weights(engine)
    resumed, tally, place, tag, universal, log = resume(tmp_path)
    assert (tag, universal, log) == (tag_for(2), False, [])
    assert (tally.steps, place.where, place.strict_world) == (2, 20, True)
    assert same(weights(resumed), at[2]) and resumed.get_lr() == lr
    assert not any(p.name.endswith("_universal") for p in (tmp_path / "checkpoints").iterdir())
    train(resumed, 3, 3)
    assert same(weights(resumed), after)


def test_a_checkpoint_of_another_world_size_is_resumed_through_a_universal_checkpoint(tmp_path):
    """The world size a checkpoint was written at is the one its cll_meta.json records (here
    rewritten to 2, as a two-rank run writes it). Resuming in one process converts it to
    <tag>_universal, loads the weights from there, and hands every per-rank state the first rank's
    state with strict_world=False (its own rank's state does not exist at another world size)."""
    _, _, at = saved_run(tmp_path, [2])
    ckpts = tmp_path / "checkpoints"
    assert checkpoint_world_size(ckpts, tag_for(2)) == 1
    meta_path = ckpts / tag_for(2) / META
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "world_size": 2}))
    assert checkpoint_world_size(ckpts, tag_for(2)) == 2
    assert checkpoint_problem(ckpts, tag_for(2)) is None          # the meta is not among the files it lists
    engine, tally, place, tag, universal, log = resume(tmp_path)
    assert (tag, universal, log) == ("step00000002_universal", True, [])
    assert (ckpts / "step00000002_universal" / "zero").is_dir()
    assert same(weights(engine), at[2])
    assert (tally.steps, place.where, place.strict_world) == (2, 20, False)


# -- the run directory's helpers -----------------------------------------------------------------

def test_tags_sort_as_their_steps_do():
    """Retention and the fall-back pick checkpoints by sorting tag names."""
    steps = [9, 10, 99, 100, 12345678]
    assert sorted(tag_for(s) for s in reversed(steps)) == [tag_for(s) for s in steps]
    assert tag_for(30) == "step00000030"


def test_a_checkpoint_of_before_the_file_list_is_judged_by_its_deepspeed_files(tmp_path):
    """An older cll_meta.json held only step and world size: such a checkpoint is complete when it
    has the model states and one optimizer file per rank, and its world size is that count."""
    d = tmp_path / tag_for(5)
    d.mkdir()
    (d / META).write_text('{"step": 5, "world_size": 2}')
    (d / "mp_rank_00_model_states.pt").write_bytes(b"m")
    (d / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"o")
    assert checkpoint_problem(tmp_path, tag_for(5)) == "model or optimizer states missing"
    (d / "zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(b"o")
    assert checkpoint_problem(tmp_path, tag_for(5)) is None
    (d / META).unlink()
    assert checkpoint_world_size(tmp_path, tag_for(5)) == 2


def test_an_old_client_state_is_read_in_todays_layout():
    """Checkpoints written before states were registered kept the train state's fields at the top
    level and one stream and RNG entry per rank beside them."""
    old = {"step": 7, "elapsed": 1.5, "tokens_seen": 900, "data": "sha", "streams": [{"pos": 1}, {"pos": 2}],
           "rng": ["r0", "r1"]}
    assert upgrade_client_state(old) == {"train": {"step": 7, "elapsed": 1.5, "tokens_seen": 900},
                                         "stream": [{"data": "sha", "stream": {"pos": 1}},
                                                    {"data": "sha", "stream": {"pos": 2}}],
                                         "rng": ["r0", "r1"]}
    today = {"train": {"step": 7}, "stream": [], "rng": []}
    assert upgrade_client_state(today) is today
