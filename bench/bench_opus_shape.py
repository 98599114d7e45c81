"""OPUS-100 at its real shape: synth -> build -> verify -> stream at several scales, every figure
beside its extrapolation to scale 1.0 (54.7M training pairs), then a `tiny` FCLL run over all 100
languages through `deepspeed --num_gpus 2` on the CPU (checkpoint, kill, resume, export, cll-eval).

    python bench/bench_opus_shape.py                      # scales 0.01 0.05, training at 0.01
    python bench/bench_opus_shape.py --scales 0.01 0.05 0.2 --no-train
    make bench-opus

At the largest scale it also learns SentencePiece at temperature 1 and 5 from the same corpus and
reports, per temperature, each language's share of the sample and how its held-out text tokenises.

Writes ``<out>/bench_opus_shape.json`` and ``.md`` (default ``runs/opus``, which git ignores) and
prints the tables. Corpora and shards are deleted at the end unless ``--keep``.

How each figure is taken:
  * every stage runs in a child process that reports its own peak resident memory
    (``getrusage(RUSAGE_SELF).ru_maxrss``) and the same figure right after its imports;
  * build stage times: the build's own stage clock (``build_shards(corpus, cfg, clock)``,
    cll_scale/core/clock.py; the line ``cll-shards build`` prints), whose stages add up to the build;
  * direction shares: ``ShardStream.probs`` (``q_d ∝ n_d^(1/T)`` over the training rows of each
    direction, stream.py) against the directions of 2,000 consecutive batches.
Extrapolation to 1.0 uses the formula printed beside each figure: linear in the rows a stage
reads (dev/test/zero-shot sets keep their real size at every scale, so they are a constant part),
constant for memory, and the stream's own pool model (one pool of ``k`` blocks per direction, ``k``
set by ``pool_blocks`` and the ``pool_rows`` budget as ``stream.pool_size`` sets it) beside it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cll_scale.training.collectives import free_port  # noqa: E402
from cll_scale.training.metrics import read_rows  # noqa: E402
from cll_scale.evaluation.report import EvalReport  # noqa: E402
from cll_scale.model.export import ExportInfo  # noqa: E402

DEEPSPEED = str(Path(sys.executable).with_name("deepspeed"))
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))

_RSS = """
import json, resource, sys, time
def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
"""

SYNTH = _RSS + r"""
from data_tools.synth import synthesize
imports = peak_mb()
r = synthesize(sys.argv[1], float(sys.argv[2]))
print(json.dumps({"seconds": r["seconds"], "totals": r["totals"], "rss_imports_mb": imports, "rss_peak_mb": peak_mb()}))
"""

# build_shards with its own stage clock (cll_scale.core.clock): the stages add up to the build.
BUILD = _RSS + r"""
from cll_scale.data.shards import BuildConfig, build_shards
from cll_scale.core.clock import StageClock
from cll_scale.data.corpora import read_opus100
corpus_dir, out_dir, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
imports = peak_mb()
clock = StageClock()
with clock.stage("scan"):
    corpus = read_opus100(corpus_dir)
cfg = BuildConfig(out_dir=out_dir, vocab_size=vocab)
m = build_shards(corpus, cfg, clock)
t = clock.seconds
lines = {"all": sum(s.n_lines for s in corpus.splits), "train": sum(s.n_lines for s in corpus.train_splits())}
by_role = {}
for name, split in m.splits.items():
    r = by_role.setdefault("train" if name == "train" else "eval", {"rows": 0, "bytes": 0, "files": 0})
    r["rows"] += sum(x.rows for x in split.shards)
    r["bytes"] += sum(x.bytes for x in split.shards)
    r["files"] += len(split.shards)
print(json.dumps({"times": t, "pairs": lines, "spm_sentences": min(cfg.spm_sentences, 2 * lines["train"]),
                  "shards": by_role, "manifest_bytes": (__import__("pathlib").Path(out_dir) / "manifest.json").stat().st_size,
                  "block_rows": cfg.block_rows, "shard_rows": cfg.shard_rows, "spm_cap": cfg.spm_sentences,
                  "rss_imports_mb": imports, "rss_peak_mb": peak_mb()}))
"""

STREAM = _RSS + r"""
from cll_scale.data.stream import ShardStream, StreamConfig
shards, seconds, max_tokens = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
imports = peak_mb()
s = ShardStream(shards, StreamConfig(batch_tokens=max_tokens, verify="none"))
next(s)
rows = tgt = batches = 0
t0 = time.perf_counter()
while time.perf_counter() - t0 < seconds:
    b = next(s)
    rows += len(b); tgt += b.ntokens; batches += 1
