"""Throughput and memory of the training stream (ShardStream) on Multi30k and on a synthetic
corpus 10x larger, measured side by side in one run.

    python bench/bench_stream.py --corpus ../shared/data/multi30k [--out bench/out]

Prints rows/s, tokens/s, padding ratio and resident memory: after the imports (python, torch,
pyarrow), its peak while reading at least a whole epoch, and the difference (the reader's own), and the ratio of the stream's target tokens/s to what a
`small` training step consumes, measured in the same run on the same shards (target >= 20x).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cll_scale.core.cli import add_alias  # noqa: E402
from cll_scale.core.errors import run_guarded  # noqa: E402
from cll_scale.data.corpora import read_multiway  # noqa: E402

# A plain `small` FCLL training step (forward, loss, backward, AdamW) on the stream's own batches,
# in the precision `ds_config auto` picks on this CPU: what the reader has to keep up with.
TRAIN_STEP = r"""
import json, sys, time, torch
from cll_scale.core import hardware
from cll_scale.model.config import PRESETS, ModelConfig
from cll_scale.data.manifest import Manifest
from cll_scale.model.model import CLLTransformer, projected_loss
from cll_scale.data.stream import ShardStream, StreamConfig
shards, max_tokens = sys.argv[1], int(sys.argv[2])
m = Manifest.load(shards)
dtype = torch.bfloat16 if hardware.cpu_bf16_speedup() > 1.1 else torch.float32
cfg = ModelConfig(**PRESETS["small"], vocab_size=m.tokenizer.vocab_size, languages=m.languages,
                  central_language=m.central_language, variant="fcll")
model = CLLTransformer(cfg).to(dtype).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
stream = ShardStream(shards, StreamConfig(batch_tokens=max_tokens, seed=1, verify="none"))
batches = [next(stream) for _ in range(8)]
tokens, t0 = 0, None
for i, b in enumerate(batches):
    if i == 2:
        t0 = time.perf_counter()
    features = model(b.src_tokens, model.shift_right(b.tgt_tokens), b.tgt_lang, lang_runs=b.lang_runs,
                     features_only=True)
    loss, _ = projected_loss(features, model.embed.weight, b.tgt_tokens, cfg.pad_id, 0.1)
    (loss / b.ntokens).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    tokens += b.ntokens if i >= 2 else 0
print(json.dumps({"train_tokens_per_s": tokens / (time.perf_counter() - t0), "dtype": str(dtype)}))
"""

MEASURE = r"""
import itertools, json, sys, time, psutil
from cll_scale.data.stream import ShardStream, StreamConfig
proc = psutil.Process()
shards, seconds, max_tokens = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
rss_imports = proc.memory_info().rss   # python + torch + pyarrow, before any shard is opened
stream = ShardStream(shards, StreamConfig(batch_tokens=max_tokens, seed=1, verify="none"))
next(stream)
rss0 = peak = proc.memory_info().rss
rows = tgt = src = cells = pads = batches = 0
pad = stream.pad
total_rows = int(stream.rank_rows.sum())
t0 = time.perf_counter()
while time.perf_counter() - t0 < seconds or stream.rows_seen < total_rows:
    b = next(stream)
    rows += len(b); batches += 1
    tgt += b.ntokens
    src += int((b.src_tokens != pad).sum())
    cells += b.src_tokens.numel() + b.tgt_tokens.numel()
    pads += int((b.src_tokens == pad).sum()) + int((b.tgt_tokens == pad).sum())
    if batches % 50 == 0:
        peak = max(peak, proc.memory_info().rss)
dt = time.perf_counter() - t0
peak = max(peak, proc.memory_info().rss)
print(json.dumps({"rows": rows, "seconds": dt, "rows_per_s": rows / dt, "tgt_tokens_per_s": tgt / dt,
                  "tokens_per_s": (src + tgt) / dt, "padding": pads / cells, "epochs": stream.epoch,
                  "rss_imports_mb": rss_imports / 2**20, "rss_start_mb": rss0 / 2**20, "rss_peak_mb": peak / 2**20, "corpus_rows": total_rows}))
