"""Back-translation fine-tuning (paper §4.3), the loop behind ``cll-bt``: the command's help
(:mod:`cll_scale.backtranslate`) describes each epoch and the layout of ``--out``."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from cll_scale.core.jsonfiles import read_json_object
from cll_scale.core.outputs import atomic_dir, json_text, write_atomic
from cll_scale.data.languages import Direction
from cll_scale.data.manifest import Manifest, Shard
from cll_scale.data.shards import BuildConfig, link_shards, write_direction
from cll_scale.evaluation.translator import TranslateConfig, Translator, check_beam
from cll_scale.loops import finetune
from cll_scale.loops.finetune import Comparison, fine_tuning_recipe
from cll_scale.loops.settings import BTConfig  # noqa: F401  (the settings of this loop)
from cll_scale.model.decode_config import DecodeConfig
from cll_scale.training import collectives

BT_PREFIX = "bt."     # pseudo shard files: train/bt.<src>-<tgt>.<k>.arrow


def check_inputs(cfg: BTConfig) -> Manifest:
    """What can be wrong with the inputs, before anything is written (on every rank); returns
    the --data manifest, which the command reads once."""
    manifest = Manifest.load(cfg.data)
    unknown = [x for x in cfg.bt_langs if x not in manifest.languages]
    if unknown:
        raise ValueError(f"--bt-langs {', '.join(unknown)}: not languages of {cfg.data} "
                         f"({', '.join(manifest.languages)})")
    check_beam(cfg.beam, manifest.tokenizer.vocab_size, "--beam")       # generation's
    finetune.check_fine_tuning_inputs(cfg, manifest, cfg.data, cfg.out,
                                      {"--model": cfg.model, "--data": cfg.data})
    model = Manifest.load(cfg.model)        # an export carries the manifest it was trained on
    if model.languages != manifest.languages or model.tokenizer.sha256 != manifest.tokenizer.sha256:
        raise ValueError(f"--model {cfg.model} was not trained on --data {cfg.data} (languages "
                         f"{', '.join(model.languages)} vs {', '.join(manifest.languages)}, or another "
                         f"tokenizer)")
    return manifest


# -- generation -----------------------------------------------------------------------------------

def read_targets(data: Path, manifest: Manifest, direction: str) -> tuple[np.ndarray, list[list[int]]]:
    """(line numbers, target ids) of one training direction, in shard order."""
    table = manifest.read_direction(data, "train", direction, ["line", "tgt_ids"])
    return table.column("line").to_numpy(), table.column("tgt_ids").to_pylist()


def plan_epoch(cfg: BTConfig, manifest: Manifest, epoch: int) -> list[dict]:
    """The epoch's work as chunks of (direction, row indices, pseudo-source languages), drawn
    from (seed, epoch, direction) only, so every rank and every restart plans the same."""
    langs = cfg.bt_langs or manifest.languages
    chunks = []
    for i, direction in enumerate(manifest.splits["train"].directions()):
        tgt = Direction.parse(direction).tgt
        options = [x for x in langs if x != tgt]
        if not options:
            continue
        rng = np.random.default_rng([cfg.seed, epoch, i])
        n = manifest.splits["train"].rows(direction)
        rows = np.arange(n) if not cfg.max_rows or cfg.max_rows >= n else np.sort(rng.choice(n, cfg.max_rows, replace=False))
        pseudo = rng.choice(len(options), len(rows))
        for start in range(0, len(rows), cfg.chunk_rows):
            part = slice(start, start + cfg.chunk_rows)
            chunks.append({"direction": direction, "rows": rows[part].tolist(),
                           "pseudo_langs": [options[k] for k in pseudo[part]]})
    return chunks


def generate(cfg: BTConfig, manifest: Manifest, translator: Translator, epoch: int, rank: int, world: int
             ) -> tuple[list[dict], dict]:
    """Translate this rank's unfinished chunks; each finished chunk is written at once. Returns
    the epoch's chunks and this rank's speed: pseudo sentences, seconds, sentences/s."""
    data, parts = Path(cfg.data), Path(cfg.out) / "parts" / f"epoch-{epoch}"
    parts.mkdir(parents=True, exist_ok=True)
    chunks = plan_epoch(cfg, manifest, epoch)
    mine = [k for k in range(len(chunks)) if k % world == rank and not (parts / f"{k:06d}.json").exists()]
    targets: dict[str, tuple] = {}
    bar = tqdm(total=sum(len(chunks[k]["rows"]) for k in mine), unit="sent", disable=rank != 0 or None,
               desc=f"back-translating, epoch {epoch}", dynamic_ncols=True)
    start, done = time.perf_counter(), 0
    for k in mine:
        c = chunks[k]
        if c["direction"] not in targets:
            targets[c["direction"]] = read_targets(data, manifest, c["direction"])
        lines, tgt_ids = targets[c["direction"]]
        texts = translator.sp.decode([tgt_ids[r] for r in c["rows"]])
        pseudo = translator.translate(texts, c["pseudo_langs"])
        record = {"direction": c["direction"], "lines": [int(lines[r]) for r in c["rows"]],
                  "rows": c["rows"], "pseudo_langs": c["pseudo_langs"], "pseudo": pseudo}
        write_atomic(parts / f"{k:06d}.json", json_text(record, ensure_ascii=False))
        bar.update(len(c["rows"]))
        done += len(c["rows"])
    bar.close()
    seconds = time.perf_counter() - start
    speed = {"pseudo_sentences": done, "seconds": seconds, "sentences_per_s": done / seconds if done else 0.0}
    if done:
        print(f"[cll-bt] rank {rank}, epoch {epoch}: {done:,} pseudo sentences in {seconds:.1f} s "
              f"({speed['sentences_per_s']:.1f}/s, beam {cfg.beam}, {translator.device.type})", file=sys.stderr)
    return chunks, speed


def build_epoch_data(cfg: BTConfig, manifest: Manifest, epoch: int, n_chunks: int, sp) -> Path:
    """Real shards (linked) + pseudo pairs as one shard directory ``data/epoch-K``."""
    data, out = Path(cfg.data), Path(cfg.out) / "data" / f"epoch-{epoch}"
    if (out / "manifest.json").exists():
        return out
    parts = Path(cfg.out) / "parts" / f"epoch-{epoch}"
    by_direction: dict[str, dict[str, list]] = {}
    filtered: dict[str, dict[str, int]] = {}
    targets: dict[str, list] = {}
    for k in range(n_chunks):
        rec = read_json_object(parts / f"{k:06d}.json")
        if rec["direction"] not in targets:
            targets[rec["direction"]] = read_targets(data, manifest, rec["direction"])[1]
        tgt = Direction.parse(rec["direction"]).tgt
        src_ids = sp.encode(rec["pseudo"])
        for row, line, lang, text, ids in zip(rec["rows"], rec["lines"], rec["pseudo_langs"], rec["pseudo"], src_ids):
            name = f"{lang}-{tgt}"
            counts = filtered.setdefault(BT_PREFIX + name, {"empty": 0, "too_long": 0})
            if not text.strip():          # the model produced nothing: counted, not trained on
                counts["empty"] += 1
                continue
            if len(ids) > manifest.max_length:
                counts["too_long"] += 1
                continue
            cols = by_direction.setdefault(name, {"line": [], "src_ids": [], "tgt_ids": []})
            cols["line"].append(line)
            cols["src_ids"].append(ids)
            cols["tgt_ids"].append(targets[rec["direction"]][row])
    build_cfg = BuildConfig(out_dir=str(out), block_rows=manifest.block_rows, max_length=manifest.max_length)
    with atomic_dir(out) as tmp:
        pseudo: list[Shard] = []
        for name in sorted(by_direction):
            pseudo += write_direction(tmp, "train", Direction.parse(name), by_direction[name], build_cfg, BT_PREFIX)
        merged = Manifest.from_json(manifest.to_json())
        merged.splits["train"].shards = sorted(merged.splits["train"].shards + pseudo, key=lambda s: s.file)
        merged.splits["train"].filtered.update(filtered)
        merged.source = {"back_translation": {"epoch": epoch, "from": str(data), "model": cfg.model,
                                              "pseudo_rows": sum(s.rows for s in pseudo)}, **manifest.source}
        link_shards(merged, [(data, [s for split in manifest.splits.values() for s in split.shards])], tmp,
                    data / manifest.tokenizer.file)
    return out


# -- the loop -------------------------------------------------------------------------------------

def train_epoch(cfg: BTConfig, epoch_data: Path) -> None:
    run = Path(cfg.out) / "run"
    finetune.train_run(fine_tuning_recipe(cfg, epoch_data, run, {"lr": cfg.lr, "warmup_steps": cfg.warmup_steps},
                                          {"best_metric": ""}, init_from=cfg.model, new_data=True, max_epochs=1.0))


def bt_state(out: Path) -> dict:
    """``bt.json``: the epochs a run has finished (none before its first)."""
    path = out / "bt.json"
    return read_json_object(path) if path.exists() else {"epochs_done": 0}


def check_epochs(cfg: BTConfig, restart: bool) -> Manifest:
    """:meth:`BTConfig.check`, and, for a rerun, that it asks no fewer epochs than the run has
    done: its model is the one after all of them, and its report would name the fewer."""
    manifest = check_inputs(cfg)
    finetune.check_not_cut_back("--epochs", cfg.epochs, bt_state(Path(cfg.out))["epochs_done"], cfg.out,
                                "back-translation epochs", restart)
    return manifest


def run(cfg: BTConfig, restart: bool = False) -> dict[str, str]:
    # More epochs or another evaluation may be asked of a run.
    return finetune.run_command("cll-bt", cfg, restart, {"epochs", "eval_splits", "eval_max_sentences", "eval_beam"},
                                lambda c: check_epochs(c, restart),
                                lambda rank, world, device, manifest: epochs(cfg, manifest, rank, world, device))


def epochs(cfg: BTConfig, manifest: Manifest, rank: int, world: int, device) -> Comparison:
    """The epochs not done yet: generate with the latest model, build that epoch's data, train."""
    out = Path(cfg.out)
    state_path = out / "bt.json"
    state = bt_state(out)
    for epoch in range(state["epochs_done"] + 1, cfg.epochs + 1):
        current = cfg.model if epoch == 1 else out / "run" / "export"
        translator = Translator.load(current, device, TranslateConfig(DecodeConfig(beam=cfg.beam)))
        chunks, speed = generate(cfg, manifest, translator, epoch, rank, world)
        collectives.barrier()
        if rank == 0:
            build_epoch_data(cfg, manifest, epoch, len(chunks), translator.sp)
        collectives.barrier()
        train_epoch(cfg, out / "data" / f"epoch-{epoch}")
        if rank == 0:
            state = {"epochs_done": epoch, "generation": {**state.get("generation", {}), str(epoch): speed}}
            write_atomic(state_path, json_text(state, indent=1))
        collectives.barrier()
    return Comparison({"before": cfg.model, f"after {cfg.epochs} BT epochs": out / "run" / "export"}, cfg.data,
                      cfg.data, manifest)

