"""A cll-scale model in transformers: ``AutoModelForSeq2SeqLM.from_pretrained(DIR, trust_remote_code=True)``.

The forward pass is cll-scale's CLL Transformer, op for op: tied embeddings scaled by sqrt(D) plus
fixed sinusoidal positions, pre- or post-norm layers, and in the decoder layers listed in
``config.cll_layers`` the FFN becomes (Qu & Watanabe 2022, Eq. 3)

    CLL_l(h) = FFN(h) + t_l * LSL_l(h),    LSL_l(h) = max(0, h W1_l + b1_l) W2_l + b2_l

for a non-central target language ``l`` (the central language keeps the plain FFN). ``l`` is the
sentence's *target* language: ``tgt_lang`` (B,), language ids in ``config.languages`` order. When it
is not given it is read from the source's first token, the ``<2xx>`` tag, for a model trained
with tags. ``use_lsl=False`` (or ``config.use_lsl``) switches every LSL off (the paper's ablation).

``generate`` ends each sentence as cll-translate does: by ``max_len_a * source length + max_len_b``
subwords (eos forced there) and not before ``min_len``; with ``num_beams`` 4, ``length_penalty``
1 and ``early_stopping=True`` (generation_config.json) beam search keeps the same best hypothesis.

Shapes: B batch, S source length, T target length, D model dim, R LSL inner size, L LSL languages.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.generation import LogitsProcessor, LogitsProcessorList
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from .configuration_cll import CLLConfig


# This file repeats cll_scale/model/model.py on purpose: a transformers user loads it without
# cll-scale installed. tests/test_hf_export.py holds the two to the same logits for every variant.
def sinusoidal_positions(n, d):
    """(n, d) fixed position encodings, computed as in training (the whole table at once)."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    inv = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(n, d)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv[: d // 2])
    return table


class Attention(nn.Module):
    """Multi-head attention; the key and value projections are one Linear (D -> 2D)."""

    def __init__(self, d, heads, dropout, cross, layer_idx):
        super().__init__()
        self.h, self.cross, self.dropout, self.layer_idx = heads, cross, dropout, layer_idx
        self.q, self.kv, self.out = nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)

    def _split(self, x):                                   # (B, N, D) -> (B, H, N, D/H)
        b, n, d = x.shape
        return x.view(b, n, self.h, d // self.h).transpose(1, 2)

    def forward(self, x, memory=None, mask=None, causal=False, cache=None):
        q = self._split(self.q(x))
        if self.cross and cache is not None and cache.is_updated.get(self.layer_idx):
            layer = cache.cross_attention_cache.layers[self.layer_idx]
            k, v = layer.keys, layer.values
        else:
            k, v = self.kv(x if memory is None else memory).chunk(2, dim=-1)
            k, v = self._split(k), self._split(v)
            if cache is not None and self.cross:
                k, v = cache.cross_attention_cache.update(k, v, self.layer_idx)
                cache.is_updated[self.layer_idx] = True
            elif cache is not None:
                k, v = cache.self_attention_cache.update(k, v, self.layer_idx)
        if causal and cache is not None:
            # One new position sees every cached key; several new ones see those before them.
            t, s = q.shape[2], k.shape[2]
            mask = None if t == 1 else torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
            causal = False
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        b, h, t, dh = y.shape
        return self.out(y.transpose(1, 2).reshape(b, t, h * dh))


class FeedForward(nn.Module):
    def __init__(self, d, inner, activation_dropout):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, inner), nn.Linear(inner, d)
        self.act_dropout = activation_dropout

    def forward(self, x):
        h = F.dropout(F.relu(self.fc1(x)), self.act_dropout, self.training)
        return self.fc2(h)