"""


def build(args, name: str, source: Path, spm_model: str | None = None) -> Path:
    out = Path(args.out) / name
    if not (out / "manifest.json").exists():
        cmd = [sys.executable, "-m", "data_tools", "build", "--corpus", str(source), "--out", str(out),
               "--condition", "centered", "--overwrite"]
        if spm_model:
            cmd += ["--spm-model", spm_model]
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return out


def synthetic_corpus(multi30k: Path, out: Path, factor: int) -> Path:
    """Multi30k's train split repeated ``factor`` times with the words of each copy shuffled
    (same length distribution and vocabulary, new sentences); the other splits as they are."""
    if (out / "train.en").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for f in multi30k.iterdir():
        if not f.name.startswith("train."):
            (out / f.name).write_bytes(f.read_bytes())
    for lang in ("en", "de", "fr", "cs"):
        lines = (multi30k / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        rng = random.Random(lang)
        with open(out / f"train.{lang}", "w", encoding="utf-8") as w:
            for k in range(factor):
                for line in lines:
                    words = line.split()
                    if k:
                        rng.shuffle(words)
                    w.write(" ".join(words) + "\n")
    return out


def measure(shards: Path, seconds: float, max_tokens: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", MEASURE, str(shards), str(seconds), str(max_tokens)],
                         cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=str(ROOT.parent / "shared" / "data" / "multi30k"), help="the Multi30k directory")
    add_alias(p, "--multi30k", "--corpus", dest="corpus")
    p.add_argument("--out", default=str(ROOT / "bench" / "out"))
    p.add_argument("--factor", type=int, default=10)
    p.add_argument("--seconds", type=float, default=5.0, help="minimum measuring time (and >= 1 epoch)")
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    return run_guarded("bench_stream", lambda: bench(args))


def bench(args) -> int:
    # The corpus is checked before anything is built: a wrong --corpus is one line, not the
    # traceback of the shard build's subprocess.
    read_multiway(args.corpus, langs=["en", "de", "fr", "cs"])
    base = build(args, "multi30k", Path(args.corpus))
    synth = synthetic_corpus(Path(args.corpus), Path(args.out) / f"synthetic-x{args.factor}-text", args.factor)
    big = build(args, f"synthetic-x{args.factor}", synth, spm_model=str(base / "spm.model"))
    results = {"multi30k": measure(base, args.seconds, args.batch_tokens),
               f"synthetic x{args.factor}": measure(big, args.seconds, args.batch_tokens)}
    step = json.loads(subprocess.run([sys.executable, "-c", TRAIN_STEP, str(base), str(args.batch_tokens)], cwd=ROOT,
                                     capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    print(f"small FCLL training step on these batches ({step['dtype']}): {step['train_tokens_per_s']:,.0f} target tok/s")
    print(f"{'corpus':<16} {'rows':>10} {'rows/s':>10} {'tgt tok/s':>11} {'tok/s':>11} {'padding':>8} "
          f"{'RSS imports':>11} {'RSS peak':>9} {'reader':>7} {'vs train step':>14}")
    for name, r in results.items():
        print(f"{name:<16} {r['corpus_rows']:>10,} {r['rows_per_s']:>10,.0f} {r['tgt_tokens_per_s']:>11,.0f} "
              f"{r['tokens_per_s']:>11,.0f} {r['padding']:>8.1%} {r['rss_imports_mb']:>9.0f}MB "
              f"{r['rss_peak_mb']:>7.0f}MB {r['rss_peak_mb'] - r['rss_imports_mb']:>5.0f}MB "
              f"{r['tgt_tokens_per_s'] / step['train_tokens_per_s']:>13.0f}x")
    a, b = results.values()
    print(f"peak RSS growth from {a['corpus_rows']:,} to {b['corpus_rows']:,} rows: "
          f"{b['rss_peak_mb'] - a['rss_peak_mb']:+.0f} MB (each run read at least one full epoch)")
    if args.json:
        Path(args.json).write_text(json.dumps({**results, "train_step": step}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
