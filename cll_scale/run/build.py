"""``build_run``: a recipe becomes a run: the manifest, the stream, the model, the DeepSpeed
engine, and the components that own the rest (a :class:`Checkpointer` with the registered
states it saves, a :class:`Validator`, one :class:`MetricsLogger`). The :class:`Trainer` then
only trains it. DeepSpeed is reached through :mod:`cll_scale.training.engine` alone.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from cll_scale.core.compat import LEGACY, LEGACY_MODEL
from cll_scale.core.hardware import available_memory, cpu_bf16_speedup, size_text
from cll_scale.core.outputs import DirLock, check_apart, check_owner, json_text, write_atomic
from cll_scale.core.settings import default_of
from cll_scale.core.versions import versions
from cll_scale.data.manifest import Manifest
from cll_scale.data.stream import ShardStream
from cll_scale.model.bf16 import emulates_bf16, matmul_mode
from cll_scale.model.export import export_model_config, load_export
from cll_scale.model.model import CLLTransformer, projected_loss, projected_loss_graph, target_positions
from cll_scale.run.recipe import SECTIONS, RunConfig, build_configs, section_classes
from cll_scale.training import collectives
from cll_scale.training import engine as ds
from cll_scale.training.checkpointer import Checkpointer
from cll_scale.training.metrics import MetricsLogger, device_peak_tflops
from cll_scale.training.optim import GuardedAdamW
from cll_scale.training.precision import precision, read_ds_config, resolve_ds_config
from cll_scale.training.rundir import RunDir, git_commit
from cll_scale.training.validator import Validator


def local_part() -> tuple[int, int]:
    """This process's index among the processes of its node, and their number (torchrun says
    ``LOCAL_WORLD_SIZE``, DeepSpeed's launcher ``LOCAL_SIZE``; alone: ``(0, 1)``)."""
    size = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or os.environ.get("WORLD_SIZE", "1")
    return int(os.environ.get("LOCAL_RANK", 0)), max(1, int(size))


