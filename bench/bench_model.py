"""Speed of the CLL Transformer's training step, as ratios measured side by side in one run.

    python bench/bench_model.py                 # everything that runs here (CPU)
    python bench/bench_model.py --only fcll     # one part: fcll, marian, mfu, storage, ranks, profile, loss, compile
    python bench/bench_model.py --device cuda --preset base   # unchanged on a GPU machine

Parts (each interleaves its contenders step by step and compares medians):
* ``fcll``    FCLL ÷ Baseline step time, 16 target languages, LSL 256, one language per batch
              and (issue 34) mixed batches over all 16, ordered by target language as the stream
              gives them (target ≤ 1.04; the added matmul FLOPs alone are 1.051× at `small`, 1.026× at `base`).
* ``storage`` one Parameter per language (all its layers) ÷ stacked [L, R, D] LSL storage per layer.
* ``marian``  our Baseline tokens/s ÷ Hugging Face MarianMTModel tokens/s, same shape, random
              weights built from a config (no download), fp32 and bf16 (target ≥ 1.0).
* ``mfu``     achieved FLOP/s ÷ measured peak matmul FLOP/s, fp32, `small` and `base`
              (targets ≥ 60% and ≥ 70%), and bf16's speed-up over fp32 (with the matmuls a bf16
              run gets: in fp32 on bf16 values on a CPU without bf16 units, cll_scale.model.bf16).
* ``ranks``   2 ranks × 1 thread ÷ 1 rank × 1 thread tokens/s through cll-train and DeepSpeed
              (target ≥ 1.8).
* ``profile`` where the plain step's time goes (torch.profiler): each phase's share (forward and
              loss, backward, optimizer), the ten ops with the most self time, and per step the
              kernels (leaf aten ops that compute or copy: each a launch on a GPU), the view and
              allocation ops and the host reads, fp32 and bf16; on a CPU also those counts with a
              GPU's kernel choices (``gpu_choices``); with ``--profile-variants baseline,fcll,fcll-mixed``
              also FCLL's extra milliseconds over the Baseline's, by phase and by op.
* ``loss``    the loss with the tied output projection inside it, in blocks of rows (the trainer's:
              neither the logits nor their gradient is ever whole) against the loss of the whole
              logits, fp32 and bf16: step time interleaved, minor page faults a step (Linux: each a
              4 KiB page the kernel maps on first touch) and peak RSS growth of a step.
* ``compile`` ``torch.compile`` (inductor, as ``train.compile``) against eager, the plain step,
              fp32 and bf16, and the first compiled step's seconds (the compile time).
On CUDA ``mfu`` reports tokens/s and MFU in bf16 against the device's dense bf16 peak
(``cll_scale.core.hardware.PEAK_BF16_TFLOPS``, by device name: H100/H200 989; --peak-tflops overrides).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cll_scale.model.config import ModelConfig, PRESETS  # noqa: E402
from cll_scale.training.metrics import read_rows  # noqa: E402
import cll_scale.model.model as mm  # noqa: E402
from cll_scale.model.model import CLLTransformer, label_smoothed_loss, projected_loss, train_flops  # noqa: E402
from cll_scale.core.hardware import peak_bf16_tflops  # noqa: E402
from cll_scale.core.cli import pick_device  # noqa: E402
from cll_scale.core.errors import run_guarded  # noqa: E402
from cll_scale.model.bf16 import emulates_bf16, matmul_mode  # noqa: E402

LANGS16 = ["en", "de", "fr", "cs", "es", "it", "nl", "pt", "ro", "ru", "pl", "sv", "fi", "hu", "el", "tr", "bg"]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def make_model(preset: str, variant: str, vocab: int, device, dtype, pre_norm=True, **kw) -> CLLTransformer:
    torch.manual_seed(0)
    cfg = ModelConfig(**{**PRESETS[preset], **kw}, vocab_size=vocab, languages=LANGS16, central_language="en",
                      variant=variant, pre_norm=pre_norm)
    return CLLTransformer(cfg).to(device=device, dtype=dtype).train()


def adamw(model: torch.nn.Module) -> torch.optim.AdamW:
    """The plain step's optimizer, ours and Marian's alike: fused AdamW, as the trainer's
    (:class:`cll_scale.training.optim.GuardedAdamW`). PyTorch's default on a CPU is its loop over
    parameters, about 1,100 ops a `small` step with a host read of each step counter."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)


