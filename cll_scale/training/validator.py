"""Validation during training: NLL per direction, optionally greedy BLEU and the zero-shot
off-target rate, and model selection on a supervised metric.

Only supervised directions choose the model: a zero-shot study must not pick its checkpoint with
parallel data it claims not to have.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from cll_scale.data.manifest import SUPERVISED, ZERO_SHOT
from cll_scale.data.stream import Batch, eval_batches
from cll_scale.evaluation.evaluator import score_model
from cll_scale.evaluation.testsets import pairs_from_shards
from cll_scale.evaluation.translator import TranslateConfig, Translator
from cll_scale.model.decode_config import DecodeConfig
from cll_scale.model.model import projected_loss, target_positions
from cll_scale.training import collectives
from cll_scale.training.configs import BEST_METRICS, ValidConfig  # noqa: F401  (the section this module uses)


@dataclass
class ValidResult:
    """One validation: ``scores`` are the averages logged and compared (``valid_nll``, and with
    decoding ``valid_bleu``, ``valid_zero_shot_offtarget``...), ``record`` the metrics.jsonl line."""
    scores: dict[str, float] = field(default_factory=dict)
    record: dict = field(default_factory=dict)


class Validator:
    """Validation of a training run on the shards' ``valid`` split, every ``every`` steps (all ranks)."""
    def __init__(self, cfg: ValidConfig, data: str, stream_cfg, manifest, rank: int, world: int, device,
                 best: float | None):
        """``data``: the shard directory; ``best``: the best value of ``cfg.best_metric`` so far
        (from ``export-best/`` when resuming)."""
        self.cfg, self.data, self.stream_cfg, self.manifest = cfg, data, stream_cfg, manifest
        self.rank, self.world, self.device, self.best = rank, world, device, best
        self.split = "valid" if "valid" in manifest.splits else None

    def due(self, step: int) -> bool:
        return self.split is not None and step % self.cfg.every == 0

    def is_new_best(self, scores: dict[str, float]) -> bool:
        """Whether ``scores`` improve ``best_metric`` (lower is better for NLL, higher otherwise);
        remembers it if so."""
        metric = self.cfg.best_metric
        if not metric or metric not in scores:
            return False
        value = float(scores[metric])
        better = self.best is None or (value < self.best if metric.endswith("nll") else value > self.best)
        if better:
            self.best = value
        return better

    @torch.no_grad()
    def run(self, engine, step: int) -> ValidResult:
        """Validate (every rank takes part)."""
        if self.split is None:
            return ValidResult()
        engine.eval()
        model = engine.module
        directions = self.manifest.splits[self.split].directions()
        sums = torch.zeros(len(directions), 2, dtype=torch.float64, device=self.device)   # nll, tokens
        for k, direction in enumerate(directions):
            for i, batch in enumerate(self._batches(direction, model.cfg.pad_id)):
                if self.cfg.max_batches and i >= self.cfg.max_batches:
                    break
                batch = batch.to(self.device)
                features = engine(batch.src_tokens, model.shift_right(batch.tgt_tokens), batch.tgt_lang,
                                  lang_runs=batch.lang_runs, features_only=True)
                features, target = target_positions(features, batch.tgt_tokens, model.cfg.pad_id, batch.ntokens)
                nll = projected_loss(features, model.embed.weight, target, model.cfg.pad_id, 0.0)[1]
                sums[k, 0] += nll.double()
                sums[k, 1] += batch.ntokens
        torch.distributed.all_reduce(sums)
        per_dir = {d: nll / max(n, 1) for d, (nll, n) in zip(directions, sums.tolist())}   # one read
        sup = [v for d, v in per_dir.items() if not self.manifest.is_zero_shot(d)]
        zero = [v for d, v in per_dir.items() if self.manifest.is_zero_shot(d)]
        scores = {"valid_nll": sum(sup) / max(len(sup), 1)}
        if zero:
            scores["valid_zero_shot_nll"] = sum(zero) / len(zero)
        record = {"step": step, **scores, "valid_by_direction": per_dir}
        if self.cfg.decode_sentences:
            decoded, by_direction = self._decode(model)
            scores.update(decoded)
            record.update(scores, valid_decoding={"by_direction": by_direction})
        engine.train()
        return ValidResult(scores, record)

    def _batches(self, direction: str, pad: int):
        """This rank's validation batches of ``direction``: its slice of every row, or with
        ``max_sentences`` = N its share of the first N lines (every rank reads the direction, a
        dev set of a few thousand rows, and keeps lines in its own range)."""
        batch_tokens, tag, n = self.stream_cfg.batch_tokens, self.stream_cfg.add_lang_tag, self.cfg.max_sentences
        if not n:
            return eval_batches(self.data, self.split, direction, batch_tokens, self.rank, self.world, tag, self.manifest)
        first, last = self.rank * n // self.world, (self.rank + 1) * n // self.world
        return lines_between(eval_batches(self.data, self.split, direction, batch_tokens, 0, 1, tag, self.manifest),
                             first, last, pad, batch_tokens)

    def _decode(self, model) -> tuple[dict[str, float], dict[str, dict]]:
        """Greedy translations of the first validation sentences of every direction on rank 0:
        BLEU and off-target rate over training show when (and whether) zero-shot collapses.
        Returns the averages and each direction's BLEU and off-target rate."""
        scores, by_direction = {}, {}
        if self.rank == 0:
            tr = Translator(model, self.manifest, Path(self.data) / self.manifest.tokenizer.file,
                            TranslateConfig(DecodeConfig(beam=1)), lang_tag=self.stream_cfg.add_lang_tag)
            ev = score_model(tr, pairs_from_shards(self.data, self.split, self.manifest),
                             max_sentences=self.cfg.decode_sentences, log=lambda s: None)
            means = {"valid_bleu": ev.mean(SUPERVISED, "bleu"), "valid_zero_shot_bleu": ev.mean(ZERO_SHOT, "bleu"),
                     "valid_zero_shot_offtarget": ev.mean(ZERO_SHOT, "off_target_restricted"),
                     "valid_zero_shot_code_switch": ev.mean(ZERO_SHOT, "code_switch")}
            scores = {k: v for k, v in means.items() if v is not None}
            by_direction = {r.direction: {"bleu": r.bleu, "off_target_restricted": r.off_target_restricted}
                            for r in ev.results}
        return collectives.all_gather_object((scores, by_direction))[0]     # every rank logs the same numbers