class CLLFeedForward(nn.Module):
    """FFN(h) + t_l * LSL_l(h) per row's LSL slot (-1: the central language, FFN alone). The LSLs
    of this layer are stacked over the L languages: w1 (L, R, D), b1 (L, R), w2 (L, D, R), b2 (L, D),
    t (L,)."""

    def __init__(self, config):
        super().__init__()
        d, r, n = config.d_model, config.lsl_dim, len(config.lsl_languages)
        self.ffn = FeedForward(d, config.ffn_dim, config.activation_dropout)
        self.lsl_w1, self.lsl_b1 = nn.Parameter(torch.zeros(n, r, d)), nn.Parameter(torch.zeros(n, r))
        self.lsl_w2, self.lsl_b2 = nn.Parameter(torch.zeros(n, d, r)), nn.Parameter(torch.zeros(n, d))
        self.lsl_t = nn.Parameter(torch.zeros(n))
        self.cll_dropout = config.cll_dropout
        self.ffn_dropout = config.dropout if config.lsl_dropout == "authors" else 0.0

    def lsl(self, x, slot):
        h = F.linear(F.relu(F.linear(x, self.lsl_w1[slot], self.lsl_b1[slot])), self.lsl_w2[slot], self.lsl_b2[slot])
        return self.lsl_t[slot:slot + 1] * F.dropout(h, self.cll_dropout, self.training)

    def forward(self, x, groups):
        """``groups``: (slot, rows) pairs, rows None for every row (see ``CLLModel.lang_groups``)."""
        out = F.dropout(self.ffn(x), self.ffn_dropout, self.training)              # (B, T, D)
        for slot, rows in groups:
            if slot < 0:
                continue
            if rows is None:
                out = out + self.lsl(x, slot)
            else:
                out = out.index_add(0, rows, self.lsl(x.index_select(0, rows), slot))
        return out