def synthetic_batch(b, s, t, vocab, device, lang=1):
    g = torch.Generator().manual_seed(lang)
    src = torch.randint(4, vocab, (b, s), generator=g).to(device)
    tgt = torch.randint(4, vocab, (b, t), generator=g).to(device)
    return src, tgt, torch.full((b,), lang, dtype=torch.long, device=device)


def step_loss(model, batch, loss: str = "projected"):
    """The training loss of ``batch`` as the trainer takes it (``projected``: the features and the
    tied projection inside the blocked loss, the logits never whole), or from the whole logits
    (``logits``: the form before the projection moved into the loss)."""
    src, tgt, lang, *runs = batch          # runs: the (language, rows) runs the stream gives, if any
    runs = runs[0] if runs else None
    if loss == "logits":
        return label_smoothed_loss(model(src, model.shift_right(tgt), lang, lang_runs=runs), tgt, 0, 0.1)[0]
    features = model(src, model.shift_right(tgt), lang, lang_runs=runs, features_only=True)
    return projected_loss(features, model.embed.weight, tgt, 0, 0.1)[0]


def our_step(model, opt, batch, loss: str = "projected"):
    (step_loss(model, batch, loss) / batch[1].numel()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def interleave(steps: dict, n: int, device, warmup: int = 2) -> dict[str, float]:
    """Median seconds per step of each contender, run in turn A, B, A, B, ..."""
    times = {k: [] for k in steps}
    for i in range(warmup + n):
        for name, fn in steps.items():
            sync(device)
            t = time.perf_counter()
            fn(i)
            sync(device)
            if i >= warmup:
                times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


class MatmulProbe:
    """The machine's practical matmul peak, timed alongside the step it is compared with, so both
    see the same (shared, noisy) machine. Each call times square matmuls of each size in
    ``sizes`` one by one; the peak is the best rate seen in the run (issue 54: the median of a
    1,024² probe read 419 to 1,186 GFLOP/s in bf16 from one run to the next on the shared Xeon;
    the best of many single matmuls is what the matrix units can do, the rest is other tenants)."""

    def __init__(self, device, dtype, sizes=(1024, 2048)):
        self.device, self.rates = device, []
        self.pairs = [(torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype))
                      for n in sizes]

    def __call__(self, _):
        for a, b in self.pairs:
            sync(self.device)
            t = time.perf_counter()
            a @ b
            sync(self.device)
            self.rates.append(2.0 * a.shape[0] ** 3 / (time.perf_counter() - t))

    def summary(self) -> dict[str, float]:
        """Best, median and worst rate seen, GFLOP/s (warm-up calls included: only the best is used)."""
        return {"peak_gflops": max(self.rates) / 1e9, "probe_median_gflops": statistics.median(self.rates) / 1e9,
                "probe_min_gflops": min(self.rates) / 1e9}


