"""Speed of the real trainer (cll-train's loop through DeepSpeed) beside the plain PyTorch step of
the same model, at the same batches, measured side by side in one process.

    python bench/bench_train.py --data data/shards/multi30k-centered              # CPU, small
    python bench/bench_train.py --data SHARDS --device cuda --preset base --batch-tokens 24000
    python bench/bench_train.py --data SHARDS --only configs                       # the ZeRO table

Parts:
* ``trainer``  tokens/s of ``Trainer.run_step`` (train step, agreement between ranks, metrics
               window, log lines) ÷ tokens/s of a plain step (model, loss, backward, fused AdamW),
               blocks of steps alternating on the same batches (target on a GPU: ≥ 0.85);
               ``--compile inductor`` adds a compiled trainer beside the same eager plain step;
               ``--profile`` adds where the trainer's extra time goes: blocks of each side under
               torch.profiler, the ops whose self time the trainer adds (ms and calls a step), and
               each side's ops a step (kernels, host reads of a tensor value).
* ``configs``  the same ratio for engine settings side by side: ZeRO stage 0/1/2, bucket sizes,
               overlap_comm, contiguous_gradients, DeepSpeed's own overflow check and gradient
               norm (what our client optimizer replaces), gradient clipping off, and (CPU) fp32
               against bf16.
* ``langs``    FCLL ÷ Baseline step time through the DeepSpeed engine with 16 and with 99 target
               languages (OPUS-100's shape: 98 LSLs per CLL layer), for both mixings of the
               stream (issue 34): synthetic batches of one target language each, cycling over the
               languages, and mixed batches whose rows spread uniformly over every language, ordered
               by target language as the stream orders them, and over 8 languages a batch
               (``data.mix_directions: 8``) (target ≤ 1.04). Also FCLL mixed ÷ FCLL one-language:
               what mixing costs the CLL step itself.
Each trainer runs in this process, one rank; the plain step uses the trainer's precision (bf16
weights when the engine runs bf16, as ``bench_model.py``'s plain step does).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from cll_scale.training import collectives  # noqa: E402

from cll_scale.training import engine as ds  # noqa: E402
from cll_scale.core import hardware  # noqa: E402
from cll_scale.core.cli import pick_device  # noqa: E402
from cll_scale.core.errors import run_guarded  # noqa: E402
from cll_scale.training import precision  # noqa: E402
from cll_scale.model.model import CLLTransformer, projected_loss  # noqa: E402
from cll_scale.run.build import build_run  # noqa: E402
from cll_scale.run.trainer import Trainer  # noqa: E402
from bench_model import minor_faults, mixed_batch, op_counts, synthetic_batch  # noqa: E402


class Recorder:
    """Wraps the trainer's stream: every batch it hands out is kept for the plain step."""

    def __init__(self, stream):
        self.stream, self.taken = stream, []

    def __next__(self):
        batch = next(self.stream)
        self.taken.append(batch)
        return batch

    def __getattr__(self, name):
        return getattr(self.stream, name)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def plain_step_fn(trainer: Trainer):
    """The same architecture, initial weights and precision as the trainer, trained by hand."""
    dtype = torch.bfloat16 if trainer.engine.bfloat16_enabled() else torch.float32
    torch.manual_seed(trainer.cfg.train.seed)
    model = CLLTransformer(trainer.cfg.model).to(trainer.device, dtype=dtype).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step(batch):
        dev = batch.to(trainer.device)
        features = model(dev.src_tokens, model.shift_right(dev.tgt_tokens), dev.tgt_lang, lang_runs=dev.lang_runs,
                         features_only=True)
        loss, _ = projected_loss(features, model.embed.weight, dev.tgt_tokens, model.cfg.pad_id, 0.1)
        (loss / batch.ntokens).backward()
        if trainer.cfg.optim.clip_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), trainer.cfg.optim.clip_norm, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def run_side(trainer: Trainer, plain, side: str, block_steps: int) -> None:
    """One block of trainer steps (its batches recorded), or the plain step on the batches the
    trainer's last block used; the device synchronised on both ends."""
    sync(trainer.device)
    if side == "trainer":
        for _ in range(block_steps):
            trainer.run_step()
    else:
        for b in trainer.stream.taken:
            plain(b)
    sync(trainer.device)


