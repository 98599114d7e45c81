"""Translation with an ``export/`` directory, no DeepSpeed: :class:`Translator`, used by cll-translate,
cll-eval, the validator, back-translation, the analyses and the demo alike.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm
import torch
import torch.nn.functional as F

from cll_scale.data.inputs import source_ids
from cll_scale.data.manifest import Manifest
from cll_scale.model.bf16 import matmul_mode
from cll_scale.model.decode_config import DecodeConfig
from cll_scale.model.decoding import beam_search
from cll_scale.model.export import export_lang_tag, load_export
from cll_scale.model.model import CLLTransformer

log = logging.getLogger(__name__)


class ModelStepper:
    """The model as a :class:`~cll_scale.model.decoding.Stepper`.

    Per-row state (one row per live beam): the decoder's self-attention cache or prefix. Per
    sentence: the encoder output, its mask, the cross-attention keys and the target language.
    ``row_sent`` maps rows to sentences; while rows stay grouped sentence by sentence (as beam
    search keeps them) the beams share their sentence's encoder state, which is then only
    narrowed when sentences finish, instead of copied for every beam at every step."""

    def __init__(self, model: CLLTransformer, src_tokens: torch.Tensor, tgt_lang: torch.Tensor,
                 use_lsl: bool = True, use_cache: bool = True):
        self.model, self.use_lsl = model, use_lsl
        self.enc_out, self.enc_mask = model.encode(src_tokens)      # (B_s, S, D), (B_s, 1, 1, S)
        self.sent_lang = tgt_lang                                    # (B_s,)
        self.row_sent = torch.arange(len(tgt_lang), device=tgt_lang.device)
        self.cache = model.new_cache() if use_cache else None
        self.prefix: torch.Tensor | None = None
        self._set_rows()

    def step(self, prev_tokens: torch.Tensor, t: int) -> torch.Tensor:
        if self.cache is not None:
            logits = self.model.decode(prev_tokens, self.enc_out, self.enc_mask, self.tgt_lang,
                                       cache=self.cache, offset=t, use_lsl=self.use_lsl, groups=self.groups)
        else:   # recompute the whole prefix: the reference that cached decoding must equal
            self.prefix = prev_tokens if self.prefix is None else torch.cat([self.prefix, prev_tokens], 1)
            logits = self.model.decode(self.prefix, self.enc_out, self.enc_mask, self.tgt_lang,
                                       use_lsl=self.use_lsl, groups=self.groups)
        return F.log_softmax(logits[:, -1].float(), dim=-1)

    def reorder_beams(self, index: torch.Tensor) -> None:
        """Beam search's per-step reorder: rows stay with their sentence, so only the per-row
        state moves (no host read)."""
        if self.prefix is not None:
            self.prefix = self.prefix.index_select(0, index)
        for layer in self.cache or []:
            for key in list(layer["self"]):
                layer["self"][key] = layer["self"][key].index_select(0, index)

    def reorder(self, index: torch.Tensor) -> None:
        self.row_sent = self.row_sent.index_select(0, index)
        sents = torch.unique_consecutive(self.row_sent)
        g = len(index) // len(sents)
        if g * len(sents) == len(index) and torch.equal(self.row_sent, sents.repeat_interleave(g)):
            first = torch.arange(len(sents), device=index.device)
            if len(sents) != len(self.sent_lang) or not torch.equal(sents, first):
                self._narrow(sents)                  # sentences finished (or were repeated)
            self.row_sent = first.repeat_interleave(g)
        else:                                        # any other order: encoder state per row
            self._narrow(self.row_sent)
            self.row_sent = torch.arange(len(index), device=index.device)
        self.reorder_beams(index)
        self._set_rows()

    def _narrow(self, sents: torch.Tensor) -> None:
        self.enc_out = self.enc_out.index_select(0, sents)
        self.enc_mask = self.enc_mask.index_select(0, sents)
        self.sent_lang = self.sent_lang.index_select(0, sents)
        for layer in self.cache or []:
            for key in list(layer["cross"]):
                layer["cross"][key] = layer["cross"][key].index_select(0, sents)

    def _set_rows(self) -> None:
        self.tgt_lang = self.sent_lang.index_select(0, self.row_sent)
        self.groups = self.model.lang_groups(self.tgt_lang)     # once per reorder, not per layer call


@dataclass
class TranslateConfig:
    decode: DecodeConfig
    beam_tokens: int = 0            # source tokens × beam per batch; 0: by device (CPU 6,000,
                                    # GPU 96,000: a GPU step costs about the same for 64 or 1,024 rows)
    max_sentences: int = 0          # 0: by device (CPU 64, GPU 1,024)
    max_src_tokens: int = 0         # 0: the shards' max_length; longer input is truncated
    dtype: str = "auto"             # auto: bf16 on CUDA, fp32 elsewhere; or "bf16" / "fp32"

    def __post_init__(self):
        if self.dtype not in ("auto", "bf16", "fp32"):
            raise ValueError(f"dtype must be auto, bf16 or fp32, not {self.dtype!r}")
        if min(self.beam_tokens, self.max_sentences, self.max_src_tokens) < 0:
            raise ValueError("beam_tokens, max_sentences and max_src_tokens must be >= 0")

    def resolved(self, device: torch.device) -> "TranslateConfig":
        """The device's batch sizes and precision in place of the ``0`` / ``auto`` defaults."""
        gpu = device.type == "cuda"
        return TranslateConfig(self.decode, self.beam_tokens or (96_000 if gpu else 6_000),
                               self.max_sentences or (1024 if gpu else 64), self.max_src_tokens,
                               "bf16" if self.dtype == "auto" and gpu else "fp32" if self.dtype == "auto" else self.dtype)


