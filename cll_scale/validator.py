"""Validation during training: NLL per direction, optionally greedy BLEU and the zero-shot
off-target rate, and model selection on a supervised metric.

Only supervised directions choose the model: a zero-shot study must not pick its checkpoint with
parallel data it claims not to have.
"""
from __future__ import annotations

from pathlib import Path

import torch

from cll_scale import engine as ds
from cll_scale.model import label_smoothed_loss
from cll_scale.stream import Batch, eval_batches


class Validator:
    def __init__(self, cfg, stream_cfg, manifest, rank: int, world: int, device, best: float | None):
        """``cfg`` is the TrainConfig (``valid_*`` and ``best_metric``), ``best`` the best value of
        ``best_metric`` so far (from ``export-best/`` when resuming)."""
        self.cfg, self.stream_cfg, self.manifest = cfg, stream_cfg, manifest
        self.rank, self.world, self.device, self.best = rank, world, device, best
        self.split = "valid" if "valid" in manifest.splits else None

    def due(self, step: int) -> bool:
        return self.split is not None and step % self.cfg.valid_every == 0

    def is_new_best(self, result: dict) -> bool:
        """Whether ``result`` improves ``best_metric`` (lower is better for NLL, higher otherwise);
        remembers it if so."""
        metric = self.cfg.best_metric
        if not metric or metric not in result:
            return False
        value = float(result[metric])
        better = self.best is None or (value < self.best if metric.endswith("nll") else value > self.best)
        if better:
            self.best = value
        return better

    @torch.no_grad()
    def run(self, engine, step: int) -> tuple[dict, dict]:
        """Validate; returns (averages, the full metrics record). Every rank takes part."""
        if self.split is None:
            return {}, {}
        engine.eval()
        model = engine.module
        directions = self.manifest.splits[self.split].directions()
        sums = torch.zeros(len(directions), 2, dtype=torch.float64, device=self.device)   # nll, tokens
        for k, direction in enumerate(directions):
            for i, batch in enumerate(self._batches(direction, model.cfg.pad_id)):
                if self.cfg.valid_max_batches and i >= self.cfg.valid_max_batches:
                    break
                batch = batch.to(self.device)
                logits = engine(batch.src_tokens, model.shift_right(batch.tgt_tokens), batch.tgt_lang,
                                lang_runs=batch.lang_runs)
                sums[k, 0] += label_smoothed_loss(logits, batch.tgt_tokens, model.cfg.pad_id, 0.0)[1].double()
                sums[k, 1] += batch.ntokens
        torch.distributed.all_reduce(sums)
        per_dir = {d: nll / max(n, 1) for d, (nll, n) in zip(directions, sums.tolist())}   # one read
        sup = [v for d, v in per_dir.items() if not self.manifest.is_zero_shot(d)]
        zero = [v for d, v in per_dir.items() if self.manifest.is_zero_shot(d)]
        out = {"valid_nll": sum(sup) / max(len(sup), 1)}
        if zero:
            out["valid_zero_shot_nll"] = sum(zero) / len(zero)
        record = {"step": step, **out, "valid_by_direction": per_dir}
        if self.cfg.valid_decode_sentences:
            decoded = self._decode(model)
            out.update(decoded.pop("averages"))
            record.update(out, valid_decoding=decoded)
        engine.train()
        return out, record

    def _batches(self, direction: str, pad: int):
        """This rank's validation batches of ``direction``: its slice of every row, or with
        ``valid_max_sentences`` = N its share of the first N lines (every rank reads the
        direction, a dev set of a few thousand rows, and keeps lines in its own range)."""
        cfg, max_tokens, tag = self.cfg, self.stream_cfg.max_tokens, self.stream_cfg.add_lang_tag
        n = cfg.valid_max_sentences
        if not n:
            return eval_batches(cfg.data, self.split, direction, max_tokens, self.rank, self.world, tag)
        first, last = self.rank * n // self.world, (self.rank + 1) * n // self.world
        return lines_between(eval_batches(cfg.data, self.split, direction, max_tokens, 0, 1, tag),
                             first, last, pad, max_tokens)

    def _decode(self, model) -> dict:
        """Greedy translations of the first validation sentences of every direction on rank 0:
        BLEU and off-target rate over training show when (and whether) zero-shot collapses."""
        result = {"averages": {}}
        if self.rank == 0:
            from cll_scale.decoding import DecodeConfig
            from cll_scale.evaluate import evaluate_model, pairs_from_shards
            from cll_scale.translate import TranslateConfig, Translator
            tr = Translator(model, self.manifest, Path(self.cfg.data) / self.manifest.tokenizer.file,
                            TranslateConfig(DecodeConfig(beam=1)), lang_tag=self.stream_cfg.add_lang_tag)
            report = evaluate_model(tr, pairs_from_shards(self.cfg.data, self.split),
                                    max_sentences=self.cfg.valid_decode_sentences, log=lambda s: None)
            for kind, key in (("supervised", "valid_bleu"), ("zero-shot", "valid_zero_shot_bleu")):
                if kind in report["averages"]:
                    result["averages"][key] = report["averages"][kind]["bleu"]
            if "zero-shot" in report["averages"]:
                z = report["averages"]["zero-shot"]
                result["averages"]["valid_zero_shot_offtarget"] = z["off_target_restricted"]
                result["averages"]["valid_zero_shot_code_switch"] = z["code_switch"]
            result["by_direction"] = {d["direction"]: {k: d[k] for k in ("bleu", "off_target_restricted")}
                                      for d in report["directions"]}
        return ds.all_gather_object(result)[0]     # every rank logs the same numbers


def lines_between(batches, first: int, last: int, pad: int, max_tokens: int):
    """The rows of ``batches`` (from :func:`eval_batches`, length-sorted) whose corpus line
    (counted from 1) is in ``(first, last]``, regrouped into batches of at most ``max_tokens``
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
        if held and (rows + len(part)) * max(width, w) > max_tokens:
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