def mixed_batch(src, tgt, seed: int, n: int = 16, k: int = 0):
    """A mixed batch (issue 34): the rows spread uniformly over the ``n`` non-central languages
    (over ``k`` of them drawn at random, as ``data.mix_directions`` does), ordered by target
    language as the mixed stream orders them, with their (language, rows) runs."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.randperm(n, generator=g)[:k] + 1 if k else torch.arange(1, n + 1)
    langs = torch.sort(pool[torch.randint(0, len(pool), (src.shape[0],), generator=g)]).values
    values, counts = torch.unique_consecutive(langs, return_counts=True)
    return src, tgt, langs.to(src.device), tuple(zip(values.tolist(), counts.tolist()))


# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def per_language_lsl():
    """Within the block a mixed batch's LSLs run one matmul pair per language (the form where
    ``F.grouped_mm`` does not run) instead of one grouped matmul per LSL layer."""
    saved = mm.grouped_mm_runs
    mm.grouped_mm_runs = lambda x: False
    try:
        yield
    finally:
        mm.grouped_mm_runs = saved


def per_language(fn, *args):
    with per_language_lsl():
        return fn(*args)


def part_fcll(args, device):
    b, s, t = args.shape
    rows = []
    for dtype in args.dtypes:
        models = {v: make_model(args.preset, v, args.vocab, device, dtype, lsl_dim=256) for v in ("baseline", "fcll")}
        opts = {v: adamw(m) for v, m in models.items()}
        # One target language per microbatch, cycling over the 16 non-central languages.
        batches = [synthetic_batch(b, s, t, args.vocab, device, lang=1 + i % 16) for i in range(16)]
        mixed = [mixed_batch(src, tgt, seed=i) for i, (src, tgt, _) in enumerate(batches)]
        steps = {v: (lambda i, v=v: our_step(models[v], opts[v], batches[i % 16])) for v in models}
        steps.update({f"{v} mixed": (lambda i, v=v: our_step(models[v], opts[v], mixed[i % 16])) for v in models})
        steps["fcll mixed per-language"] = lambda i: per_language(our_step, models["fcll"], opts["fcll"], mixed[i % 16])
        med = interleave(steps, args.steps, device)
        cfg = models["fcll"].cfg
        flop_ratio = train_flops(cfg, b, s, t) / train_flops(models["baseline"].cfg, b, s, t)
        rows.append({"dtype": str(dtype).split(".")[-1], "fcll_over_baseline": med["fcll"] / med["baseline"],
                     "fcll_over_baseline_mixed": med["fcll mixed"] / med["baseline mixed"],
                     "fcll_mixed_over_fcll": med["fcll mixed"] / med["fcll"],
                     "grouped_over_per_language_speed": med["fcll mixed per-language"] / med["fcll mixed"],
                     "flop_ratio": flop_ratio, "baseline_s": med["baseline"], "fcll_s": med["fcll"],
                     "fcll_mixed_s": med["fcll mixed"]})
    return rows


class StackedLSL(torch.nn.Module):
    """The alternative storage, for the measurement only: one [L, R, D] tensor per layer and weight."""

    def __init__(self, ffn_module, model):
        super().__init__()
        per_slot = [model.lsl_views(slot)[ffn_module.index] for slot in range(len(model.lsl))]
        stack = lambda k: torch.nn.Parameter(torch.stack([v[k].detach().clone() for v in per_slot]))  # noqa: E731
        self.w1, self.b1, self.w2, self.b2, self.t = (stack(k) for k in range(5))
        self.ffn, self.cll_dropout = ffn_module.ffn, ffn_module.cll_dropout

    def forward(self, x, groups, use_lsl=True):
        out = self.ffn(x)
        slot = groups.groups[0][0]
        h = torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, self.w1[slot], self.b1[slot])),
                                       self.w2[slot], self.b2[slot])
        return out + self.t[slot] * torch.nn.functional.dropout(h, self.cll_dropout, self.training)


def part_storage(args, device):
    b, s, t = args.shape
    dtype = args.dtypes[0]
    per_lang = make_model(args.preset, "fcll", args.vocab, device, dtype)
    stacked = make_model(args.preset, "fcll", args.vocab, device, dtype)
    for layer in stacked.decoder:
        layer.ffn = StackedLSL(layer.ffn, stacked).to(device)
    models = {"per_language": per_lang, "stacked": stacked}
    opts = {k: adamw(m) for k, m in models.items()}
    batches = [synthetic_batch(b, s, t, args.vocab, device, lang=1 + i % 16) for i in range(16)]
    med = interleave({k: (lambda i, k=k: our_step(models[k], opts[k], batches[i % 16])) for k in models},
                     args.steps, device)
    return [{"per_language_over_stacked": med["per_language"] / med["stacked"], **med}]


def marian_model(cfg: ModelConfig, device, dtype):
    from transformers import MarianConfig, MarianMTModel
    mc = MarianConfig(vocab_size=cfg.vocab_size, decoder_vocab_size=cfg.vocab_size, d_model=cfg.d_model,
                      encoder_layers=cfg.encoder_layers, decoder_layers=cfg.decoder_layers,
                      encoder_attention_heads=cfg.n_heads, decoder_attention_heads=cfg.n_heads,
                      encoder_ffn_dim=cfg.ffn_dim, decoder_ffn_dim=cfg.ffn_dim, activation_function="relu",
                      dropout=cfg.dropout, attention_dropout=cfg.attention_dropout,
                      activation_dropout=cfg.activation_dropout, max_position_embeddings=cfg.max_positions,
                      scale_embedding=True, share_encoder_decoder_embeddings=True, pad_token_id=0,
                      eos_token_id=3, decoder_start_token_id=2, forced_eos_token_id=3)
    torch.manual_seed(0)
    return MarianMTModel(mc).to(device=device, dtype=dtype).train()


def part_marian(args, device):
    b, s, t = args.shape
    rows = []
    for dtype in args.dtypes:
        ours = make_model(args.preset, "baseline", args.vocab, device, dtype, pre_norm=False)  # Marian is post-norm
        hf = marian_model(ours.cfg, device, dtype)
        opt_o = adamw(ours)
        opt_h = adamw(hf)
        batch = synthetic_batch(b, s, t, args.vocab, device)
        src, tgt, _ = batch

        def hf_step(_):
            out = hf(input_ids=src, attention_mask=(src != 0), labels=tgt)
            out.loss.backward()
            opt_h.step()
            opt_h.zero_grad(set_to_none=True)
        med = interleave({"ours": lambda i: our_step(ours, opt_o, batch), "marian": hf_step}, args.steps, device)
        tokens = b * t
        rows.append({"dtype": str(dtype).split(".")[-1], "ours_tok_s": tokens / med["ours"],
                     "marian_tok_s": tokens / med["marian"], "ours_over_marian": med["marian"] / med["ours"]})
    return rows


def gpu_peak(args) -> float:
    """TFLOP/s the GPU's MFU is measured against: --peak-tflops, else the datasheet table's."""
    name = torch.cuda.get_device_name()
    peak = args.peak_tflops or peak_bf16_tflops(name)
    if peak is None:
        raise SystemExit(f"no dense bf16 peak known for {name!r}; pass --peak-tflops")
    print(f"MFU against {peak:g} TFLOP/s dense bf16 ({name}"
          f"{', --peak-tflops' if args.peak_tflops else ', datasheet'})", flush=True)
    return peak


def part_mfu(args, device):
    rows = []
    presets = [args.preset] if device.type == "cuda" else ["small", "base"]
    dtypes = [torch.bfloat16] if device.type == "cuda" else [torch.float32, torch.bfloat16]
    for preset in presets:
        b, s, t = args.shape
        per_dtype = {}
        for dtype in dtypes:
            model = make_model(preset, "baseline", args.vocab if preset == "small" else 32000, device, dtype)
            opt = adamw(model)
            batch = synthetic_batch(b, s, t, model.cfg.vocab_size, device)
            # the matmuls a bf16 training run gets here: fp32 on bf16 values on a CPU without bf16 units
            name = "bf16" if dtype == torch.bfloat16 else "fp32"
            with matmul_mode(name, device):
                probe = MatmulProbe(device, dtype)
                meds = interleave({"step": lambda i: our_step(model, opt, batch), "peak": probe}, args.steps, device)
            med = meds["step"]
            flops = train_flops(model.cfg, b, s, t)
            probed = probe.summary()
            peak = gpu_peak(args) * 1e12 if device.type == "cuda" else probed["peak_gflops"] * 1e9
            per_dtype[dtype] = med
            rows.append({"preset": preset, "dtype": str(dtype).split(".")[-1],
                         "matmuls_in_fp32": emulates_bf16(name, device), "tok_s": b * t / med,
                         "achieved_gflops": flops / med / 1e9, **probed, "peak_gflops": peak / 1e9,
                         "mfu": flops / med / peak})
        if len(per_dtype) == 2:
            rows[-1]["bf16_speedup_over_fp32"] = per_dtype[torch.float32] / per_dtype[torch.bfloat16]
    return rows


def minor_faults() -> int:
    """This process's minor page faults so far: pages the kernel mapped on first touch (0 where
    the platform has no getrusage)."""
    try:
        import resource
    except ImportError:
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def part_compile(args, device):
    """``train.compile=inductor`` against eager: the plain `--preset` Baseline step with the model's
    blocks and the loss compiled (:func:`cll_scale.run.build.compile_model`, ``dynamic=True`` as
    the trainer does) ÷ the same step eager, interleaved, fp32 and bf16 on a CPU; and the seconds
    the first compiled step took (the compile time a short run pays)."""
    from cll_scale.run.build import compile_model
    b, s, t = args.shape
    rows = []
    for dtype in args.dtypes:
        name = "bf16" if dtype == torch.bfloat16 else "fp32"
        eager = make_model(args.preset, "baseline", args.vocab, device, dtype)
        compiled = make_model(args.preset, "baseline", args.vocab, device, dtype)
        loss_fn = compile_model(compiled, "inductor")
        opts = {"eager": adamw(eager), "compiled": adamw(compiled)}
        batch = synthetic_batch(b, s, t, args.vocab, device)
        src, tgt, lang = batch

        def compiled_step(_):
            features = compiled(src, compiled.shift_right(tgt), lang, features_only=True)
            (loss_fn(features, compiled.embed.weight, tgt, 0, 0.1)[0] / tgt.numel()).backward()
            opts["compiled"].step()
            opts["compiled"].zero_grad(set_to_none=True)
        with matmul_mode(name, device):
            start = time.perf_counter()
            compiled_step(0)
            sync(device)
            first = time.perf_counter() - start
            med = interleave({"eager": lambda i: our_step(eager, opts["eager"], batch), "compiled": compiled_step},
                             args.steps, device)
        rows.append({"preset": args.preset, "dtype": name, "compiled_over_eager_speed": med["eager"] / med["compiled"],
                     "eager_step_ms": med["eager"] * 1e3, "compiled_step_ms": med["compiled"] * 1e3,
                     "first_compiled_step_s": first})
    return rows


def peak_rss_mib() -> float:
    """This process's peak resident memory, MiB: VmHWM, which starts anew at exec (getrusage's
    ru_maxrss carries the parent's peak into a child it forks and execs)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise OSError("no VmHWM in /proc/self/status")