def measure(trainer: Trainer, blocks: int, block_steps: int, warmup: int, profile: bool = False) -> dict:
    """Alternate blocks of trainer steps and plain steps on the batches the trainer just used
    (and with ``profile``, :func:`profile_pair` after them)."""
    trainer.stream = Recorder(trainer.stream)
    plain = plain_step_fn(trainer)
    trainer.engine.train()
    rates = {"trainer": [], "plain": []}
    faults = {"trainer": [], "plain": []}       # minor page faults a step: first touches of fresh memory
    for block in range(warmup + blocks):
        trainer.stream.taken = []
        f, t = minor_faults(), time.perf_counter()
        run_side(trainer, plain, "trainer", block_steps)
        t_trainer, f_trainer = time.perf_counter() - t, minor_faults() - f
        batches = trainer.stream.taken
        tokens = sum(b.ntokens for b in batches)
        f, t = minor_faults(), time.perf_counter()
        run_side(trainer, plain, "plain", block_steps)
        t_plain, f_plain = time.perf_counter() - t, minor_faults() - f
        if block >= warmup:
            rates["trainer"].append(tokens / t_trainer)
            rates["plain"].append(tokens / t_plain)
            faults["trainer"].append(f_trainer / block_steps)
            faults["plain"].append(f_plain / len(batches))
    trainer_rate, plain_rate = statistics.median(rates["trainer"]), statistics.median(rates["plain"])
    row = {"trainer_tok_s": trainer_rate, "plain_tok_s": plain_rate, "trainer_over_plain": trainer_rate / plain_rate,
           "tokens_per_step": tokens / block_steps, "trainer_minor_faults_per_step": statistics.median(faults["trainer"]),
           "plain_minor_faults_per_step": statistics.median(faults["plain"])}
    if profile:
        row.update(profile_pair(trainer, plain, block_steps))
    return row


