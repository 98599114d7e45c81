"""Decoding speed, as ratios measured side by side in one run.

    python bench/bench_decode.py [--preset small] [--sizes 1 16 64] [--reps 3]
    python bench/bench_decode.py --device cuda --preset base --sizes 16 64 256   # bf16 on a GPU

* beam-4 sentences/s of our beam search (KV cache) ÷ Hugging Face ``generate`` (MarianMTModel built
  from a config with the same shape, random weights, no download), at 1, 16 and 64 sentences per
  batch (target ≥ 1.3 at every size);
* cached ÷ uncached decoding at 32 output tokens and 64 sentences per batch (target ≥ 5).

Both sides produce exactly ``--out-len`` tokens (eos is forbidden before that), so they do the same
number of steps. On CUDA both run in bf16 (``--dtype``), as ``cll-eval`` decodes there; our beam
search then looks at the device every 8 steps instead of at every step.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_model import make_model, marian_model  # noqa: E402
from cll_scale.core.cli import pick_device  # noqa: E402
from cll_scale.core.errors import run_guarded  # noqa: E402
from cll_scale.model.decoding import DecodeConfig, beam_search  # noqa: E402
from cll_scale.evaluation.translator import ModelStepper  # noqa: E402


def ours(model, src, langs, beam, out_len, cache=True):
    cfg = DecodeConfig(beam=beam, min_len=out_len, max_len_a=0.0, max_len_b=out_len + 1)
    lens = torch.full((len(src),), out_len + 1)
    with torch.no_grad():
        return beam_search(ModelStepper(model, src, langs, use_cache=cache), len(src), lens,
                           model.cfg.bos_id, model.cfg.eos_id, cfg, device=src.device)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def hf(model, src, beam, out_len):
    with torch.no_grad():
        return model.generate(input_ids=src, attention_mask=src != 0, num_beams=beam, max_new_tokens=out_len,
                              min_new_tokens=out_len, do_sample=False, early_stopping=True)


def timed(fns, reps, device):
    """Median seconds of each of ``fns``, timed in turn within every repetition (after one warm-up
    call each), so that a machine slowing down or speeding up mid-run affects all alike."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, seconds in zip(fns, times):
            sync(device)
            t = time.perf_counter()
            fn()
            sync(device)
            seconds.append(time.perf_counter() - t)
    return [statistics.median(x) for x in times]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="small")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--src-len", type=int, default=20)
    p.add_argument("--out-len", type=int, default=32)
    p.add_argument("--beam", type=int, default=DecodeConfig.beam)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=("auto", "fp32", "bf16"), default="auto", help="auto: bf16 on CUDA, else fp32")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args(argv)
    return run_guarded("bench_decode", lambda: bench(args))


def bench(args) -> int:
    dev = torch.device(pick_device(args.device))      # a missing CUDA is one line, as in every command
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" or (args.dtype == "auto" and dev.type == "cuda") else torch.float32
    model = make_model(args.preset, "baseline", args.vocab, dev, dtype, pre_norm=False).eval()
    marian = marian_model(model.cfg, dev, dtype).eval()
    g = torch.Generator().manual_seed(0)
    results = {"preset": args.preset, "device": dev.type, "dtype": str(dtype).split(".")[-1], "beam": args.beam,
               "src_len": args.src_len, "out_len": args.out_len, "sizes": []}
    for n in args.sizes:
        src = torch.randint(4, args.vocab, (n, args.src_len), generator=g).to(dev)
        langs = torch.ones(n, dtype=torch.long, device=dev)
        t_ours, t_hf = timed([lambda: ours(model, src, langs, args.beam, args.out_len),
                              lambda: hf(marian, src, args.beam, args.out_len)], args.reps, dev)
        results["sizes"].append({"sentences": n, "ours_sent_s": n / t_ours, "hf_sent_s": n / t_hf,
                                 "ours_over_hf": t_hf / t_ours})
        print(f"beam {args.beam}, {n:>3} sentences/batch: ours {n / t_ours:8.1f} sent/s, HF generate "
              f"{n / t_hf:8.1f} sent/s, ratio {t_hf / t_ours:.2f}", flush=True)
    n = max(args.sizes)
    src = torch.randint(4, args.vocab, (n, args.src_len), generator=g).to(dev)
    langs = torch.ones(n, dtype=torch.long, device=dev)
    t_cached, t_uncached = timed([lambda: ours(model, src, langs, args.beam, args.out_len, cache=True),
                                  lambda: ours(model, src, langs, args.beam, args.out_len, cache=False)],
                                 max(1, args.reps - 2), dev)
    results["cached_over_uncached"] = t_uncached / t_cached
    print(f"cached ÷ uncached speed, {args.out_len} output tokens, {n} sentences/batch: {t_uncached / t_cached:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