def peak_rss_growth(preset: str, vocab: int, shape, dtype: str, loss: str) -> float:
    """MiB by which this process's peak RSS grows in one plain step on a batch of ``shape``, after
    the model and its optimizer's state exist (made by one step on a batch of two rows): the step's
    transient memory at its peak. Run in a fresh process per contender (a process's peak never
    comes down)."""
    model = make_model(preset, "baseline", vocab, torch.device("cpu"), torch.bfloat16 if dtype == "bf16" else torch.float32)
    opt = adamw(model)
    with matmul_mode(dtype, torch.device("cpu")):
        our_step(model, opt, synthetic_batch(2, *shape[1:], vocab, torch.device("cpu")), loss)
        batch = synthetic_batch(*shape, vocab, torch.device("cpu"))
        before = peak_rss_mib()
        our_step(model, opt, batch, loss)
    return peak_rss_mib() - before


def part_loss(args, device):
    """The loss with the tied projection inside it (``projected``, the trainer's) against the loss
    of the whole logits (``logits``), `--preset` Baseline, fp32 and bf16 on a CPU: step time
    interleaved, the minor page faults a step (each a 4 KiB page first touched: fresh memory), and
    the peak RSS growth of a step, each contender in a fresh process."""
    if device.type != "cpu":
        return []
    import resource
    b, s, t = args.shape
    rows = []
    for dtype in args.dtypes:
        name = "bf16" if dtype == torch.bfloat16 else "fp32"
        model = make_model(args.preset, "baseline", args.vocab, device, dtype)
        opt, batch = adamw(model), synthetic_batch(b, s, t, model.cfg.vocab_size, device)
        faults = {"logits": [], "projected": []}

        def timed(loss):
            def run(i):
                before = minor_faults()
                our_step(model, opt, batch, loss)
                faults[loss].append(minor_faults() - before)
            return run
        with matmul_mode(name, device):
            med = interleave({k: timed(k) for k in faults}, args.steps, device)
        row = {"preset": args.preset, "dtype": name, "logits_shape": [b * t, model.cfg.vocab_size],
               "projected_over_logits_speed": med["logits"] / med["projected"]}
        for k in faults:
            code = (f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import bench_model as bm, torch; "
                    f"torch.set_num_threads({args.threads}); "
                    f"print(bm.peak_rss_growth({args.preset!r}, {args.vocab}, {[b, s, t]}, {name!r}, {k!r}))")
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            row.update({f"{k}_step_ms": med[k] * 1e3,
                        f"{k}_faulted_mib_per_step": statistics.median(faults[k][2:]) * resource.getpagesize() / 2 ** 20,
                        f"{k}_peak_rss_growth_mib": float(out.stdout.split()[-1])})
        rows.append(row)
    return rows