def lines_between(batches, first: int, last: int, pad: int, batch_tokens: int):
    """The rows of ``batches`` (from :func:`eval_batches`, length-sorted) whose corpus line
    (counted from 1) is in ``(first, last]``, regrouped into batches of at most ``batch_tokens``
    padded cells, so that validating on the head of a dev set costs forward passes in
    proportion to the rows kept, not to the dev set."""
    held: list[Batch] = []
    rows = width = 0
    for batch in batches:
        keep = (batch.lines > first) & (batch.lines <= last)
        if not bool(keep.any()):          # host tensors: no device involved
            continue
        part = _rows(batch, keep, pad)
        w = max(part.src_tokens.shape[1], part.tgt_tokens.shape[1])
        if held and (rows + len(part)) * max(width, w) > batch_tokens:
            yield _concat(held, pad)
            held, rows, width = [], 0, 0
        held.append(part)
        rows, width = rows + len(part), max(width, w)
    if held:
        yield _concat(held, pad)


def _rows(batch: Batch, keep: torch.Tensor, pad: int) -> Batch:
    """The ``keep`` rows of a right-padded batch, cut to their own longest row."""
    src, tgt = batch.src_tokens[keep], batch.tgt_tokens[keep]
    src = src[:, :int((src != pad).sum(1).max())]
    tgt = tgt[:, :int((tgt != pad).sum(1).max())]
    return Batch(src, tgt, batch.src_lang[keep], batch.tgt_lang[keep], batch.direction,
                 int((tgt != pad).sum()), batch.lines[keep])


def _concat(parts: list[Batch], pad: int) -> Batch:
    def stack(tensors):
        width = max(t.shape[1] for t in tensors)
        return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1]), value=pad) for t in tensors])
    if len(parts) == 1:
        return parts[0]
    return Batch(stack([p.src_tokens for p in parts]), stack([p.tgt_tokens for p in parts]),
                 torch.cat([p.src_lang for p in parts]), torch.cat([p.tgt_lang for p in parts]), parts[0].direction,
                 sum(p.ntokens for p in parts), torch.cat([p.lines for p in parts]))
