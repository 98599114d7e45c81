"""A new language from a few parallel pairs (paper §4.4, App. A), the work behind ``cll-extend``:
the command's help (:mod:`cll_scale.extend`) describes its five steps and how a rerun resumes."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import sentencepiece as spm
import torch

from cll_scale.core.outputs import atomic_dir, json_text, write_atomic
from cll_scale.data.corpora import read_multiway
from cll_scale.data.languages import Direction, LanguageError, check_language
from cll_scale.data.manifest import Manifest
from cll_scale.data.shards import BuildConfig, build_shards, link_shards
from cll_scale.data.spm_extend import extend_sentencepiece
from cll_scale.loops import finetune
from cll_scale.loops.finetune import Comparison, check_fine_tuning_inputs, fine_tuning_recipe
from cll_scale.loops.settings import ExtendConfig  # noqa: F401  (the settings of this work)
from cll_scale.model.config import ModelConfig
from cll_scale.model.export import ExportInfo, export_lang_tag, export_model_config, load_export, write_export
from cll_scale.model.model import CLLTransformer
from cll_scale.training import collectives
from cll_scale.training.rundir import RunDir, chosen_export

# -- 1 + 2: vocabulary and shards -------------------------------------------------------------------

def old_language_sample(data: Path, manifest: Manifest, rows: int) -> list[str]:
    """Source sentences of every old training direction (decoded from the shards)."""
    sp = spm.SentencePieceProcessor(model_file=str(data / manifest.tokenizer.file))
    texts = []
    for direction in manifest.splits["train"].directions():
        ids = manifest.read_direction(data, "train", direction, ["src_ids"]).column("src_ids")
        texts += sp.decode(ids.slice(0, rows).to_pylist())
    return texts


def new_language_corpus(cfg: ExtendConfig, old: Manifest):
    """The corpus restricted to what extension may use: ``max_pairs`` training lines of the
    ``pairs`` directions, and every dev/test direction that involves the new language."""
    pairs = [Direction.parse(p) for p in cfg.pairs]
    langs = [*old.languages, cfg.lang]
    full = read_multiway(cfg.corpus, ",".join(f"{a}-{b}" for a in langs for b in langs if a != b), langs=langs)
    evaluation = [Direction(a, b) for a in langs for b in langs if a != b and cfg.lang in (a, b)]
    splits = []
    for split in full.splits:
        if split.name == "train":
            reader = split.read_chunks

            def first_lines(size, reader=reader, limit=cfg.max_pairs):
                for first, chunk in reader(size):     # line numbers count from 1
                    if first > limit:
                        return
                    yield first, {x: t[:limit - first + 1] for x, t in chunk.items()}
            split = dataclasses.replace(split, directions=pairs, read_chunks=first_lines,
                                        n_lines=min(split.n_lines or cfg.max_pairs, cfg.max_pairs))
        else:
            split = dataclasses.replace(split, directions=evaluation)
        splits.append(split)
    zero = [d for d in evaluation if d not in pairs]
    return dataclasses.replace(full, languages=langs, central=old.central_language, condition="extension",
                               supervised=pairs, zero_shot=zero, splits=splits)


def check_inputs(cfg: ExtendConfig) -> Manifest:
    """Everything that can be wrong with the arguments, before any work (on every rank); returns
    the --data manifest, which the command reads once."""
    old = Manifest.load(cfg.data)
    try:
        check_language(cfg.lang)
    except LanguageError:
        raise ValueError(f"--lang {cfg.lang!r} is not an ISO 639-1 language code (e.g. cs, pt_br)") from None
    if cfg.lang in old.languages:
        raise ValueError(f"{cfg.data} already has {cfg.lang!r} ({', '.join(old.languages)})")
    pairs = [Direction.parse(p) for p in cfg.pairs]
    bad = [str(p) for p in pairs if cfg.lang not in (p.src, p.tgt) or {p.src, p.tgt} - {cfg.lang, *old.languages}]
    if bad or not pairs:
        raise ValueError(f"--pairs {', '.join(bad)}: each must join {cfg.lang} with one of "
                         f"{', '.join(old.languages)}")
    if Manifest.load(cfg.model).languages != old.languages:      # the export carries its manifest
        raise ValueError(f"{cfg.model} was not trained on {cfg.data} (other languages)")
    if not cfg.lr and not pretrain_schedule(cfg.model):
        raise ValueError(f"--model {cfg.model}: its pre-training schedule is unknown (no config.json of the run "
                         f"that wrote it, beside it or at its recorded run_dir); pass --lr to fine-tune at a "
                         f"constant rate")
    check_fine_tuning_inputs(cfg, old, cfg.data, cfg.out, {"--model": cfg.model, "--data": cfg.data,
                                                           "--corpus": cfg.corpus})
    return old


def build_data(cfg: ExtendConfig, old: Manifest) -> tuple[Path, Manifest]:
    """``out/data``: old shards + the new language's, one manifest, the extended vocabulary; and
    that manifest, which the rest of the command is handed."""
    out, data = Path(cfg.out), Path(cfg.data)
    final = out / "data"
    if (final / "manifest.json").exists():
        return final, Manifest.load(final)
    corpus = new_language_corpus(cfg, old)
    train = next(s for s in corpus.splits if s.name == "train")
    new_texts = [t for _, chunk in train.read_chunks(8192) for t in chunk[cfg.lang]]
    out.mkdir(parents=True, exist_ok=True)
    result = extend_sentencepiece(data / old.tokenizer.file, cfg.lang, new_texts, out / "spm.model",
                                  old_language_sample(data, old, cfg.keep_rows), cfg.vocab_size, cfg.seed)
    write_atomic(out / "spm_extension.json", json_text(dataclasses.asdict(result), indent=1, ensure_ascii=False))
    new_dir = out / "new-shards"
    if not (new_dir / "manifest.json").exists():
        build_shards(corpus, BuildConfig(out_dir=str(new_dir), spm_model=str(out / "spm.model"),
                                         block_rows=old.block_rows, max_length=old.max_length))
    new = Manifest.load(new_dir)
    merged = Manifest.from_json(old.to_json())
    merged.languages = corpus.languages
    merged.supervised = old.supervised + [str(d) for d in corpus.supervised]
    merged.zero_shot = old.zero_shot + [str(d) for d in corpus.zero_shot]
    merged.tokenizer = new.tokenizer
    for name, split in new.splits.items():
        into = merged.splits.setdefault(name, dataclasses.replace(split, shards=[], filtered={}))
        into.shards = sorted(into.shards + split.shards, key=lambda s: s.file)
        into.filtered.update(split.filtered)
    merged.source = {"extension": {"lang": cfg.lang, "pairs": cfg.pairs, "max_pairs": cfg.max_pairs,
                                   "corpus": cfg.corpus, "from": str(data)}, **old.source}
    with atomic_dir(final) as tmp:
        link_shards(merged, [(data, [s for x in old.splits.values() for s in x.shards]),
                             (new_dir, [s for x in new.splits.values() for s in x.shards])],
                    tmp, out / "spm.model")
    return final, Manifest.load(final)


# -- 3: the model ----------------------------------------------------------------------------------

def grow_model(model: CLLTransformer, lang: str, vocab_size: int, noise: float, seed: int) -> CLLTransformer:
    """A copy of ``model`` with ``vocab_size`` embedding rows and an LSL for ``lang``."""
    old_cfg = model.cfg
    cfg = ModelConfig.from_json({**old_cfg.to_json(), "vocab_size": vocab_size,
                                 "languages": [*old_cfg.languages, lang]})
    grown = CLLTransformer(cfg)
    state = model.state_dict()
    new_state = grown.state_dict()
    gen = torch.Generator().manual_seed(seed)
    emb = state[CLLTransformer.EMBEDDING]                        # (V_old, D)
    rows = torch.cat([emb[:cfg.pad_id], emb[cfg.pad_id + 1:]])   # the pad row is zero by design
    fresh = rows.mean(0) + noise * rows.std() * torch.randn(vocab_size - emb.shape[0], emb.shape[1], generator=gen)
    new_state[CLLTransformer.EMBEDDING] = torch.cat([emb, fresh.to(emb.dtype)])
    new_slot = len(old_cfg.lsl_languages)
    for name in new_state:
        if name == CLLTransformer.EMBEDDING:
            continue
        if name in state:
            new_state[name] = state[name]
        elif name == CLLTransformer.lsl_name(new_slot):   # the new language's LSLs: the average of every old one
            new_state[name] = torch.stack([state[CLLTransformer.lsl_name(i)] for i in range(new_slot)]).mean(0)
        else:
            raise RuntimeError(f"parameter {name} of the grown model has no source")
    grown.load_state_dict(new_state, strict=True)
    return grown.eval()


def old_cll_patterns(cfg: ModelConfig, new_lang: str) -> list[str]:
    """The existing languages' LSL Parameters, each holding its LSLs and t of every CLL layer
    (frozen: paper §4.4)."""
    return ([CLLTransformer.lsl_name(i) for i, x in enumerate(cfg.lsl_languages) if x != new_lang]
            if cfg.cll_layers else [])


def build_init_export(cfg: ExtendConfig, data: Path, manifest: Manifest) -> Path:
    out = Path(cfg.out) / "init-export"
    if ExportInfo.exists(out):
        return out
    model, _ = load_export(cfg.model)
    grown = grow_model(model, cfg.lang, manifest.tokenizer.vocab_size, cfg.noise, cfg.seed)
    write_export(out, grown.state_dict(), grown.cfg, data,
                 {"extended_from": cfg.model, "lang": cfg.lang, "pretrain": pretrain_schedule(cfg.model),
                  "lang_tag": export_lang_tag(cfg.model)}, manifest)
    return out


def pretrain_schedule(export: str | Path) -> dict:
    """Peak LR, warm-up and steps of the pre-training run behind an export (its run directory
    keeps the resolved config): extension continues that schedule. ``{}`` when it is unknown."""
    info = ExportInfo.load(export)
    if info.pretrain is not None:
        return info.pretrain
    run = _run_of(Path(export), info.run_dir)
    if run is None:
        return {}
    optim = run.config()["optim"]           # runs of before the sections too
    return {"lr": optim["lr"], "warmup_steps": optim["warmup_steps"], "step": info.step or 0}


def _run_of(export: Path, run_dir: str) -> RunDir | None:
    """The run that wrote ``export``, if its config.json is there. cll-train writes an export inside
    its run directory (``export/``, ``export-best/``), so the export's own folder is asked first:
    the ``run_dir`` recorded is as typed, and a relative one means nothing from another directory."""
    here = export.resolve()
    candidates = [here.parent] if here.name.startswith("export") else []
    candidates += [Path(run_dir)] if run_dir else []
    return next((RunDir(c) for c in candidates if RunDir(c).has_config()), None)


# -- 4 + 5: fine-tune and evaluate ---------------------------------------------------------------

def fine_tune(cfg: ExtendConfig, data: Path, init: Path) -> Path:
    sched = ExportInfo.load(init).pretrain
    if cfg.lr:
        sched = {"lr": cfg.lr, "warmup_steps": 0, "step": 0}
    elif not sched:         # check_inputs refuses this before any work; an init-export of before may lack it
        raise ValueError(f"{cfg.model}: its pre-training schedule is unknown (no run config.json); pass --lr")
    frozen = old_cll_patterns(ModelConfig.from_json(export_model_config(init)),
                              cfg.lang) + cfg.freeze
    run = Path(cfg.out) / "run"
    optim = {"lr": sched["lr"], "warmup_steps": sched["warmup_steps"], "schedule_offset": sched["step"]}
    finetune.train_run(fine_tuning_recipe(cfg, data, run, optim, init_from=str(init), freeze=frozen,
                                          max_steps=cfg.max_steps))
    return chosen_export(run)


def check_steps(cfg: ExtendConfig, restart: bool) -> Manifest:
    """:func:`check_inputs`, and, for a rerun, that it asks no fewer steps than its run has trained."""
    old = check_inputs(cfg)
    trained = [row["step"] for row in RunDir(Path(cfg.out) / "run").metrics() if "loss" in row]
    finetune.check_not_cut_back("--max-steps", cfg.max_steps, trained[-1] if trained else 0, cfg.out,
                                "fine-tuning steps", restart)
    return old


def run(cfg: ExtendConfig, restart: bool = False) -> dict[str, str]:
    return finetune.run_command("cll-extend", cfg, restart, {"max_steps", "eval_splits", "eval_max_sentences", "eval_beam"},
                                lambda c: check_steps(c, restart),
                                lambda rank, world, device, manifest: extend(cfg, manifest, rank))


def extend(cfg: ExtendConfig, old: Manifest, rank: int) -> Comparison:
    """Build the merged data and the grown model once (rank 0; the others wait), then fine-tune."""
    out = Path(cfg.out)
    data, init, manifest = out / "data", out / "init-export", None
    if rank == 0:
        data, manifest = build_data(cfg, old)
        init = build_init_export(cfg, data, manifest)
    collectives.barrier()
    return Comparison({"original": cfg.model, f"+{cfg.lang}": fine_tune(cfg, data, init)}, data, cfg.corpus,
                      manifest)