def part_ranks(args, device):
    shards = Path(args.shards)
    if not (shards / "manifest.json").exists():
        return [{"skipped": f"no shards at {shards} (make quickstart builds them)"}]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        common = ["--data", str(shards), "--preset", "small", "--max-steps", str(args.rank_steps),
                  "--set", "log.every=5", "--set", "valid.every=100000", "--set", "checkpoint.export=false",
                  "--set", "data.batch_tokens=2048", "--set", "checkpoint.every=100000"]
        launches = {"1 rank": [sys.executable, "-m", "cll_scale.train"],
                    "2 ranks": [str(Path(sys.executable).with_name("deepspeed")), "--num_gpus", "2",
                                "--master_port", "29591", "--module", "cll_scale.train"]}
        for name, cmd in launches.items():
            run = Path(tmp) / name.replace(" ", "")
            subprocess.run([*cmd, *common, "--run-dir", str(run)], cwd=ROOT, env=env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            rows = read_rows(run / "metrics.jsonl")
            rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][1:]   # skip warm-up window
            res[name] = statistics.median(rates)
    return [{"1rank_tok_s": res["1 rank"], "2ranks_tok_s": res["2 ranks"],
             "scaling": res["2 ranks"] / res["1 rank"]}]


def profiled_step(model, opt, batch):
    """:func:`our_step` with its three phases labelled for the profiler."""
    from torch.profiler import record_function
    src, tgt, lang, *runs = batch
    with record_function("phase: forward + loss"):
        loss = step_loss(model, (src, tgt, lang, *runs))
    with record_function("phase: backward"):
        (loss / tgt.numel()).backward()
    with record_function("phase: optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)


# Leaf ops that only make a view or allocate (no kernel on a GPU), and the host reads of a
# device value (a synchronisation on a GPU): counted apart from the kernels.
NO_KERNEL = frozenset(f"aten::{name}" for name in (
    "view", "_unsafe_view", "as_strided", "detach", "resolve_conj", "resolve_neg", "empty", "empty_strided",
    "empty_like", "resize_", "t", "transpose", "permute", "expand", "squeeze", "unsqueeze", "select", "slice",
    "alias", "split", "split_with_sizes", "chunk", "narrow", "_reshape_alias", "lift_fresh", "unbind",
    "set_", "view_as", "_local_scalar_dense"))


def leaf_ops(events) -> list:
    """The aten ops that call no other aten op."""
    return [e for e in events if e.name.startswith("aten::")
            and not any(c.name.startswith("aten::") for c in e.cpu_children)]


def op_counts(events, steps: int) -> dict[str, float]:
    """Per step: kernels (leaf ops that compute or copy: each a kernel launch on a GPU), the leaf
    ops that only view or allocate, and host reads of a tensor value (``_local_scalar_dense``)."""
    leaves = leaf_ops(events)
    kernels = [e for e in leaves if e.name not in NO_KERNEL]
    syncs = [e for e in leaves if e.name == "aten::_local_scalar_dense"]
    return {"kernels": len(kernels) / steps, "views_and_allocations": (len(leaves) - len(kernels) - len(syncs)) / steps,
            "host_reads": len(syncs) / steps}


@contextlib.contextmanager
def gpu_choices():
    """The model's kernel choices of a GPU step, taken on this CPU, so the ops a GPU step would
    dispatch can be counted here: PyTorch's own attention kernel, ``F.dropout``, and the loss's
    GPU block size (the CPU-only choices documented in ``cll_scale.model.model``)."""
    saved = {name: getattr(mm, name) for name in ("attention_kernel", "dropout")}
    block = mm._BlockedCrossEntropy.BLOCK_CPU
    mm.attention_kernel = lambda q: contextlib.nullcontext()
    mm.dropout = lambda x, p, training: F.dropout(x, p, training) if training and p > 0 else x
    mm._BlockedCrossEntropy.BLOCK_CPU = mm._BlockedCrossEntropy.BLOCK_GPU
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(mm, name, fn)
        mm._BlockedCrossEntropy.BLOCK_CPU = block


def count_ops(model, opt, batch) -> dict[str, float]:
    """:func:`op_counts` of one plain step (after one unprofiled step)."""
    from torch.profiler import ProfilerActivity, profile
    profiled_step(model, opt, batch)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        profiled_step(model, opt, batch)
    return op_counts(prof.events(), 1)


def part_profile(args, device):
    """Where a plain step's time goes (issue 54), from torch.profiler over ``--profile-steps`` steps:
    the share of each phase, the ten ops with the most self time, and the ops per step
    (:func:`op_counts`; on a CPU also with a GPU's kernel choices, :func:`gpu_choices`), for each
    of ``--profile-variants``; each after the first also gets what it adds to the first, by phase
    and by op, in ms a step (FCLL against the Baseline: where its extra time goes)."""
    rows = []
    for dtype in args.dtypes:
        name = "bf16" if dtype == torch.bfloat16 else "fp32"
        first = None
        for variant in args.profile_variants.split(","):
            row, self_ms = profile_one(args, device, dtype, variant)
            row.update(preset=args.preset, dtype=name)
            if first is None:
                first, first_self_ms = row, self_ms
            else:       # what this variant adds to the first one, by phase and by op (ms a step)
                row["extra_ms_by_phase"] = {k: round(row["phase_ms"][k] - first["phase_ms"].get(k, 0.0), 2)
                                            for k in row["phase_ms"]}
                extra = {op: ms - first_self_ms.get(op, 0.0) for op, ms in self_ms.items()}
                row["extra_ms_top_ops"] = [(op, round(ms, 2)) for op, ms in
                                           sorted(extra.items(), key=lambda kv: kv[1], reverse=True)[:8]]
            rows.append(row)
    return rows


def profile_one(args, device, dtype, variant: str) -> tuple[dict, dict[str, float]]:
    """One contender of :func:`part_profile`: ``baseline``, ``fcll`` (one target language a
    batch), ``fcll-mixed`` (mixed batches over the 16 languages) or ``fcll-mixed-per-language``
    (the same, the LSLs one matmul pair per language), LSL 256 as in ``fcll``.
    -> its row, and each op's self time in ms a step."""
    from torch.profiler import ProfilerActivity, profile
    b, s, t = args.shape
    model = make_model(args.preset, variant.split("-")[0], args.vocab, device, dtype, lsl_dim=256)
    opt = adamw(model)
    batch = synthetic_batch(b, s, t, model.cfg.vocab_size, device)
    if "-mixed" in variant:
        batch = mixed_batch(*batch[:2], seed=0)
    lsl_form = per_language_lsl() if variant.endswith("-per-language") else contextlib.nullcontext()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with matmul_mode("bf16" if dtype == torch.bfloat16 else "fp32", device), lsl_form:
        for _ in range(2):
            profiled_step(model, opt, batch)
        sync(device)
        with profile(activities=activities) as prof:
            for _ in range(args.profile_steps):
                profiled_step(model, opt, batch)
            sync(device)
        if device.type == "cpu":
            with gpu_choices():
                gpu_ops = count_ops(model, opt, batch)
        else:
            gpu_ops = None
    events = prof.events()
    phases = collections.Counter()
    for e in events:
        if e.name.startswith("phase: "):
            phases[e.name[len("phase: "):]] += e.cpu_time_total
    total = sum(phases.values())
    averages = [e for e in prof.key_averages() if not e.key.startswith("phase: ")]
    self_total = sum(e.self_cpu_time_total for e in averages)
    top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
    n = args.profile_steps
    return {"variant": variant, "parameters": sum(p.numel() for p in model.parameters()),
            "step_ms": total / n / 1e3, "phases": {k: round(v / total, 3) for k, v in phases.items()},
            "phase_ms": {k: v / n / 1e3 for k, v in phases.items()},
            "ops_per_step": op_counts(events, n), "ops_per_step_gpu_choices": gpu_ops,
            "top_self_time": [(e.key, round(e.self_cpu_time_total / self_total, 3), round(e.count / n, 1))
                              for e in top]}, {e.key: e.self_cpu_time_total / n / 1e3 for e in averages}


PARTS = {"fcll": part_fcll, "storage": part_storage, "marian": part_marian, "mfu": part_mfu, "ranks": part_ranks,
         "profile": part_profile, "loss": part_loss, "compile": part_compile}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", choices=sorted(PARTS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--preset", default="small")
    p.add_argument("--shape", type=int, nargs=3, default=None, metavar=("B", "S", "T"))
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rank-steps", type=int, default=40)
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--profile-variants", default="baseline",
                   help="profile's contenders, the first the reference: baseline, fcll, fcll-mixed, "
                        "fcll-mixed-per-language")
    p.add_argument("--shards", default=str(ROOT / "data" / "shards" / "multi30k-centered"))
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="GPU dense bf16 peak for MFU (default: the datasheet figure of the device, by name)")
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args(argv)
    return run_guarded("bench_model", lambda: bench(args))


def bench(args) -> int:
    device = torch.device(pick_device(args.device))      # a missing CUDA is one line, as in every command
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    args.shape = args.shape or ([128, 32, 32] if device.type == "cpu" else [256, 64, 64])
    args.dtypes = [torch.float32, torch.bfloat16] if device.type == "cpu" else [torch.bfloat16]
    results = {}
    for name in args.only or list(PARTS):
        if name == "ranks" and device.type == "cuda":
            continue
        results[name] = PARTS[name](args, device)
        for row in results[name]:
            print(name, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}),
                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