def check_beam(beam: int, vocab_size: int, flag: str = "--beam") -> None:
    """A beam wider than the vocabulary keeps nothing more at the first step, and its scores
    (beam x vocabulary a sentence) would fill the memory of a huge --beam instead of failing.
    ``flag``: the beam's name in the command that checks it (cll-bt's ``--eval-beam``)."""
    if beam > vocab_size:
        raise ValueError(f"{flag} {beam:,} exceeds this model's vocabulary ({vocab_size:,} subwords): a beam "
                         f"keeps at most one hypothesis a subword at the first step")


class Translator:
    """Load an export and translate lists of sentences; outputs come back in input order."""

    def __init__(self, model: CLLTransformer, manifest: Manifest, spm_path: str | Path,
                 cfg: TranslateConfig | None = None, lang_tag: bool = True):
        """Wrap a model in memory as it is (e.g. during training, for validation decoding); it
        decodes on the device and in the precision its parameters have. ``lang_tag``: whether the
        model was trained with the target-language tag before the source (``data.add_lang_tag``):
        inputs are encoded as it was trained."""
        first = next(model.parameters())
        self.model, self.manifest, self.device = model, manifest, first.device
        # the parameters' precision; bf16 on a CPU without bf16 units decodes with its matmuls in
        # fp32 (cll_scale.model.bf16.matmul_mode)
        self.param_dtype = "bf16" if first.dtype == torch.bfloat16 else "fp32"
        self.lang_tag = lang_tag
        self.cfg = (cfg or TranslateConfig(DecodeConfig())).resolved(self.device)
        self.sp = spm.SentencePieceProcessor(model_file=str(spm_path))
        tok = self.manifest.tokenizer
        self.pad, self.bos, self.eos = tok.pad_id, tok.bos_id, tok.eos_id
        limit = self.cfg.max_src_tokens or self.manifest.max_length
        self.max_src = min(limit, self.model.cfg.max_positions - 2)
        longest = self.model.cfg.max_positions - 1      # outputs are cut there, whatever a and b say
        if self.cfg.decode.min_len > longest:
            raise ValueError(f"--min-len {self.cfg.decode.min_len} exceeds the longest output this model can "
                             f"write ({longest} subwords, its max_positions - 1); it would be ignored")
        check_beam(self.cfg.decode.beam, self.model.cfg.vocab_size)

    @classmethod
    def load(cls, export_dir: str | Path, device: str | torch.device = "cpu",
             cfg: TranslateConfig | None = None) -> "Translator":
        """Load an ``export/`` onto ``device``, in the precision ``cfg.dtype`` resolves to there:
        bf16 on a GPU halves the memory traffic of fp32 for the same outputs up to rounding (the
        log-softmax over the vocabulary is still taken in fp32, :class:`ModelStepper`)."""
        device = torch.device(device)
        dtype = (cfg or TranslateConfig(DecodeConfig())).resolved(device).dtype
        model, manifest = load_export(export_dir, device)
        model = model.to({"bf16": torch.bfloat16, "fp32": torch.float32}[dtype])
        return cls(model, manifest, Path(export_dir) / "spm.model", cfg, export_lang_tag(export_dir))

    @property
    def languages(self) -> list[str]:
        return list(self.manifest.languages)

    def check_language(self, code: str) -> int:
        if code not in self.manifest.languages:
            raise ValueError(f"unknown language {code!r}; this model translates into "
                             f"{', '.join(self.manifest.languages)}")
        return self.manifest.languages.index(code)

    def check_omit_tag(self, omit_tag: bool) -> None:
        if omit_tag and not self.lang_tag:
            raise ValueError("this model was trained without language tags (data.add_lang_tag: false); "
                             "there is no tag to omit")

    @staticmethod
    def check_tags_to_omit(lang_tags: dict[str, bool]) -> None:
        """``--omit-lang-tag`` over several models (cll-eval, cll-analyze attention) adds the case
        of the tag omitted to each model trained with tags and says so of the others; where none
        was trained with tags it would add nothing at all, and is refused as for one model
        (:meth:`check_omit_tag`). ``lang_tags``: model name -> trained with tags."""
        if lang_tags and not any(lang_tags.values()):
            which = (f"the model {next(iter(lang_tags))} was trained without language tags" if len(lang_tags) == 1
                     else f"none of the models ({', '.join(lang_tags)}) was trained with language tags")
            raise ValueError(f"--omit-lang-tag: {which} (data.add_lang_tag: false); there is no tag to omit")

    def encode(self, text: str, tgt: str, omit_tag: bool = False) -> list[int]:
        """Source ids as the model was trained: ``<tgt> source </s>``, or ``source </s>`` for a
        model trained without tags. ``omit_tag`` drops the tag of a model trained with it (paper
        Table 8: the tag removed at test time)."""
        self.check_omit_tag(omit_tag)
        return self._encode(text, tgt, self.lang_tag and not omit_tag)

    def _encode(self, text: str, tgt: str, tag: bool) -> list[int]:
        ids = self.sp.encode(text)
        if len(ids) > self.max_src:
            # ascii(): the user's bytes (escape sequences, control characters) never reach the terminal raw
            log.warning("input of %d subwords truncated to %d: %s...", len(ids), self.max_src, ascii(text[:60]))
            ids = ids[:self.max_src]
        return source_ids(ids, self.eos, self.manifest.tokenizer.lang_tag_ids[tgt] if tag else None)

    @torch.no_grad()
    def translate(self, sentences: list[str], tgt_lang: str | list[str], use_lsl: bool = True,
                  use_cache: bool = True, n_best: int = 1, progress=None, omit_tag: bool = False
                  ) -> list[str] | list[list[str]]:
        """Translate ``sentences`` into ``tgt_lang`` (one code, or one per sentence). Empty or
        blank input gives empty output without running the model. ``progress(n)`` is told of
        every n sentences done. ``omit_tag``: see :meth:`encode`."""
        self.check_omit_tag(omit_tag)
        tgts = [tgt_lang] * len(sentences) if isinstance(tgt_lang, str) else list(tgt_lang)
        if len(tgts) != len(sentences):
            raise ValueError(f"{len(sentences)} sentences but {len(tgts)} target languages")
        lang_ids = [self.check_language(t) for t in tgts]
        texts = [s.strip() if isinstance(s, str) else "" for s in sentences]
        results: list = [[""] * n_best if n_best > 1 else "" for _ in texts]
        todo = [i for i, s in enumerate(texts) if s]
        tag = self.lang_tag and not omit_tag
        encoded = {i: self._encode(texts[i], tgts[i], tag) for i in todo}
        todo.sort(key=lambda i: len(encoded[i]))
        for batch in self._batches(todo, encoded):
            with matmul_mode(self.param_dtype, self.device):
                hyps = self._translate_batch([encoded[i] for i in batch], [lang_ids[i] for i in batch],
                                             use_lsl, use_cache)
            for i, h in zip(batch, hyps):
                outs = [self.sp.decode(x.tokens) for x in h[:n_best]] or [""]
                results[i] = outs if n_best > 1 else outs[0]
            if progress:
                progress(len(batch))
        if progress and len(todo) < len(texts):
            progress(len(texts) - len(todo))
        return results

    def _batches(self, order: list[int], encoded: dict[int, list[int]]):
        batch: list[int] = []
        for i in order:     # ascending length: the newest sentence is the batch's longest
            longest = len(encoded[i])
            if batch and ((len(batch) + 1) * longest * self.cfg.decode.beam > self.cfg.beam_tokens
                          or len(batch) >= self.cfg.max_sentences):
                yield batch
                batch = []
            batch.append(i)
        if batch:
            yield batch

    def _translate_batch(self, rows: list[list[int]], lang_ids: list[int], use_lsl: bool, use_cache: bool):
        width = max(map(len, rows))
        src = torch.full((len(rows), width), self.pad, dtype=torch.long)
        for r, ids in enumerate(rows):
            src[r, :len(ids)] = torch.tensor(ids)
        src = src.to(self.device)
        lengths = torch.tensor([len(r) for r in rows], device=self.device)
        d = self.cfg.decode
        # Clamped before the cast: a * length + b beyond int64 (--max-len-a 1e19) would wrap to a
        # negative length, i.e. an empty output.
        max_lens = (lengths.double() * d.max_len_a + d.max_len_b).clamp(max=self.model.cfg.max_positions - 1).long()
        # Decided from the host's row lengths: reading max_lens here would stall a GPU every batch.
        shortest = min(int(min(map(len, rows)) * d.max_len_a + d.max_len_b), self.model.cfg.max_positions - 1)
        if d.min_len > shortest:
            log.warning("--min-len %d exceeds the longest output allowed for some sentences (a · source length "
                        "+ b, at most %d here): those outputs stop at that length", d.min_len, shortest)
        stepper = ModelStepper(self.model, src, torch.tensor(lang_ids, device=self.device), use_lsl, use_cache)
        return beam_search(stepper, len(rows), max_lens, self.bos, self.eos, d, self.device)