class EncoderLayer(nn.Module):
    def __init__(self, config, drop_residual):
        super().__init__()
        d = config.d_model
        self.self_attn = Attention(d, config.n_heads, config.attention_dropout, False, None)
        self.ffn = FeedForward(d, config.ffn_dim, config.activation_dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.pre_norm, self.dropout, self.drop_residual = config.pre_norm, config.dropout, drop_residual

    def _sublayer(self, x, fn, norm, residual):
        if self.pre_norm:
            y = F.dropout(fn(norm(x)), self.dropout, self.training)
            return x + y if residual else y
        y = F.dropout(fn(x), self.dropout, self.training)
        return norm(x + y if residual else y)

    def forward(self, x, mask):
        x = self._sublayer(x, lambda h: self.self_attn(h, mask=mask), self.norm1, self.drop_residual != "self_attn")
        return self._sublayer(x, self.ffn, self.norm2, self.drop_residual != "ffn")


class DecoderLayer(nn.Module):
    def __init__(self, config, idx):
        super().__init__()
        d = config.d_model
        self.self_attn = Attention(d, config.n_heads, config.attention_dropout, False, idx)
        self.cross_attn = Attention(d, config.n_heads, config.attention_dropout, True, idx)
        self.cll = idx in config.cll_layers
        self.ffn = CLLFeedForward(config) if self.cll else FeedForward(d, config.ffn_dim, config.activation_dropout)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.pre_norm, self.dropout = config.pre_norm, config.dropout
        self.ffn_dropout = 0.0 if self.cll and config.lsl_dropout == "authors" else config.dropout

    def _sublayer(self, x, fn, norm, p):
        if self.pre_norm:
            return x + F.dropout(fn(norm(x)), p, self.training)
        return norm(x + F.dropout(fn(x), p, self.training))

    def forward(self, x, enc_out, enc_mask, groups, cache):
        x = self._sublayer(x, lambda h: self.self_attn(h, causal=True, cache=cache), self.norm1, self.dropout)
        x = self._sublayer(x, lambda h: self.cross_attn(h, memory=enc_out, mask=enc_mask, cache=cache),
                           self.norm2, self.dropout)
        ffn = (lambda h: self.ffn(h, groups)) if self.cll else self.ffn
        return self._sublayer(x, ffn, self.norm3, self.ffn_dropout)


class LengthLimits(LogitsProcessor):
    """cll-translate's output lengths: no eos before ``min_len`` subwords, and eos alone at each
    sentence's limit (``limits`` (B,): at most limit - 1 subwords before eos). Its log-probability
    is kept (floored at -1e4) so that beam search still ranks the hypotheses it ends."""

    def __init__(self, limits, eos, min_len):
        self.limits, self.eos, self.min_len = limits, eos, min_len

    def __call__(self, input_ids, scores):
        t = input_ids.shape[1] - 1                          # subwords written so far (after the start token)
        scores = scores.clone()
        if t < self.min_len:
            scores[:, self.eos] = float("-inf")
        limits = self.limits.to(scores.device).repeat_interleave(scores.shape[0] // self.limits.shape[0])
        at_limit = (t + 1 >= limits)[:, None]               # (rows, 1)
        eos = scores[:, self.eos].clone()
        scores = scores.masked_fill(at_limit, float("-inf"))
        scores[:, self.eos] = torch.where(at_limit[:, 0], eos.clamp(min=-1e4), eos)
        return scores


class _Encoder:
    """The model's encoder as ``generate`` calls one (not a module: the weights are the model's)."""

    def __init__(self, model):
        self.model = model

    def forward(self, input_ids, attention_mask=None, **kwargs):
        return BaseModelOutput(last_hidden_state=self.model.encode(input_ids, attention_mask))

    __call__ = forward


class CLLPreTrainedModel(PreTrainedModel):
    config_class = CLLConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _supports_cache_class = True

    def _init_weights(self, module):
        # A fresh model only (an export's weights replace these): torch's own initialisations.
        if isinstance(module, (nn.Linear, nn.Embedding, nn.LayerNorm)):
            module.reset_parameters()
        elif isinstance(module, CLLFeedForward):
            for w in (module.lsl_w1, module.lsl_w2):
                nn.init.xavier_uniform_(w)
            for b in (module.lsl_b1, module.lsl_b2):
                nn.init.zeros_(b)
            nn.init.constant_(module.lsl_t, 0.1)


class CLLForConditionalGeneration(CLLPreTrainedModel, GenerationMixin):
    def __init__(self, config):
        super().__init__(config)
        d = config.d_model
        self.embed = nn.Embedding(config.vocab_size, d, padding_idx=config.pad_token_id)
        residual = config.residual_layer if config.residual_sublayer else None
        self.encoder_layers = nn.ModuleList(EncoderLayer(config, config.residual_sublayer if i == residual else None)
                                            for i in range(config.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.decoder_layers))
        self.enc_norm = nn.LayerNorm(d) if config.pre_norm else nn.Identity()
        self.dec_norm = nn.LayerNorm(d) if config.pre_norm else nn.Identity()
        # tgt_lang id -> LSL slot (-1: the central language); tag id -> tgt_lang id
        self._slots = [config.lsl_languages.index(x) if x in config.lsl_languages else -1 for x in config.languages]
        self._tag_langs = {int(config.lang_tag_ids[x]): i for i, x in enumerate(config.languages)
                           if x in config.lang_tag_ids}
        self._positions = {}            # device -> table: computed, not stored in the weights
        self.post_init()

    def get_input_embeddings(self):
        return self.embed

    def set_input_embeddings(self, value):
        self.embed = value

    def get_output_embeddings(self):
        return None                     # the output projection is the input embedding itself

    def get_encoder(self):
        return _Encoder(self)

    # -- the target language ----------------------------------------------------------------
    def lang_ids(self, codes):
        """Language codes -> the (B,) ``tgt_lang`` tensor that ``forward`` and ``generate`` take."""
        if isinstance(codes, str):
            codes = [codes]
        unknown = [c for c in codes if c not in self.config.languages]
        if unknown:
            raise ValueError(f"unknown target language(s) {unknown}; this model knows {self.config.languages}")
        return torch.tensor([self.config.languages.index(c) for c in codes], device=self.embed.weight.device)

    def target_languages(self, tgt_lang=None, input_ids=None, batch=None):
        """``tgt_lang`` as a (B,) tensor: given as ids, as codes or one code (for ``batch`` rows or
        those of ``input_ids``), or read from the tag that begins each row of ``input_ids``."""
        if torch.is_tensor(tgt_lang):
            return tgt_lang.to(self.embed.weight.device).long()
        if isinstance(tgt_lang, str):
            return self.lang_ids([tgt_lang] * (batch if input_ids is None else input_ids.shape[0]))
        if tgt_lang is not None:
            return self.lang_ids(list(tgt_lang))
        tags = [] if input_ids is None else input_ids[:, 0].tolist()
        if not tags or not self.config.lang_tag or any(t not in self._tag_langs for t in tags):
            raise ValueError("the target language cannot be read from the input (no <2xx> tag first): pass "
                             "tgt_lang, e.g. tgt_lang='de' or model.lang_ids(['de', ...])")
        return torch.tensor([self._tag_langs[t] for t in tags], device=input_ids.device)

    def lang_groups(self, tgt_lang):
        """(LSL slot, rows) pairs; rows None when every row has that slot. One host read per forward."""
        slots = torch.tensor(self._slots, device=tgt_lang.device)[tgt_lang]
        present = torch.unique(slots).tolist()
        if len(present) == 1:
            return [(present[0], None)]
        return [(s, (slots == s).nonzero().squeeze(1)) for s in present]

    # -- the forward pass ----------------------------------------------------------------
    def _embed(self, tokens, offset=0):
        n, cfg = tokens.shape[1], self.config
        if offset + n > cfg.max_positions:
            raise ValueError(f"sequence of {offset + n} tokens exceeds max_positions {cfg.max_positions}")
        device = self.embed.weight.device
        if device not in self._positions:
            self._positions[device] = sinusoidal_positions(cfg.max_positions, cfg.d_model).to(device)
        x = self.embed(tokens) * math.sqrt(cfg.d_model) + self._positions[device][offset:offset + n].to(
            self.embed.weight.dtype)
        return F.dropout(x, cfg.dropout, self.training)

    def encode(self, input_ids, attention_mask=None):
        """-> (B, S, D). Padding is told by ``attention_mask`` (else by the pad id)."""
        x = self._embed(input_ids)
        mask = self._key_mask(input_ids, attention_mask)
        for layer in self.encoder_layers:
            x = layer(x, mask)
        return self.enc_norm(x)

    def _key_mask(self, input_ids, attention_mask):
        if attention_mask is None:
            return (input_ids != self.config.pad_token_id)[:, None, None, :]
        return attention_mask.bool()[:, None, None, :]                 # (B, 1, 1, S)

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None, encoder_outputs=None,
                cache=None, use_cache=None, tgt_lang=None, use_lsl=None, labels=None, return_dict=None,
                **kwargs):
        if encoder_outputs is None:
            encoder_outputs = BaseModelOutput(last_hidden_state=self.encode(input_ids, attention_mask))
        enc_out = encoder_outputs[0]
        if attention_mask is None and input_ids is None:
            raise ValueError("pass attention_mask with encoder_outputs (the source's padding)")
        enc_mask = self._key_mask(input_ids, attention_mask)
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("pass decoder_input_ids or labels")
            decoder_input_ids = self._shift_right(labels)
        tgt_lang = self.target_languages(tgt_lang, input_ids, enc_out.shape[0])
        use_lsl = self.config.use_lsl if use_lsl is None else use_lsl
        groups = self.lang_groups(tgt_lang) if self.config.cll_layers and use_lsl else []
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        offset = cache.get_seq_length() if cache is not None else 0
        x = self._embed(decoder_input_ids, offset)
        for layer in self.decoder_layers:
            x = layer(x, enc_out, enc_mask, groups, cache)
        logits = F.linear(self.dec_norm(x), self.embed.weight)                  # (B, T, V), tied
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                   ignore_index=-100)
        return Seq2SeqLMOutput(loss=loss, logits=logits, cache=cache if use_cache else None,
                               encoder_last_hidden_state=enc_out)

    def _shift_right(self, labels):
        """Decoder input for teacher forcing: the start token, then the labels but their last
        (-100, the ignored positions, read as pad)."""
        start = torch.full_like(labels[:, :1], self.config.decoder_start_token_id)
        prev = labels[:, :-1].masked_fill(labels[:, :-1] == -100, self.config.pad_token_id)
        return torch.cat([start, prev], dim=1)

    # -- generation ----------------------------------------------------------------------
    def length_limits(self, attention_mask):
        """(B,) each sentence's longest output, eos included: a · source length + b (cll-translate's)."""
        cfg = self.config
        lengths = attention_mask.sum(-1).double()
        return (lengths * cfg.max_len_a + cfg.max_len_b).clamp(max=cfg.max_positions - 1).long()

    @torch.no_grad()
    def generate(self, input_ids=None, attention_mask=None, tgt_lang=None, use_lsl=None, logits_processor=None,
                 **kwargs):
        """``generate`` with the target language resolved (``tgt_lang``: ids, codes, one code, or
        read from the tags) and cll-translate's length limits added (``max_new_tokens`` is the
        longest limit unless given)."""
        if input_ids is None:
            raise ValueError("pass input_ids (the tokenizer's output)")
        if attention_mask is None:
            attention_mask = (input_ids != self.config.pad_token_id).long()
        tgt_lang = self.target_languages(tgt_lang, input_ids)
        limits = self.length_limits(attention_mask)
        processors = LogitsProcessorList(logits_processor or [])
        processors.append(LengthLimits(limits, self.config.eos_token_id, self.config.min_len))
        kwargs.setdefault("max_new_tokens", int(limits.max()))
        return super().generate(input_ids=input_ids, attention_mask=attention_mask, tgt_lang=tgt_lang,
                                use_lsl=use_lsl, logits_processor=processors, **kwargs)