def set_threads() -> None:
    """One thread per rank when ranks share the CPU cores: measured on 2 cores, 20 steps of two
    ranks took 0.35 s with one thread each and 2.34 s with two."""
    if torch.cuda.is_available():
        return
    n = os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(int(n) if n else max(1, (os.cpu_count() or 1) // local_part()[1]))


def frozen_names(names: list[str], patterns: list[str]) -> set[str]:
    """The parameter names that ``train.freeze`` globs select; a glob that selects nothing is an
    error, not a silent no-op (a typo would otherwise train what was meant to stay fixed)."""
    frozen: set[str] = set()
    for pattern in patterns:
        hits = fnmatch.filter(names, pattern)
        if not hits:
            raise ValueError(f"freeze pattern {pattern!r} matches no parameter (names look like "
                             f"{names[0]}, {names[-1]})")
        frozen.update(hits)
    return frozen


# -- the states a checkpoint holds (Checkpointer.register) --------------------------------------

@dataclass
class TrainState:
    """Where training stands; the same on every rank (``epoch`` is recomputed from the stream)."""
    step: int = 0
    elapsed: float = 0.0           # training seconds, the ranks' mean
    tokens_seen: int = 0
    epoch: float = 0.0             # of the current train.shards, averaged over ranks

    def state_dict(self) -> dict:
        return {"step": self.step, "elapsed": self.elapsed, "tokens_seen": self.tokens_seen}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.elapsed = int(state["step"]), float(state["elapsed"])
        self.tokens_seen = int(state.get("tokens_seen", 0))


class StreamPosition:
    """This rank's place in the data stream, valid only on the shards it was taken on: a resume on
    other shards is refused unless ``train.new_data`` says so (the stream then starts afresh)."""

    def __init__(self, stream: ShardStream, data: str, fingerprint: str, new_data: bool, where: str, log):
        self.stream, self.data, self.fingerprint = stream, data, fingerprint
        self.new_data, self.where, self.log = new_data, where, log

    def state_dict(self) -> dict:
        return {"data": self.fingerprint, "stream": self.stream.state_dict()}

    def load_state_dict(self, state: dict, strict_world: bool = True) -> None:
        if state.get("data", self.fingerprint) == self.fingerprint:
            self.stream.load_state_dict(state["stream"], strict_world=strict_world)
        elif not self.new_data:
            raise ValueError(f"the training shards of {self.data} are not the ones {self.where} was "
                             f"trained on; to continue this run on new data pass --set train.new_data=true "
                             f"(the data stream then starts afresh)")
        else:
            self.log(f"continuing {self.where} on new data ({self.data}): weights, optimizer and "
                     f"schedule carry on, the data stream starts afresh")


class RNGState:
    """This rank's torch RNG (dropout); not carried to another world size."""

    def state_dict(self) -> torch.Tensor:
        return torch.get_rng_state()

    def load_state_dict(self, state: torch.Tensor, strict_world: bool = True) -> None:
        if strict_world:
            torch.set_rng_state(state)


# -- the run ------------------------------------------------------------------------------------

@dataclass
class Run:
    """Everything :func:`build_run` makes; the Trainer trains it."""
    cfg: RunConfig
    rank: int
    world: int
    run_dir: Path
    manifest: Manifest
    stream: ShardStream
    model: CLLTransformer
    engine: object
    ds_config: dict
    checkpointer: Checkpointer
    validator: Validator
    metrics: MetricsLogger
    state: TrainState
    lock: DirLock | None
    frozen: dict[str, torch.Tensor] = field(default_factory=dict)  # frozen tensors as init_from has them
    guard: GuardedAdamW | None = None      # the client optimizer that decides skips on the device
    loss_fn: object = projected_loss      # (features, weight, target, pad_id, smoothing)
    touch_lsls: bool = False
    peak_flops: float | None = None        # of all ranks together, for MFU

    @property
    def device(self) -> torch.device:
        return self.engine.device

    def loss(self, dev) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, nll) of a batch on the device: the engine's forward to the decoder's features,
        then :attr:`loss_fn` with the tied output projection inside it (the logits never whole)."""
        model = self.engine.module
        features = self.engine(dev.src_tokens, model.shift_right(dev.tgt_tokens), dev.tgt_lang,
                               lang_runs=dev.lang_runs, features_only=True)
        pad = self.cfg.model.pad_id
        features, target = target_positions(features, dev.tgt_tokens, pad, dev.ntokens)
        return self.loss_fn(features, model.embed.weight, target, pad, self.cfg.train.label_smoothing)

    def matmuls(self):
        """The block this run's passes run in (:func:`cll_scale.model.bf16.matmul_mode`)."""
        return matmul_mode(precision(self.ds_config), self.device)

    def export(self, tag: str, lr: float, name: str = "export", info: dict | None = None) -> None:
        """Consolidate checkpoint ``tag`` into ``run_dir/name`` (``export-best/`` with ``info``
        saying why it was chosen)."""
        path = self.checkpointer.export(tag, self.frozen, self.cfg.model, self.cfg.train.shards, self.manifest,
                                        {"step": self.state.step, "lr": lr, "lang_tag": self.cfg.data.add_lang_tag,
                                         **(info or {})}, name)
        if path is not None:
            log(self.rank, f"exported {path}" + (f" ({info})" if info else ""))

    def close(self) -> None:
        """Release the run directory (the Trainer does it when training ends)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def log(rank: int, message: str) -> None:
    if rank == 0:
        tqdm.write(f"[cll-train] {message}", file=sys.stderr)


def build_run(recipe: dict, resume: bool = False) -> Run:
    """Build the run of ``recipe``: checks first (shards, budget, the run directory's owner and
    settings), then the stream, the model, the engine and the components, then restore the
    newest complete checkpoint when resuming."""
    set_threads()
    rank, world, _ = ds.init_distributed()
    data_dir = recipe.get("train", {}).get("shards")
    if not data_dir:
        raise ValueError("no shard directory: set train.shards in the recipe or pass --data")
    manifest = Manifest.load(data_dir)
    cfg = _resolve(recipe, manifest, data_dir)
    if str(cfg.train.ds_config) != "auto":     # a recipe or a damaged file as --ds-config: before the lock and the model
        read_ds_config(resolve_ds_config(cfg.train.ds_config)[0])
    check_memory(cfg)
    cfg.log.dashboards()            # a dashboard asked for and not installed: refused before any work
    run_dir = Path(cfg.train.run_dir)
    if resume and not run_dir.is_dir():
        raise FileNotFoundError(f"--resume: {run_dir} does not exist, so there is nothing to resume; "
                                "check --run-dir, or drop --resume to start a new run")
    check_owner(run_dir, "cll-train", "--run-dir")
    check_apart(run_dir, {"--data": data_dir, "train.init_from": cfg.train.init_from}, "--run-dir")
    # One process writes a run directory (rank 0 of the run holds the lock until training ends).
    lock = collectives.on_rank0(DirLock(run_dir, "training run").acquire, str(run_dir))
    try:
        return _build(cfg, manifest, run_dir, lock, rank, world, resume)
    except BaseException:
        if lock is not None:
            lock.abandon()      # a start that failed leaves no lock file, nor a directory it made
        raise


def _resolve(recipe: dict, manifest: Manifest, data_dir: str) -> RunConfig:
    """The recipe's typed sections; with ``init_from`` the architecture comes from the export
    (the recipe's model fields still override) and must fit the shards."""
    init_from = recipe.get("train", {}).get("init_from")
    if init_from:
        exported = export_model_config(init_from)
        if (exported.get("languages") != manifest.languages
                or exported.get("vocab_size") != manifest.tokenizer.vocab_size):
            raise ValueError(f"{init_from} was built for languages {exported.get('languages')} and "
                             f"{exported.get('vocab_size')} subwords, {data_dir} has "
                             f"{manifest.languages} and {manifest.tokenizer.vocab_size}")
        recipe = {**recipe, "model": {**exported, **recipe.get("model", {})}}
    # The recipe's own model settings are checked against the shards here (check_model_fits_shards).
    cfg = build_configs(recipe, manifest.languages, manifest.central_language, manifest.tokenizer,
                        max_length=manifest.max_length)
    if not (cfg.train.max_steps or cfg.train.max_minutes or cfg.train.max_epochs):
        raise ValueError("no budget: set --max-steps, --max-minutes and/or train.max_epochs")
    return cfg


# Bytes a row of a mixed pool holds on the host, ids and bookkeeping (the measured ~310 B that
# data.pool_rows is sized by).
POOL_ROW_BYTES = 310


def check_memory(cfg: RunConfig) -> None:
    """Refuse, before anything is allocated, a run whose model or mixed pool cannot fit: the
    training state of the model (:meth:`ModelConfig.training_bytes`) on the device that trains
    it, and on the host the model as built there plus ``data.mix_rows`` rows. A size typed with
    a few zeros too many would otherwise fail in the allocator with a traceback, or swap the
    machine for minutes before the first step."""
    model = cfg.model
    sizes = ", ".join(f"model.{k}={getattr(model, k):,}" for k in ("d_model", "ffn_dim", "max_positions"))
    pool = cfg.data.mix_rows * POOL_ROW_BYTES if cfg.data.mixing == "mixed" else 0
    cuda = torch.cuda.is_available()
    host_need = pool + (4 * model.parameter_count() + 4 * model.max_positions * model.d_model if cuda
                        else model.training_bytes())
    device_need = model.training_bytes() if cuda else 0
    host, device = available_memory("cpu"), available_memory(f"cuda:{local_part()[0]}") if cuda else 0
    if device_need > device and cuda:
        raise ValueError(f"the model ({sizes}: {model.parameter_count():,} parameters) needs "
                         f"{size_text(device_need)} to train (weights, gradients, AdamW's moments), more than "
                         f"the {size_text(device)} free on the GPU; make it smaller")
    if host_need > host:
        what = [f"the model ({sizes}: {model.parameter_count():,} parameters) "
                f"{size_text(host_need - pool)}" + ("" if cuda else " to train")]
        if pool:
            what.append(f"the mixed pool (data.mix_rows={cfg.data.mix_rows:,} x ~{POOL_ROW_BYTES} B) {size_text(pool)}")
        raise ValueError(f"this run needs more memory than the {size_text(host)} available: "
                         + " and ".join(what) + "; make the larger one smaller")


def _build(cfg: RunConfig, manifest: Manifest, run_dir: Path, lock, rank: int, world: int, resume: bool) -> Run:
    say = lambda message: log(rank, message)   # noqa: E731
    checkpointer = Checkpointer(cfg.checkpoint, run_dir, rank)
    if checkpointer.exists() and not resume:
        raise FileExistsError(f"{run_dir} already has checkpoints; pass --resume to continue "
                              f"it, or choose another run directory")
    tag, universal = checkpointer.resumable_tag(world, say)
    if resume and not tag:
        say(f"warning: --resume, but {run_dir} holds no checkpoint yet: training starts at step 0")
    if tag:
        check_recorded_settings(run_dir, cfg)
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
    # The stream checks the shards first: a damaged one stops the run before anything starts
    # (the rank that finds it raises; the launcher then stops the others). The processes of
    # a node share the hashing of its files, so each byte is read once per node.
    stream = ShardStream(cfg.train.shards, cfg.data, rank, world, verify_part=local_part(), manifest=manifest)
    torch.manual_seed(cfg.train.seed)        # identical initial weights on every rank
    model = CLLTransformer(cfg.model)
    frozen = init_and_freeze(model, cfg.train.init_from, cfg.train.freeze, tag, say)
    ds_config = ds.make_ds_config(cfg.train.ds_config, cfg.optim, cfg.train.grad_accum, world, run_dir, universal,
                                  cfg.log.dashboards())
    guard, loss_fn = None, projected_loss
    if cfg.train.compile:
        loss_fn = compile_model(model, cfg.train.compile)

    def optimizer(module):
        nonlocal guard
        guard = GuardedAdamW([p for p in module.parameters() if p.requires_grad], clip_norm=cfg.optim.clip_norm,
                             partitioned=ds.zero_stage(ds_config) > 0, **cfg.optim.adamw_kwargs())
        return guard
    engine = ds.initialize(model, ds_config, optimizer, cfg.optim.scheduler)
    run = Run(cfg, rank, world, run_dir, manifest, stream, model, engine, ds_config, checkpointer,
              validator=None, metrics=MetricsLogger(run_dir / "metrics.jsonl", rank,
                                                    lambda events: ds.monitor_events(engine, events)),
              state=TrainState(), lock=lock, frozen=frozen, guard=guard, loss_fn=loss_fn,
              # ZeRO-2 reduces gradients in buckets filled as parameters get theirs: ranks whose
              # mixed batches hold different target languages would fill different buckets, and
              # their collectives would not pair. A zero term gives every rank every LSL's
              # gradient (zeros for an absent language, which ZeRO-2's flat buffers hold anyway).
              touch_lsls=world > 1 and stream.mixed and len(model.lsl) > 0)
    _register_states(run, tag, universal, say)
    _finish(run, say)
    return run


def _register_states(run: Run, tag: str | None, universal: bool, say) -> None:
    """The states a checkpoint saves, restored from ``tag`` when there is one."""
    where = run.checkpointer.dir / tag if tag else run.run_dir
    position = StreamPosition(run.stream, run.cfg.train.shards, run.manifest.fingerprint("train"),
                              run.cfg.train.new_data, str(where), say)
    run.checkpointer.register("train", run.state)
    run.checkpointer.register("stream", position, per_rank=True)
    run.checkpointer.register("rng", RNGState(), per_rank=True)
    torch.manual_seed(run.cfg.train.seed * 1000 + run.rank)   # dropout differs between ranks
    if tag:
        run.checkpointer.load(run.engine, tag, run.world, universal)
        run.state.epoch = collectives.host_all_reduce([run.stream.epoch])[0] / run.world
        say(f"resumed from {where} at step {run.state.step}"
            + (" (universal checkpoint, world size changed)" if universal else ""))
    dropped = run.metrics.truncate_after(run.state.step)
    if dropped and not tag:
        say(f"dropped {dropped} metrics.jsonl lines of an earlier attempt that left no checkpoint")


def _finish(run: Run, say) -> None:
    """The validator, the MFU peak, and the run directory's self-description."""
    cfg = run.cfg
    run.validator = Validator(cfg.valid, cfg.train.shards, cfg.data, run.manifest, run.rank, run.world, run.device,
                              run.checkpointer.best_so_far(cfg.valid.best_metric, run.state.step))
    peak, why = device_peak_tflops(cfg.log, run.device)
    run.peak_flops = peak * 1e12 * run.world if peak else None
    if peak:
        say(f"MFU against {peak:g} TFLOP/s dense bf16 per rank ({why})")
    if emulates_bf16(precision(run.ds_config), run.device):
        say(f"bf16 matmuls run in fp32 on bf16 operands, rounded to bf16, as bf16 units compute them "
            f"(this CPU's own bf16 matmuls run {cpu_bf16_speedup():.2f}x as fast as fp32)")
    if run.rank == 0:
        write_atomic(run.run_dir / "config.json", json_text(cfg.to_json(), indent=1))
        write_atomic(run.run_dir / "ds_config.json", json_text(run.ds_config, indent=1))
        (run.run_dir / "git.txt").write_text(git_commit() + "\n")
        write_atomic(run.run_dir / "versions.json", json_text(versions(), indent=1))
    if run.validator.split is None:
        say("the shards have no validation split: no validation, and no export-best/")


# A resume continues one run: every setting that changes what it trains, or how, must be the
# run's own. These are the ones that may change between two parts of a run, because they decide
# only where it stops, what it logs, validates or keeps, where it reads and writes, and the
# engine it runs on (another world size or precision resumes through DeepSpeed's checkpoints).
# The shards and train.init_from are paths: a moved input resumes (the stream checks the shards'
# fingerprint, _resolve the export's languages and vocabulary; the weights come from the checkpoint).
# Anything else (a learning rate, the microbatch, the temperature, label smoothing, …) would
# make the resume no longer exact, or be written into config.json as if the run had used it.
MAY_CHANGE_ON_RESUME = {
    "train": ("shards", "init_from", "run_dir", "ds_config", "compile", "new_data", "max_steps", "max_epochs", "max_minutes",
              "max_skips_in_a_row"),
    "data": ("verify",),
    "checkpoint": ("every", "keep_last", "export"),
    "valid": ("every",),
    "log": ("every", "peak_tflops", "tensorboard", "wandb"),
}
# With train.new_data (cll-bt's epochs) the rows change on purpose: which split, directions and
# share; the input format (the tag) and everything else never do.
MAY_CHANGE_WITH_NEW_DATA = {"data": ("split", "directions", "rows_fraction")}


def check_recorded_settings(run_dir: Path, cfg: RunConfig) -> None:
    """A resume must rebuild the model the run trained and train it as the run did: any setting
    outside :data:`MAY_CHANGE_ON_RESUME` that differs from the run's config.json (another
    preset, other shards' vocabulary or languages, another schedule, microbatch, data selection
    or input format) is refused before anything is loaded, so config.json never records it."""
    if not RunDir(run_dir).has_config():
        return
    config = RunDir(run_dir).config()                 # runs of before the sections read the same
    recorded = {**LEGACY_MODEL, **config.get("model", {})}
    now = cfg.model.to_json()
    diff = [f"model.{k}={recorded[k]!r} (now {now[k]!r})" for k in sorted(now)
            if k in recorded and recorded[k] != now[k] and k != "languages"]
    if recorded.get("languages", now["languages"]) != now["languages"]:
        diff.append(f"languages {recorded['languages']} (now {now['languages']})")
    free = {s: set(keys) for s, keys in MAY_CHANGE_ON_RESUME.items()}
    if cfg.train.new_data:
        for section, keys in MAY_CHANGE_WITH_NEW_DATA.items():
            free.setdefault(section, set()).update(keys)
    classes = section_classes()
    for section in SECTIONS:
        if section == "model":
            continue
        was_section, now_section = config.get(section) or {}, _as_json(dataclasses.asdict(getattr(cfg, section)))
        for key, value in now_section.items():
            if key in free.get(section, ()):
                continue
            # a config.json of before a setting existed was trained with the rule of then
            # (compat.LEGACY), else with the setting's default
            was = _as_json(was_section[key] if key in was_section
                           else LEGACY.get(section, {}).get(key, default_of(classes[section], key)))
            if was != value:
                diff.append(f"{section}.{key}={was!r} (now {value!r})")
    if diff:
        may = ", ".join(f"{s}.{k}" for s, keys in MAY_CHANGE_ON_RESUME.items() for k in keys
                        if (s, k) not in (("train", "run_dir"), ("train", "new_data")))
        raise ValueError(f"--resume: {run_dir} was trained with " + ", ".join(diff)
                         + f"; resume with the run's own settings, or train into another --run-dir "
                         f"(a resume may change only {may})")


def _as_json(value):
    """A setting as config.json holds it (tuples as lists, directions as strings), so that a
    recorded value and today's compare equal when they are the same."""
    return json.loads(json_text(value))


def init_and_freeze(model: CLLTransformer, init_from: str, freeze: list[str], tag: str | None,
                    say) -> dict[str, torch.Tensor]:
    """Start from ``init_from`` (unless a checkpoint takes over) and freeze the parameters
    matching ``freeze``. Returns the frozen tensors as ``init_from`` has them: under bf16
    DeepSpeed keeps no fp32 master copy of a parameter it does not train, so exports take them
    from here."""
    # A resumed run takes its weights from the checkpoint: the export is read only for the
    # values of frozen parameters.
    needed = init_from and (not tag or freeze)
    init = load_export(init_from)[0].state_dict() if needed else None
    if init is not None and not tag:
        model.load_state_dict(init, strict=True)
    frozen = frozen_names([n for n, _ in model.named_parameters()], freeze)
    for name, param in model.named_parameters():
        if name in frozen:
            param.requires_grad_(False)
    if frozen:
        say(f"{len(frozen)} parameter tensors frozen")
    # Without init_from the checkpoint's consolidated copy is all there is.
    return {n: init[n].clone() for n in frozen} if init is not None else {}


def compile_model(model: CLLTransformer, backend: str):
    """Compile the blocks in place (parameter names unchanged) and return the compiled loss (the
    output projection and the loss in plain ops, :func:`projected_loss_graph`), whose element-wise
    work the compiler fuses."""
    backends = torch._dynamo.list_backends(exclude_tags=())
    if backend not in backends:
        raise ValueError(f"train.compile={backend!r} is not a torch.compile backend "
                         f"({', '.join(backends)}; \"\" for none)")
    model.compile_blocks(backend)
    return torch.compile(projected_loss_graph, backend=backend, dynamic=True)