dt = time.perf_counter() - t0
pools = list(s._pools.values())
print(json.dumps({"seconds": dt, "batches": batches, "rows_per_s": rows / dt, "tgt_tokens_per_s": tgt / dt,
                  "epochs": s.epoch, "directions": len(s.directions), "pools_loaded": len(pools),
                  "pool_rows_held": sum(len(p.src_len) for _, p in pools),
                  "state_bytes": len(json.dumps(s.state_dict())), "pool_blocks": s.pool_blocks,
                  "pool_blocks_max": s.cfg.pool_blocks, "pool_rows_budget": s.cfg.pool_rows,
                  "rss_imports_mb": imports, "rss_peak_mb": peak_mb()}))
"""

# Three rounds over the modes, medians: one start is a few milliseconds, which the other jobs of a
# shared machine can easily double.
STARTUP = _RSS + r"""
from cll_scale.data.stream import ShardStream, StreamConfig
times = {mode: {"start_s": [], "first_batch_s": []} for mode in ("none", "size", "full")}
for _ in range(3):
    for mode in times:
        t0 = time.perf_counter()
        s = ShardStream(sys.argv[1], StreamConfig(verify=mode))
        t1 = time.perf_counter()
        next(s)
        times[mode]["start_s"].append(t1 - t0)
        times[mode]["first_batch_s"].append(time.perf_counter() - t1)
        del s
print(json.dumps({mode: {k: sorted(v)[1] for k, v in t.items()} for mode, t in times.items()}))
"""

SHARES = _RSS + r"""
from collections import Counter
from cll_scale.data.stream import ShardStream, StreamConfig
out = {}
n, longer = int(sys.argv[2]), int(sys.argv[3])
for temperature in (1.0, 5.0):
    # one direction per batch: the batch counts are the sampler's draws (mixed pools draw the same q_d per row)
    s = ShardStream(sys.argv[1], StreamConfig(temperature=temperature, verify="none", mixing="direction"))
    counts = Counter(next(s).direction for _ in range(n))
    more = counts + Counter(next(s).direction for _ in range(longer - n))
    out[str(temperature)] = {"planned": dict(zip(s.directions, s.probs.tolist())), "counts": dict(counts),
                             "counts_longer": dict(more), "rows": dict(zip(s.directions, s.rows.tolist()))}
print(json.dumps(out))
"""


def log(msg: str) -> None:
    print(f"[bench-opus] {msg}", file=sys.stderr, flush=True)


def child(code: str, *args, timeout: float = 3600) -> dict:
    res = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=timeout)
    if res.returncode:
        raise RuntimeError(f"child failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# One scale

# SentencePiece learnt at temperature 1 and 5 from the same corpus; for every language, the share of
# the sample it got and how its held-out text tokenises (pieces per character, byte-fallback pieces).
SPM_LANGS = _RSS + r"""
import tempfile
import sentencepiece as spm
from cll_scale.data.corpora import read_opus100
from cll_scale.data.shards import BuildConfig
from data_tools.synth import LANG_SCRIPT
from cll_scale.data.tokenizer import language_sample_rates, train_sentencepiece, training_lines
corpus_dir, vocab, n_eval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
corpus = read_opus100(corpus_dir)
counts = training_lines(corpus)
held_out = {}
for split in corpus.splits:
    if split.name != "train":
        for x, lines in next(split.read_chunks(n_eval))[1].items():
            held_out.setdefault(x, lines)
total = min(BuildConfig.spm_sentences, sum(counts.values()))    # as train_sentencepiece samples
out = {"pairs": counts, "script": {x: LANG_SCRIPT[x] for x in counts}, "sampled": {}, "tokens": {}}
with tempfile.TemporaryDirectory() as tmp:
    for temperature in (1.0, 5.0):
        rates = language_sample_rates(counts, total, temperature)
        out["sampled"][temperature] = {x: rates[x] * counts[x] / total for x in counts}
        sp = spm.SentencePieceProcessor(model_file=str(train_sentencepiece(corpus, f"{tmp}/t{temperature:g}",
                                                                           vocab, temperature=temperature)))
        by_lang = {}
        for x, lines in held_out.items():
            pieces = [p for ids in sp.encode(lines) for p in ids]
            chars = sum(len(t) for t in lines)
            by_lang[x] = {"pieces_per_char": len(pieces) / max(1, chars),
                          "byte_share": sum(map(sp.is_byte, pieces)) / max(1, len(pieces))}
        out["tokens"][temperature] = by_lang