def profile_pair(trainer: Trainer, plain, block_steps: int, reps: int = 3) -> dict:
    """``reps`` times, one block of trainer steps and then the plain step on the same batches,
    each under torch.profiler: each side's ms and ops a step, and the ops whose self time the
    trainer adds, with the calls a step it adds (median over the reps: one profile on a shared
    host moves by more than the gap; an op the trainer calls more often is a cause, a matmul
    that only took longer may be the host)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if trainer.device.type == "cuda" else [])
    ms = {"trainer": [], "plain": []}
    calls, ops = {}, {}
    for _ in range(reps):
        trainer.stream.taken = []
        for side in ("trainer", "plain"):
            with profile(activities=activities) as prof:
                run_side(trainer, plain, side, block_steps)
            averages = prof.key_averages()
            ms[side].append({e.key: e.self_cpu_time_total / block_steps / 1e3 for e in averages})
            calls[side] = {e.key: e.count / block_steps for e in averages}
            ops[side] = op_counts(prof.events(), block_steps)

    def median_ms(side, op):
        return statistics.median(rep.get(op, 0.0) for rep in ms[side])
    names = set().union(*ms["trainer"], *ms["plain"])
    extra = {op: median_ms("trainer", op) - median_ms("plain", op) for op in names}
    top = sorted(extra.items(), key=lambda kv: kv[1], reverse=True)[:10]
    return {"profile_reps": reps,
            "profiled_trainer_ms": statistics.median(sum(rep.values()) for rep in ms["trainer"]),
            "profiled_plain_ms": statistics.median(sum(rep.values()) for rep in ms["plain"]),
            "trainer_ops_per_step": ops["trainer"], "plain_ops_per_step": ops["plain"],
            "trainer_extra_top_ops": [(op, round(d, 2), round(calls["trainer"].get(op, 0) - calls["plain"].get(op, 0), 1))
                                      for op, d in top]}


def make_trainer(args, run_dir: Path, ds_config: str | dict, clip_norm: float | None = None,
                 compile_backend: str = "") -> Trainer:
    if isinstance(ds_config, dict):
        path = run_dir.parent / f"{run_dir.name}-ds.json"
        path.write_text(json.dumps(ds_config))
        ds_config = str(path)
    train = {"shards": args.data, "run_dir": str(run_dir), "ds_config": ds_config, "max_steps": 10 ** 9,
             "compile": compile_backend}
    optim = {"warmup_steps": 100, **({} if clip_norm is None else {"clip_norm": clip_norm})}
    recipe = {"preset": args.preset, "model": {"variant": args.variant},
              "data": {"batch_tokens": args.batch_tokens, "verify": "size"}, "train": train, "optim": optim,
              "log": {"every": args.block_steps}, "valid": {"every": 10 ** 9},
              "checkpoint": {"every": 10 ** 9, "export": False}}
    return Trainer(build_run(recipe))


def base_config(args, device) -> dict:
    name = ("gpu_bf16.json" if device.type == "cuda" else
            "cpu_bf16.json" if hardware.cpu_bf16_speedup() > 1.1 else "cpu_fp32.json")
    return precision.read_ds_config(precision.DS_CONFIGS / name), name


def variants(args, device) -> list[tuple[str, dict, float | None]]:
    base, name = base_config(args, device)
    bf16 = base.get("bf16", {}).get("enabled", False)

    def edit(**zero):
        cfg = copy.deepcopy(base)
        cfg["zero_optimization"].update(zero)
        return cfg
    rows = [(f"{name} (shipped)", base, None),
            ("stage 1", edit(stage=1), None),
            ("stage 0", edit(stage=0), None),
            ("buckets 5e7", edit(reduce_bucket_size=int(5e7), allgather_bucket_size=int(5e7)), None),
            ("buckets 5e8", edit(reduce_bucket_size=int(5e8), allgather_bucket_size=int(5e8)), None),
            ("overlap_comm " + ("off" if base["zero_optimization"].get("overlap_comm") else "on"),
             edit(overlap_comm=not base["zero_optimization"].get("overlap_comm")), None),
            ("contiguous_gradients off", edit(contiguous_gradients=False), None),
            ("+ DeepSpeed's gradient norm (per-parameter loop)", edit(compute_grad_norm=True), None),
            ("no gradient clipping", base, 0.0),
            ("csv_monitor off", {k: v for k, v in base.items() if k != "csv_monitor"}, None)]
    if bf16:
        overflow = copy.deepcopy(base)
        overflow["bf16"]["check_grad_overflow"] = True
        rows.append(("+ DeepSpeed's overflow check (host sync)", overflow, None))
    if device.type == "cpu":
        other = "cpu_fp32.json" if bf16 else "cpu_bf16.json"
        rows.append((other, precision.read_ds_config(precision.DS_CONFIGS / other), None))
    return rows


def engine_step_fn(model: CLLTransformer, ds_cfg_path: str, tmp: Path):
    """A training step of ``model`` through the DeepSpeed engine, as cll-train builds it."""
    from cll_scale.training.optim import GuardedAdamW, OptimConfig
    cfg = OptimConfig(lr=1e-4, warmup_steps=100)
    ds_cfg = ds.make_ds_config(ds_cfg_path, cfg, 1, 1, tmp)
    holder = {}

    def optimizer(m):
        holder["opt"] = GuardedAdamW(m.parameters(), clip_norm=cfg.clip_norm, partitioned=ds.zero_stage(ds_cfg) > 0,
                                     lr=cfg.lr, betas=cfg.betas)
        return holder["opt"]
    engine = ds.initialize(model, ds_cfg, optimizer, lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0))

    def step(batch, lang_runs):
        src, tgt, tgt_lang = batch
        features = engine(src, engine.module.shift_right(tgt), tgt_lang, lang_runs=lang_runs, features_only=True)
        loss, _ = projected_loss(features, engine.module.embed.weight, tgt, 0, 0.1)
        engine.backward(loss / tgt.numel())
        holder["opt"].loss_ok = torch.isfinite(loss)
        engine.step()
    return step, engine


def part_langs(args, device, tmp: Path) -> list[dict]:
    ds.init_distributed()
    from cll_scale.model.config import ModelConfig, PRESETS
    b, s, t = args.shape or ([128, 32, 32] if device.type == "cpu" else [256, 64, 64])
    base_cfg, _ = base_config(args, device)
    path = tmp / "langs-ds.json"
    path.write_text(json.dumps(base_cfg))
    vocab = 8000 if args.preset in ("tiny", "small") else 32000
    rows = []
    for n in args.target_languages:
        languages = ["en"] + [f"x{i:02d}" for i in range(n)]
        steps, tensors = {}, {}
        for variant in ("baseline", "fcll"):
            torch.manual_seed(0)
            model = CLLTransformer(ModelConfig(**PRESETS[args.preset], vocab_size=vocab, languages=languages,
                                               central_language="en", variant=variant))
            tensors[variant] = sum(1 for _ in model.parameters())
            steps[variant], _ = engine_step_fn(model, str(path), tmp)
        one = [synthetic_batch(b, s, t, vocab, device, lang=1 + i % n) for i in range(16)]
        one = [(batch, ((1 + i % n, b),)) for i, batch in enumerate(one)]
        # (batch, runs), as engine_step_fn's steps take them
        mixed, mixed8 = ([(m[:3], m[3]) for m in (mixed_batch(*batch[:2], seed=i, n=n, k=k)
                                                  for i, (batch, _) in enumerate(one))] for k in (0, 8))
        med = {}
        for mixing, batches in (("direction", one), ("mixed", mixed), ("mixed8", mixed8)):
            times = {v: [] for v in steps}
            for block in range(args.warmup + args.blocks):
                for v, fn in steps.items():
                    sync(device)
                    start = time.perf_counter()
                    for i in range(args.block_steps):
                        fn(*batches[(block * args.block_steps + i) % len(batches)])
                    sync(device)
                    if block >= args.warmup:
                        times[v].append(time.perf_counter() - start)
            med[mixing] = {v: statistics.median(x) / args.block_steps for v, x in times.items()}
        rows.append({"target_languages": n, "preset": args.preset,
                     "fcll_over_baseline": med["direction"]["fcll"] / med["direction"]["baseline"],
                     "fcll_over_baseline_mixed": med["mixed"]["fcll"] / med["mixed"]["baseline"],
                     "fcll_mixed_over_fcll_direction": med["mixed"]["fcll"] / med["direction"]["fcll"],
                     "fcll_over_baseline_mix_directions_8": med["mixed8"]["fcll"] / med["mixed8"]["baseline"],
                     "fcll_mix8_over_fcll_direction": med["mixed8"]["fcll"] / med["direction"]["fcll"],
                     "languages_per_mixed_batch": statistics.mean(len(r) for _, r in mixed),
                     "baseline_tensors": tensors["baseline"], "fcll_tensors": tensors["fcll"],
                     "baseline_step_s": med["direction"]["baseline"], "fcll_step_s": med["direction"]["fcll"],
                     "fcll_mixed_step_s": med["mixed"]["fcll"]})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(ROOT / "data" / "shards" / "multi30k-centered"))
    p.add_argument("--only", action="append", choices=("trainer", "configs", "langs"))
    p.add_argument("--shape", type=int, nargs=3, default=None, metavar=("B", "S", "T"),
                   help="synthetic batch of the langs part (default 128 32 32 on CPU, 256 64 64 on CUDA)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--preset", default="small")
    p.add_argument("--variant", default="fcll")
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--block-steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--target-languages", type=int, nargs="+", default=[16, 99],
                   help="langs: the numbers of non-central target languages to measure")
    p.add_argument("--compile", action="append", default=[], metavar="BACKEND",
                   help="trainer part: also a trainer with train.compile=BACKEND (its plain step stays eager)")
    p.add_argument("--profile", action="store_true",
                   help="trainer part: also profile a block of each side, three times (where the trainer's extra time goes)")
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args(argv)
    return run_guarded("bench_train", lambda: bench(args))


def bench(args) -> int:
    device = torch.device(pick_device(args.device))      # a missing CUDA is one line, as in every command
    if device.type == "cpu":
        os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
        torch.set_num_threads(args.threads)
    needs_shards = not args.only or {"trainer", "configs"} & set(args.only)
    if needs_shards and not (Path(args.data) / "manifest.json").exists():
        print(f"no shards at {args.data}: build them with cll-shards (make quickstart does)", file=sys.stderr)
        return 2
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        todo = []
        if not args.only or "trainer" in args.only:
            todo.append(("trainer", [("shipped", "auto", None)] +
                         [(f"shipped, train.compile={b}", "auto", None, b) for b in args.compile]))
        if not args.only or "configs" in args.only:
            todo.append(("configs", variants(args, device)))
        for part, rows in todo:
            results[part] = []
            for i, (name, cfg, clip, *backend) in enumerate(rows):
                trainer = make_trainer(args, Path(tmp) / f"{part}{i}", cfg, clip, *backend)
                row = {"setting": name, "preset": args.preset, "variant": args.variant, "device": device.type,
                       **measure(trainer, args.blocks, args.block_steps, args.warmup,
                                 profile=args.profile and part == "trainer")}
                results[part].append(row)
                print(part, json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}),
                      flush=True)
                del trainer
        if not args.only or "langs" in args.only:
            results["langs"] = part_langs(args, device, Path(tmp))
            for row in results["langs"]:
                print("langs", json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}),
                      flush=True)
    collectives.shutdown()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