print(json.dumps(out))
"""


def spm_report(r: dict) -> str:
    """Per temperature: sample shares and tokenisation of the 10 smallest and 10 largest languages."""
    pairs = r["pairs"]
    order = sorted((x for x in pairs if x in r["tokens"]["1.0"]), key=lambda x: pairs[x])
    small, large = order[:10], order[-10:]

    def mean(xs):
        return sum(xs) / len(xs)
    lines = ["| T | sample share, smallest / largest language | pieces per char, 10 smallest / 10 largest "
             "| byte-fallback pieces, 10 smallest / worst language |", "|---|---|---|---|"]
    for t in ("1.0", "5.0"):
        q, tok = r["sampled"][t], r["tokens"][t]
        worst = max(tok, key=lambda x: tok[x]["byte_share"])
        lines.append(f"| {float(t):g} | {q[order[0]]:.2e} ({order[0]}) / {q[order[-1]]:.3f} ({order[-1]}) "
                     f"| {mean([tok[x]['pieces_per_char'] for x in small]):.3f} / "
                     f"{mean([tok[x]['pieces_per_char'] for x in large]):.3f} "
                     f"| {mean([tok[x]['byte_share'] for x in small]):.1%} / {tok[worst]['byte_share']:.1%} "
                     f"({worst}, {r['script'][worst]}, {pairs[worst]:,} pairs) |")
    return "\n".join(lines)


def measure_scale(scale: float, out: Path, args) -> dict:
    corpus, shards = out / f"corpus-{scale:g}", out / f"shards-{scale:g}"
    for d in (corpus, shards):
        shutil.rmtree(d, ignore_errors=True)
    log(f"scale {scale:g}: synth")
    synth = child(SYNTH, corpus, scale)
    log(f"scale {scale:g}: build ({synth['totals']['pairs']:,} pairs)")
    build = child(BUILD, corpus, shards, args.vocab_size)
    spm_langs = None
    if scale == max(args.scales):
        log(f"scale {scale:g}: SentencePiece at temperature 1 and 5, per language")
        spm_langs = child(SPM_LANGS, corpus, args.vocab_size, 500)
    if not args.keep:
        shutil.rmtree(corpus)
    log(f"scale {scale:g}: verify, stream")
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "data_tools", "verify", str(shards)], cwd=ROOT, env=ENV,
                         capture_output=True, text=True)
    verify = {"seconds": time.perf_counter() - t0, "ok": res.returncode == 0}
    stream = child(STREAM, shards, args.seconds, args.batch_tokens)
    startup = child(STARTUP, shards)
    shares = child(SHARES, shards, args.batches, args.batches_longer)
    return {"scale": scale, "shards_dir": str(shards), "synth": synth, "build": build, "verify": verify,
            "stream": stream, "startup": startup, "spm_languages": spm_langs,
            "shares": shares_report(shares, "counts", args.batches),
            "shares_longer": shares_report(shares, "counts_longer", args.batches_longer)}


EXPECTED_MIN = 10       # draws a direction must expect before its relative deviation says anything


def shares_report(raw: dict, key: str, n: int) -> dict:
    """Observed (``key`` counts of n batches) vs planned direction shares per temperature. The
    relative deviation of a direction expected a handful of times in n draws is noise, so the
    z-score and the largest relative deviation among directions expected ``EXPECTED_MIN`` times or
    more are given too."""
    out = {}
    for temperature, r in raw.items():
        rows = r["rows"]
        total = sum(n_d ** (1 / float(temperature)) for n_d in rows.values())
        rel, big, z, tvd, formula = [], [], [], 0.0, 0.0
        for d, p in r["planned"].items():
            c = r[key].get(d, 0)
            rel.append((abs(c / n - p) / p, d, n * p))
            if n * p >= EXPECTED_MIN:
                big.append((abs(c / n - p) / p, d, n * p))
            z.append((abs(c - n * p) / math.sqrt(n * p * (1 - p)), d))
            tvd += abs(c / n - p) / 2
            formula = max(formula, abs(p - rows[d] ** (1 / float(temperature)) / total))
        out[temperature] = {
            "batches": n, "directions": len(rel), "directions_drawn": len(r[key]),
            "max_rel_dev": max(rel)[0], "max_rel_dev_direction": max(rel)[1], "its_expected_count": max(rel)[2],
            "max_rel_dev_expected": max(big)[0] if big else None,
            "max_rel_dev_expected_direction": max(big)[1] if big else None,
            "directions_expected": len(big),
            "max_abs_z": max(z)[0], "max_abs_z_direction": max(z)[1], "total_variation": tvd,
            "planned_vs_formula_max_abs": formula,
            "smallest_planned": min(r["planned"].values()), "largest_planned": max(r["planned"].values())}
    return out


# ---------------------------------------------------------------------------------------------
# Extrapolation to scale 1.0

def full_scale_shape(block_rows: int, shard_rows: int) -> dict:
    from data_tools.synth import plan
    plans = plan(1.0)
    per_file = shard_rows // block_rows * block_rows
    train = [p.rows["train"] for p in plans if "train" in p.rows]
    return {"train_pairs": sum(train), "eval_pairs": sum(n for p in plans for k, n in p.rows.items() if k != "train"),
            "train_files": sum(2 * -(-n // per_file) for n in train), "train_rows_by_direction": train}


def pool_rows(rows_by_pair: list[int], block: int, stream: dict) -> int:
    """Rows a one-rank stream that has visited every direction holds: one pool per direction
    (both directions of a pair), of the ``k`` blocks the stream's rule picks for these counts."""
    from cll_scale.data.stream import pool_size
    blocks = [[block] * (n // block) + ([n % block] if n % block else []) for n in rows_by_pair]
    k = pool_size(blocks + blocks, stream["pool_blocks_max"], stream["pool_rows_budget"])
    return sum(2 * min(n, k * block) for n in rows_by_pair)


def spm_sampling(t: dict) -> float:
    return t["spm_read"] + t["spm_sample"]


def encode_pass(t: dict) -> float:
    return t["read"] + t["encode"] + t["filter"] + t["write"]


def extrapolate(r: dict) -> dict:
    """Each figure at scale 1.0 from the figures of one scale, with the formula used."""
    b, full = r["build"], full_scale_shape(r["build"]["block_rows"], r["build"]["shard_rows"])
    T, E = r["synth"]["totals"]["train"], b["pairs"]["all"] - b["pairs"]["train"]
    T1, E1 = full["train_pairs"], full["eval_pairs"]
    k_train, k_all = T1 / T, (T1 + E1) / (T + E)
    t = b["times"]
    spm1 = min(b["spm_cap"], 2 * T1)
    tr, ev = b["shards"]["train"], b["shards"]["eval"]
    bytes1 = tr["bytes"] * k_train + ev["bytes"]
    st = r["startup"]
    none1 = st["none"]["start_s"] * k_train
    scale_rows = [max(1, int(math.floor(n * r["scale"] + 0.5))) for n in full["train_rows_by_direction"]]
    pr_s = pool_rows(scale_rows, b["block_rows"], r["stream"])
    pr_1 = pool_rows(full["train_rows_by_direction"], b["block_rows"], r["stream"])
    s = r["stream"]
    files_s, files_1 = tr["files"] + ev["files"], full["train_files"] + ev["files"]
    return {
        "synth_s": (r["synth"]["seconds"] * k_all, "x all pairs (train + dev/test/zero-shot)"),
        "scan_s": (t["scan"] * k_all, "x all pairs"),
        "spm_sampling_s": (spm_sampling(t) * k_train, "x training pairs"),
        "spm_training_s": (t["spm_train"] * spm1 / b["spm_sentences"], "x sentences sampled (capped)"),
        "encode_write_s": (encode_pass(t) * k_all, "x all pairs"),
        "build_s": (t["scan"] * k_all + spm_sampling(t) * k_train + t["spm_train"] * spm1 / b["spm_sentences"]
                    + (encode_pass(t) + t["finish"]) * k_all, "sum of the stages"),
        "build_rss_mb": (b["rss_peak_mb"], "constant"),
        "shard_bytes": (bytes1, "train x training pairs + eval"),
        "manifest_bytes": (b["manifest_bytes"] * files_1 / files_s, f"x shard files ({files_s} -> {files_1})"),
        "verify_s": (r["verify"]["seconds"] * bytes1 / (tr["bytes"] + ev["bytes"]), "x shard bytes"),
        "start_none_s": (none1, "x training rows (block lists)"),
        "start_size_s": (none1 + (st["size"]["start_s"] - st["none"]["start_s"]) * full["train_files"] / tr["files"],
                         "none + x train shard files"),
        "start_full_s": (none1 + (st["full"]["start_s"] - st["none"]["start_s"]) * k_train,
                         "none + x train shard bytes"),
        "stream_rows_per_s": (s["rows_per_s"], "constant"),
        "stream_tgt_tokens_per_s": (s["tgt_tokens_per_s"], "constant"),
        "stream_rss_mb": (s["rss_peak_mb"], "constant"),
        "stream_rss_pool_model_mb": (s["rss_imports_mb"] + (s["rss_peak_mb"] - s["rss_imports_mb"]) * pr_1 / pr_s,
                                     f"imports + reader x pool rows ({pr_s:,} -> {pr_1:,})"),
        "state_bytes": (s["state_bytes"], "constant (a few integers per direction)"),
    }


def figures(r: dict) -> dict:
    """The measured figure behind each key of :func:`extrapolate`."""
    b, t, st, s = r["build"], r["build"]["times"], r["startup"], r["stream"]
    return {"synth_s": r["synth"]["seconds"], "scan_s": t["scan"], "spm_sampling_s": spm_sampling(t),
            "spm_training_s": t["spm_train"], "encode_write_s": encode_pass(t),
            "build_s": sum(t.values()), "build_rss_mb": b["rss_peak_mb"],
            "shard_bytes": b["shards"]["train"]["bytes"] + b["shards"]["eval"]["bytes"],
            "manifest_bytes": b["manifest_bytes"], "verify_s": r["verify"]["seconds"],
            "start_none_s": st["none"]["start_s"], "start_size_s": st["size"]["start_s"],
            "start_full_s": st["full"]["start_s"], "stream_rows_per_s": s["rows_per_s"],
            "stream_tgt_tokens_per_s": s["tgt_tokens_per_s"], "stream_rss_mb": s["rss_peak_mb"],
            "stream_rss_pool_model_mb": s["rss_peak_mb"], "state_bytes": s["state_bytes"]}


LABELS = {
    "synth_s": "synth time (s)", "scan_s": "build: scan (line count, UTF-8 check) (s)",
    "spm_sampling_s": "build: SentencePiece sampling (s)", "spm_training_s": "build: SentencePiece training (s)",
    "encode_write_s": "build: read + encode + write (s)", "build_s": "build total (s)",
    "build_rss_mb": "build peak RSS (MB)", "shard_bytes": "shard bytes", "manifest_bytes": "manifest bytes",
    "verify_s": "cll-shards verify (s)", "start_none_s": "stream start, verify none (s)",
    "start_size_s": "stream start, verify size (s)", "start_full_s": "stream start, verify full (s)",
    "stream_rows_per_s": "stream rows/s", "stream_tgt_tokens_per_s": "stream target tokens/s",
    "stream_rss_mb": "stream peak RSS (MB)", "stream_rss_pool_model_mb": "stream peak RSS, pool model (MB)",
    "state_bytes": "stream state (bytes of JSON)",
}


# ---------------------------------------------------------------------------------------------
# Training at the smallest scale

def losses(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_rows(run_dir / "metrics.jsonl") if "loss" in r}


# cll-eval in a child that reports its own peak memory and its LID workers' on the way out.
EVAL = r"""
import atexit, json, resource, runpy, sys
atexit.register(lambda: print(json.dumps({"eval_rss_mb": {
    "self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "lid_worker": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}}), file=sys.stderr))
sys.argv[0] = "cll-eval"
runpy.run_module("cll_scale.evaluate", run_name="__main__")
"""


def train_section(shards: Path, out: Path, steps: int, ckpt: int, eval_sentences: int) -> dict:
    """A `tiny` FCLL run on all languages, two CPU ranks: dry run; an uninterrupted run; a run killed
    (SIGKILL to the launcher's process group) after its step-``ckpt`` checkpoint and resumed; the
    resumed losses against the uninterrupted ones; export; cll-eval on two zero-shot directions,
    then on every test direction (``eval_sentences`` each) to see what the number of directions costs."""
    base = ["--data", str(shards), "--preset", "tiny", "--variant", "fcll", "--ds-config", "cpu_fp32.json",
            "--max-steps", str(steps), "--set", "log.every=1", "--set", "valid.every=100000",
            "--set", f"checkpoint.every={ckpt}", "--set", "valid.max_sentences=200",
            "--set", "data.batch_tokens=1024", "--set", "optim.lr=3e-3", "--set", "optim.warmup_steps=10"]

    def launch(run_dir: Path, *extra) -> list[str]:
        return [DEEPSPEED, "--num_gpus", "2", "--master_port", str(free_port()), "--module", "cll_scale.train",
                *base, "--run-dir", str(run_dir), *extra]

    def run(cmd, name) -> tuple[subprocess.CompletedProcess, float]:
        log(f"train: {name}")
        t0 = time.perf_counter()
        res = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=1800)
        (out / f"{name}.log").write_text(res.stdout + "\n" + res.stderr)
        return res, time.perf_counter() - t0

    out.mkdir(parents=True, exist_ok=True)
    full, split = out / "full", out / "split"
    for d in (full, split, out / "dry-run-dir"):
        shutil.rmtree(d, ignore_errors=True)
    report: dict = {"steps": steps, "checkpoint_step": ckpt}
    res, wall = run(launch(out / "dry-run-dir", "--dry-run"), "dry-run")
    dry = next((json.loads(x)["dry_run"] for x in reversed(res.stdout.splitlines()) if x.startswith('{"dry_run"')), None)
    report["dry_run"] = {"ok": res.returncode == 0 and dry is not None and not (out / "dry-run-dir").exists(),
                         "wall_s": wall, **(dry or {})}
    res, wall = run(launch(full), "uninterrupted")
    report["uninterrupted"] = {"ok": res.returncode == 0 and max(losses(full), default=0) == steps, "wall_s": wall}
    # Killed: SIGKILL the whole launch (launcher and both ranks) once the step-ckpt checkpoint is committed.
    log("train: killed after the checkpoint")
    t0 = time.perf_counter()
    with open(out / "killed.log", "w") as f:
        proc = subprocess.Popen(launch(split), cwd=ROOT, env=ENV, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        latest = split / "checkpoints" / "latest"
        while proc.poll() is None:
            if latest.is_file() and latest.read_text().strip() == f"step{ckpt:08d}":
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
        proc.wait()
    for _ in range(50):                       # the ranks go with the launcher's process group
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    logged = max(losses(split), default=0)
    report["killed"] = {"ok": proc.returncode == -signal.SIGKILL, "returncode": proc.returncode,
                        "last_logged_step": logged, "wall_s": time.perf_counter() - t0}
    res, wall = run(launch(split, "--resume"), "resumed")
    a, b = losses(full), losses(split)
    resumed_from = f"step{ckpt:08d}" in res.stderr and "resumed from" in res.stderr
    diffs = [abs(a[s]["loss"] - b[s]["loss"]) for s in range(ckpt + 1, steps + 1) if s in a and s in b]
    report["resumed"] = {"ok": res.returncode == 0 and resumed_from and sorted(b) == list(range(1, steps + 1)),
                         "resumed_from_checkpoint": resumed_from, "wall_s": wall}
    report["resume_matches"] = {"ok": len(diffs) == steps - ckpt and max(diffs, default=1.0) <= 1e-6,
                                "steps_compared": len(diffs), "max_abs_loss_diff": max(diffs, default=None)}
    export = split / "export"
    step = ExportInfo.load(export).step if ExportInfo.exists(export) else None
    report["export"] = {"ok": (export / "model.safetensors").is_file() and step == steps,
                        "bytes": sum(f.stat().st_size for f in export.glob("*") if f.is_file())}
    def evaluate(name: str, *extra: str) -> tuple[list[dict], float, dict]:
        res, wall = run([sys.executable, "-c", EVAL, "--model", f"fcll={export}", "--data", str(shards),
                         "--split", "test", "--beam", "1", "--device", "cpu", "--out", str(split / name), *extra], name)
        result = split / name / "results.json"
        dirs = EvalReport.load(result).models["fcll"].directions if res.returncode == 0 and result.is_file() else []
        rss = next((json.loads(x)["eval_rss_mb"] for x in reversed(res.stderr.splitlines())
                    if x.startswith('{"eval_rss_mb"')), {})
        return dirs, wall, rss
    dirs, wall, rss = evaluate("cll-eval", "--directions", "de-fr,fr-de", "--max-sentences", "50", "--lid-workers", "0")
    report["eval"] = {"ok": sorted(d.direction for d in dirs) == ["de-fr", "fr-de"], "wall_s": wall, "rss_mb": rss,
                      "directions": {d.direction: {k: getattr(d, k, None) for k in ("n", "bleu", "chrf", "off_target", "off_target_restricted")}
                                     for d in dirs}}
    from cll_scale.data.manifest import Manifest
    manifest = Manifest.load(shards)
    expected = sorted(manifest.splits["test"].directions())
    dirs, wall, rss = evaluate("cll-eval-all", "--max-sentences", str(eval_sentences), "--lid-workers", "1")
    report["eval_all"] = {"ok": sorted(d.direction for d in dirs) == expected, "wall_s": wall, "rss_mb": rss,
                          "directions": len(dirs), "expected": len(expected), "sentences": eval_sentences,
                          "zero_shot": sum(manifest.is_zero_shot(d.direction) for d in dirs)}
    step_s = [a[s]["elapsed_s"] - a[s - 1]["elapsed_s"] for s in range(3, steps + 1) if s in a and s - 1 in a]
    report["step_s_median"] = sorted(step_s)[len(step_s) // 2] if step_s else None
    report["tokens_per_s_median"] = sorted(a[s]["tokens_per_s"] for s in a)[len(a) // 2] if a else None
    return report


# ---------------------------------------------------------------------------------------------
# Tables

def fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and abs(x) < 100:
        return f"{x:.3g}" if abs(x) >= 0.01 else f"{x:.2e}"
    return f"{x:,.0f}"


# Figures that grow with the training rows, for the affine fit through two scales.
AFFINE = ("synth_s", "scan_s", "spm_sampling_s", "encode_write_s", "build_s", "shard_bytes", "verify_s",
          "start_none_s", "start_size_s", "start_full_s")


def affine(results: list[dict], key: str) -> float | None:
    """``key`` at 1.0 on the line through the smallest and the largest scale (x: training pairs),
    which keeps the constant part (dev/test sets, start-up) constant; never below the largest."""
    a, z = results[0], results[-1]
    xa, xz = a["synth"]["totals"]["train"], z["synth"]["totals"]["train"]
    x1 = full_scale_shape(z["build"]["block_rows"], z["build"]["shard_rows"])["train_pairs"]
    fa, fz = figures(a)[key], figures(z)[key]
    return max(fz, fz + (fz - fa) * (x1 - xz) / (xz - xa))


def scale_table(results: list[dict]) -> str:
    scales = [r["scale"] for r in results]
    ext = extrapolate(results[-1])
    head = ["figure", *(f"scale {s:g}" for s in scales), "at 1.0 (from the largest)", "formula"]
    growth = len(results) > 1
    if growth:
        a, z = results[0], results[-1]
        head += ["at 1.0, affine fit", f"{scales[0]:g}->{scales[-1]:g}: measured x", "formula x"]
        ea = extrapolate(a)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, label in LABELS.items():
        row = [label, *(fmt(figures(r)[key]) for r in results), fmt(ext[key][0]), ext[key][1]]
        if growth:
            row.append(fmt(affine(results, key)) if key in AFFINE else "-")
            # measured ratio between the scales, and the ratio the formula predicts for them
            # (the ratio of its multipliers to 1.0); measured above predicted grows faster than the formula
            fa, fz = figures(a)[key], figures(z)[key]
            ka, kz = ea[key][0] / fa if fa else 0, ext[key][0] / fz if fz else 0
            row += [f"{fz / fa:.2f}" if fa else "-", f"{ka / kz:.2f}" if kz else "-"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def stage_table(results: list[dict]) -> str:
    lines = ["| scale | stage | seconds | rows | rows/s |", "|---|---|---:|---:|---:|"]
    for r in results:
        b, t = r["build"], r["build"]["times"]
        rows_written = b["shards"]["train"]["rows"] + b["shards"]["eval"]["rows"]
        stages = [
            ("scan: count lines, check UTF-8 (read_opus100)", t["scan"], b["pairs"]["all"], "pairs"),
            ("SentencePiece sampling: read", t["spm_read"], b["pairs"]["train"], "pairs"),
            ("SentencePiece sampling: sample, write text", t["spm_sample"], b["pairs"]["train"], "pairs"),
            ("SentencePiece training (C++, one call)", t["spm_train"], b["spm_sentences"], "sentences"),
            ("encode pass: read lines", t["read"], b["pairs"]["all"], "pairs"),
            ("encode pass: sp.encode", t["encode"], b["pairs"]["all"], "pairs"),
            ("encode pass: id lists, filter, columns", t["filter"], b["pairs"]["all"], "pairs"),
            ("writing: Arrow batches, zstd, file, sha256", t["write"], rows_written, "direction rows"),
            ("checks, manifest, tokenizer hash, rename", t["finish"], None, ""),
        ]
        for name, sec, n, unit in stages:
            lines.append(f"| {r['scale']:g} | {name} | {sec:.2f} | {fmt(n)} {unit} | "
                         f"{fmt(n / sec) if n and sec > 0 else '-'} |")
    return "\n".join(lines)


def shares_table(results: list[dict]) -> str:
    lines = ["| scale | T | batches | directions drawn | max rel. deviation (direction, expected count) | "
             f"same among directions expected >= {EXPECTED_MIN} (how many) | max abs z | total variation | "
             "stream probs vs n^(1/T) |", "|---|---|---:|---:|---|---|---:|---:|---:|"]
    for r in results:
        for key in ("shares", "shares_longer"):
            for t, s in r[key].items():
                lines.append(
                    f"| {r['scale']:g} | {float(t):g} | {s['batches']:,} | {s['directions_drawn']}/{s['directions']} | "
                    f"{s['max_rel_dev']:.2f} ({s['max_rel_dev_direction']}, {s['its_expected_count']:.2g}) | "
                    f"{fmt(s['max_rel_dev_expected'])} ({s['max_rel_dev_expected_direction']}, "
                    f"{s['directions_expected']}) | {s['max_abs_z']:.2f} ({s['max_abs_z_direction']}) | "
                    f"{s['total_variation']:.3f} | {s['planned_vs_formula_max_abs']:.1e} |")
    return "\n".join(lines)


def train_table(t: dict) -> str:
    d = t["dry_run"]
    lines = [f"`tiny` FCLL, {d.get('languages', '?')} languages, {d.get('directions', '?')} training directions, "
             f"2 CPU ranks (gloo, 1 thread each), fp32 ZeRO-2; {d.get('parameters', 0):,} parameters in "
             f"{d.get('tensors', '?')} tensors; median step {fmt(t['step_s_median'])} s, "
             f"{fmt(t['tokens_per_s_median'])} target tok/s (dry run estimated {fmt(d.get('seconds_per_step'))} s/step, "
             f"{fmt(d.get('steps_per_epoch'))} steps per epoch)", "",
             "| step | result | detail |", "|---|---|---|"]
    rows = [
        ("cll-train --dry-run", d, f"{fmt(d.get('wall_s'))} s wall, run directory left absent"),
        ("uninterrupted run", t["uninterrupted"], f"{t['steps']} steps, {fmt(t['uninterrupted']['wall_s'])} s wall"),
        ("killed after the checkpoint", t["killed"], f"SIGKILL at step {t['killed']['last_logged_step']} (checkpoint "
         f"{t['checkpoint_step']}), exit {t['killed']['returncode']}"),
        ("--resume", t["resumed"], f"from step {t['checkpoint_step']}: {t['resumed']['resumed_from_checkpoint']}, "
         f"{fmt(t['resumed']['wall_s'])} s wall"),
        ("resumed losses = uninterrupted", t["resume_matches"], f"{t['resume_matches']['steps_compared']} steps, max |diff| "
         f"{fmt(t['resume_matches']['max_abs_loss_diff'])}"),
        ("export", t["export"], f"{fmt(t['export']['bytes'])} bytes"),
        ("cll-eval de-fr, fr-de (50 sentences, greedy)", t["eval"],
         ", ".join(f"{k}: {v['n']} sentences, BLEU {fmt(v['bleu'])}, off-target {fmt(v['off_target'])}%"
                   for k, v in t["eval"]["directions"].items())
         + f"; {fmt(t['eval']['wall_s'])} s wall, peak RSS {fmt(t['eval']['rss_mb'].get('self'))} MB"),
    ]
    if "eval_all" in t:
        e = t["eval_all"]
        rows.append((f"cll-eval, every test direction ({e['sentences']} sentences each, greedy, 1 LID worker)", e,
                     f"{e['directions']} of {e['expected']} directions ({e['zero_shot']} zero-shot); "
                     f"{fmt(e['wall_s'])} s wall, {fmt(e['wall_s'] / max(1, e['directions']))} s per direction; "
                     f"peak RSS {fmt(e['rss_mb'].get('self'))} MB, LID worker {fmt(e['rss_mb'].get('lid_worker'))} MB"))
    for name, r, detail in rows:
        lines.append(f"| {name} | {'pass' if r.get('ok') else 'FAIL'} | {detail} |")
    return "\n".join(lines)


def ratios(results: list[dict]) -> str:
    if len(results) < 2:
        return ""
    a, z = results[0], results[-1]
    out = []
    for name, key in (("build", "build"), ("stream", "stream"), ("synth", "synth")):
        out.append(f"{name} peak RSS, largest / smallest scale: {z[key]['rss_peak_mb'] / a[key]['rss_peak_mb']:.2f} "
                   f"({a[key]['rss_peak_mb']:.0f} -> {z[key]['rss_peak_mb']:.0f} MB; after imports "
                   f"{a[key]['rss_imports_mb']:.0f} -> {z[key]['rss_imports_mb']:.0f} MB)")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scales", type=float, nargs="+", default=[0.01, 0.05], help="fractions of OPUS-100 (0.2 only when asked)")
    p.add_argument("--out", default=str(ROOT / "runs" / "opus"))
    p.add_argument("--vocab-size", type=int, default=8000, help="SentencePiece vocabulary of the builds")
    p.add_argument("--seconds", type=float, default=10.0, help="stream throughput loop")
    p.add_argument("--batch-tokens", type=int, default=4096, help="stream microbatch budget")
    p.add_argument("--batches", type=int, default=2000, help="batches counted for the direction shares")
    p.add_argument("--batches-longer", type=int, default=20000, help="the same counted over more batches")
    p.add_argument("--train", action=argparse.BooleanOptionalAction, default=True,
                   help="the tiny FCLL run at the smallest scale (default on)")
    p.add_argument("--train-steps", type=int, default=50)
    p.add_argument("--checkpoint-step", type=int, default=25)
    p.add_argument("--eval-sentences", type=int, default=20,
                   help="sentences per direction when cll-eval runs over every test direction")
    p.add_argument("--keep", action="store_true", help="keep corpora, shards and training runs")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = [measure_scale(s, out, args) for s in sorted(args.scales)]
    report = {"scales": results, "extrapolated_from": results[-1]["scale"],
              "extrapolated": {k: {"value": v, "formula": f} for k, (v, f) in extrapolate(results[-1]).items()},
              "affine_fit": {k: affine(results, k) for k in AFFINE} if len(results) > 1 else {},
              "args": {k: v for k, v in vars(args).items()}}
    if args.train:
        report["train"] = train_section(Path(results[0]["shards_dir"]), out / "train", args.train_steps,
                                        args.checkpoint_step, args.eval_sentences)
    report["seconds"] = time.perf_counter() - started
    md = ["## OPUS-100 shape: measured and extrapolated to scale 1.0", "", scale_table(results), "",
          ratios(results), "", "## Build stages", "", stage_table(results), "",
          f"## Direction shares after {args.batches:,} (and {args.batches_longer:,}) batches: observed vs planned",
          "", shares_table(results)]
    spm_scale = next(r for r in results if r["spm_languages"])
    md += ["", f"## SentencePiece by language at scale {spm_scale['scale']:g} (vocabulary {args.vocab_size:,}, "
           "500 held-out sentences per language)", "", spm_report(spm_scale["spm_languages"])]
    if args.train:
        md += ["", "## Training at scale " + f"{results[0]['scale']:g}", "", train_table(report["train"])]
    text = "\n".join(md) + "\n"
    print(text)
    (out / "bench_opus_shape.json").write_text(json.dumps(report, indent=1))
    (out / "bench_opus_shape.md").write_text(text)
    if not args.keep:
        for r in results:
            shutil.rmtree(r["shards_dir"], ignore_errors=True)
        for d in ("full", "split", "dry-run-dir"):
            shutil.rmtree(out / "train" / d, ignore_errors=True)
    log(f"done in {report['seconds']:.0f} s; {out / 'bench_opus_shape.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
