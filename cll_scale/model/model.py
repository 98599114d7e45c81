"""The CLL Transformer: plain single-device PyTorch (no DeepSpeed here), read bottom-up.

Shapes: ``B`` batch, ``S`` source length, ``T`` target length, ``D`` model dim, ``H`` heads,
``F`` FFN inner size, ``R`` LSL inner size, ``V`` vocabulary, ``L`` languages with an LSL.

Paper (Qu & Watanabe 2022), Eq. (3): in a decoder layer with CLL the FFN becomes
``CLL_l(h) = FFN(h) + t_l · LSL_l(h)`` for a non-central target language ``l`` and ``FFN(h)``
for the central one, with ``LSL_l(h) = max(0, h W1_l + b1_l) W2_l + b2_l``.

LSL storage: one Parameter per language (all its CLL layers), not a stacked ``[L, D, R]`` tensor.
Freezing the old languages when a new one is added (paper §4.4) is then ``requires_grad=False``
instead of gradient masks, and adding a language appends a Parameter. A language absent from a
step is not left out of the update, though. With several ranks and mixed batches the trainer adds
:meth:`CLLTransformer.lsl_zero` to the loss (``Run.touch_lsls``), so every rank gives every LSL a
gradient (zeros for an absent language) and fills the same ZeRO-2 reduction buckets. On one rank
an absent language's ``grad`` stays ``None``, but ZeRO-2 (every ``ds_configs/*.json``) steps flat
partitions that hold every parameter, with zeros in its place. Either way AdamW moves it by its
moments (and by weight decay where ``optim.weight_decay`` is set); only plain AdamW without ZeRO,
on one rank, leaves it untouched.
The speed is the same: a language-homogeneous batch does one matmul either way
(``bench/bench_model.py`` measures both).
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from cll_scale.model.config import ModelConfig


def sinusoidal_positions(n: int, d: int) -> torch.Tensor:
    """(n, d) fixed position encodings (Vaswani et al. 2017)."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    inv = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(n, d)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv[: d // 2])
    return table


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout that takes four elements' random numbers from one 64-bit draw.

    On the CPU the random numbers are the costliest part of dropout: ``F.dropout``'s
    ``bernoulli_`` was ~10% of a training step. A draw in ``[0, 2**63 - 1)`` has 63 uniform bits,
    so each of its four 16-bit fields has 15 uniform low bits: the keep probability is exact to
    1/32768, and a step draws a quarter as many numbers as elements (issue 54: the mask of a
    4,096 × 1,024 activation in about 15 ms against 29 with a 32-bit draw per two elements, 2
    threads). ``randint``, unlike ``random_``, lets ``torch.compile`` trace it.
    A GPU takes ``F.dropout`` (one fused kernel).
    """
    if not training or p <= 0.0:
        return x
    if x.device.type != "cpu" or x.numel() % 4:
        return F.dropout(x, p, True)
    bits = torch.randint(0, 2 ** 63 - 1, (x.numel() // 4,), dtype=torch.int64, device=x.device)
    keep = (bits.view(torch.int16).view(x.shape) & 0x7FFF) >= round(p * 32768)
    # where(): the kept values scaled once in the op's own precision (a bf16 mask of 1/(1-p) would
    # round the scale itself: 1.109 for 1.111), with no cast of the mask; forward and backward
    # about 1.15x as fast as x * keep * scale on bf16 FFN activations.
    return torch.where(keep, x * (1.0 / (1.0 - p)), 0.0)


def attention_kernel(q: torch.Tensor) -> contextlib.AbstractContextManager:
    """The attention kernel for a training pass. On a CPU in bf16 the flash kernel's backward took
    a quarter of the `small` step (26% of its self time, issue 54's profile: ``bench_model.py
    --only profile``) and the math kernel trains the whole step about 1.15x as fast; elsewhere
    (fp32 on a CPU, a GPU, and inference) PyTorch's own choice is kept."""
    if q.device.type == "cpu" and q.dtype == torch.bfloat16 and torch.is_grad_enabled():
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()


class Attention(nn.Module):
    """Multi-head attention on ``F.scaled_dot_product_attention``, with an optional cache for
    incremental decoding (self-attention appends keys; cross-attention computes them once).

    Cross-attention memory may hold fewer rows than the queries: then the queries are G = B / B_m
    consecutive rows per memory row (the beams of one sentence), which attend to it together, so
    beam search keeps one copy of each sentence's encoder keys instead of one per beam."""

    def __init__(self, d: int, heads: int, dropout: float, cross: bool):
        super().__init__()
        self.h, self.cross, self.dropout = heads, cross, dropout
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, d)
        # Analyses only (cll-analyze attention, paper Fig. 3): when set, the weights are computed
        # explicitly and kept in ``weights`` (B, H, T, S); training and decoding keep the fused kernel.
        self.keep_weights = False
        self.weights: torch.Tensor | None = None

    def _split(self, x: torch.Tensor) -> torch.Tensor:      # (B, N, D) -> (B, H, N, D/H)
        b, n, d = x.shape
        return x.view(b, n, self.h, d // self.h).transpose(1, 2)

    def forward(self, x, memory=None, mask=None, causal=False, cache: dict | None = None):
        q = self._split(self.q(x))                                     # (B, H, T, D/H)
        if self.cross and cache is not None and "k" in cache:
            k, v = cache["k"], cache["v"]
        else:
            k, v = self.kv(x if memory is None else memory).chunk(2, dim=-1)
            k, v = self._split(k), self._split(v)
            if cache is not None:
                if not self.cross and "k" in cache:
                    k = torch.cat([cache["k"], k], dim=2)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
        # With a cache the new query is the last position: it may see every cached key.
        causal = causal and cache is None
        b, h, t, dh = q.shape
        g = b // k.shape[0]
        if g > 1:       # (B_m*G, H, T, dh) -> (B_m, H, G*T, dh): a sentence's beams as more queries
            q = q.view(k.shape[0], g, h, t, dh).transpose(1, 2).reshape(k.shape[0], h, g * t, dh)
        if self.keep_weights:
            y = self._attend_keeping_weights(q, k, v, mask, causal)
        else:
            with attention_kernel(q):
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                   dropout_p=self.dropout if self.training else 0.0)
        if g > 1:
            y = y.view(k.shape[0], h, g, t, dh).transpose(1, 2).reshape(b, h, t, dh)
        return self.out(y.transpose(1, 2).reshape(b, t, h * dh))

    def _attend_keeping_weights(self, q, k, v, mask, causal: bool) -> torch.Tensor:
        """What ``scaled_dot_product_attention`` computes (without dropout), with the weights kept."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])           # (B, H, T, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        if causal:
            t, s = scores.shape[-2:]
            scores = scores.masked_fill(torch.ones(t, s, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        weights = scores.float().softmax(-1)
        self.weights = weights.detach()
        return weights.to(v.dtype) @ v


class FeedForward(nn.Module):
    def __init__(self, d: int, inner: int, activation_dropout: float):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, inner), nn.Linear(inner, d)
        self.act_dropout = activation_dropout

    def forward(self, x):
        h = F.relu(self.fc1(x))
        h = dropout(h, self.act_dropout, self.training)
        return self.fc2(h)


@dataclass
class LangGroups:
    """Which LSL each sentence uses, computed once per forward and reused by every CLL layer.

    ``slots`` lists (lsl slot or -1 for the central language, start, end) over the rows in
    ``order``; ``order`` is None when rows already come grouped (always so in training: a
    microbatch has one target language, or its rows come ordered by target language)."""

    groups: list[tuple[int, int, int]]
    order: torch.Tensor | None = None
    inverse: torch.Tensor | None = None
    # slot -> per CLL layer (w1, b1, w2, b2, t): views into that language's one Parameter, taken
    # by the model for the slots present (CLLTransformer.lsl_views)
    weights: dict[int, list[tuple[torch.Tensor, ...]]] = field(default_factory=dict)
    # For a batch with several LSL languages, on the device: each LSL row's group among them
    # (B_l,) and each group's end row (G,) (:meth:`index_lsl_rows`)
    row_group: torch.Tensor | None = None
    group_ends: torch.Tensor | None = None

    def index_lsl_rows(self, slots: torch.Tensor) -> None:
        """``slots``: the LSL slot of each LSL row, rows grouped. Device ops only (no host read,
        no copy from the host), once per forward: a row's group is the number of slot changes
        before it, a group's end the first row of the next."""
        n = sum(1 for slot, _, _ in self.groups if slot >= 0)
        change = (slots[1:] != slots[:-1]).long()
        self.row_group = torch.cat([change.new_zeros(1), change.cumsum(0)])
        self.group_ends = torch.searchsorted(self.row_group, torch.arange(1, n + 1, device=slots.device))

    @classmethod
    def from_slots(cls, slots: torch.Tensor) -> "LangGroups":
        b = slots.shape[0]
        lo, hi = torch.aminmax(slots)
        # Host reads per forward, never per sentence: the range here and, for a mixed batch, the
        # group sizes and the order check below.
        lo, hi = int(lo), int(hi)
        if lo == hi:
            return cls([(lo, 0, b)])
        order = torch.argsort(slots, stable=True)
        counts = torch.bincount(slots[order] + 1).tolist()
        groups, start = [], 0
        for slot, n in enumerate(counts, start=-1):
            if n:
                groups.append((slot, start, start + n))
                start += n
        if torch.equal(order, torch.arange(b, device=slots.device)):
            return cls(groups)
        return cls(groups, order, torch.argsort(order))


def grouped_mm_runs(x: torch.Tensor) -> bool:
    """Whether ``F.grouped_mm`` takes ``x``: torch >= 2.8 has it (setup.py allows older builds),
    on a CPU in any precision, on a GPU in bf16 from compute capability 8.0 (its kernels' bound)."""
    if not hasattr(F, "grouped_mm"):
        return False
    if x.device.type == "cpu":
        return True
    if x.device.type != "cuda" or x.dtype != torch.bfloat16:
        return False
    # Without a CUDA runtime a cuda tensor is a fake one (tests/test_fake_cuda.py checks the GPU
    # path on a CPU): it takes the choice of the GPUs this project trains on (H100, H200).
    return not torch.cuda.is_available() or torch.cuda.get_device_capability(x.device) >= (8, 0)


class CLLFeedForward(nn.Module):
    """Paper Eq. (3): ``dropout(FFN(h)) + t_l · cll_dropout(LSL_l(h))``; the central language
    gets ``dropout(FFN(h))``. Each path gets its own dropout once, before the sum, as in the
    authors' code (``lsl_dropout: authors``). The rule before issue 34 (``double``) returned
    the sum undropped and the decoder layer dropped it again, so the LSL path was dropped twice
    (1 - 0.7² = 51% of it under the ``paper`` settings, against the authors' 30%).

    The LSL weights are not this module's: each language keeps all of its layers' LSLs in one
    Parameter (:attr:`CLLTransformer.lsl`), and ``groups.weights`` hands this layer its views."""

    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_dim, cfg.activation_dropout)
        self.cll_dropout = cfg.cll_dropout
        # the FFN path's own dropout, applied here under the authors' rule (the layer's otherwise)
        self.ffn_dropout = cfg.dropout if cfg.lsl_dropout == "authors" else 0.0
        self.index = index                  # position among the CLL layers
        # The outputs of the LSL's two linear layers, as modules a hook can reach (layer
        # attribution, paper Fig. 5: cll_scale/analysis/attribution.py); identities otherwise.
        self.lsl1, self.lsl2 = nn.Identity(), nn.Identity()

    def lsl(self, x: torch.Tensor, weights: tuple[torch.Tensor, ...]) -> torch.Tensor:
        w1, b1, w2, b2, t = weights
        h = self.lsl2(F.linear(F.relu(self.lsl1(F.linear(x, w1, b1))), w2, b2))
        h = dropout(h, self.cll_dropout, self.training)
        return t * h

    def forward(self, x: torch.Tensor, groups: LangGroups | None, use_lsl: bool = True) -> torch.Tensor:
        out = dropout(self.ffn(x), self.ffn_dropout, self.training)    # (B, T, D)
        if groups is None or not use_lsl:
            return out
        if len(groups.groups) == 1:
            slot = groups.groups[0][0]
            return out if slot < 0 else out + self.lsl(x, groups.weights[slot][self.index])
        if groups.order is not None:            # rows not grouped (translation of mixed input)
            x, out = x.index_select(0, groups.order), out.index_select(0, groups.order)
        out = self._mixed(x, out, groups)
        return out if groups.inverse is None else out.index_select(0, groups.inverse)

    def _mixed(self, x: torch.Tensor, out: torch.Tensor, groups: LangGroups) -> torch.Tensor:
        """Rows grouped by language, the central language's first (slot -1 sorts lowest). The
        languages' LSL weights are stacked for this layer and each of the LSL's two linear layers
        is one grouped matmul over every LSL row (``F.grouped_mm``: each row block by its own
        language's weight); biases and t_l are gathered per row, and the element-wise rest (ReLU,
        dropout, t_l, the sum) runs once over every LSL row."""
        lsl = [groups.weights[slot][self.index] for slot, _, _ in groups.groups if slot >= 0]
        first = next(s for slot, s, _ in groups.groups if slot >= 0)    # rows before: the central language's
        if not grouped_mm_runs(x) or groups.row_group is None:
            return self._mixed_per_language(x, out, groups)
        w1, b1, w2, b2, t = (torch.stack(ws) for ws in zip(*lsl))       # (G, R, D) (G, R) (G, D, R) (G, D) (G, 1)
        rows, length = x.shape[0] - first, x.shape[1]
        offs = (groups.group_ends * length).to(torch.int32)              # each group's end, in tokens
        idx = groups.row_group                                           # (B_l,)
        h = F.grouped_mm(x[first:].reshape(rows * length, -1), w1.transpose(1, 2), offs=offs)
        h = F.relu(self.lsl1(h.view(rows, length, -1) + b1[idx][:, None]))          # (B_l, T, R)
        h = F.grouped_mm(h.reshape(rows * length, -1), w2.transpose(1, 2), offs=offs)
        h = self.lsl2(h.view(rows, length, -1) + b2[idx][:, None])                  # (B_l, T, D)
        h = t[idx].view(-1, *(1,) * (h.dim() - 1)) * dropout(h, self.cll_dropout, self.training)
        return torch.cat([out[:first], out[first:] + h]) if first else out + h

    def _mixed_per_language(self, x: torch.Tensor, out: torch.Tensor, groups: LangGroups) -> torch.Tensor:
        """:meth:`_mixed` where ``F.grouped_mm`` does not run: one matmul pair per language
        present, the element-wise rest once over every LSL row."""
        lsl = [(groups.weights[slot][self.index], s, e) for slot, s, e in groups.groups if slot >= 0]
        first = lsl[0][1]                       # rows before it are the central language's
        h = F.relu(self.lsl1(torch.cat([F.linear(x[s:e], w[0], w[1]) for w, s, e in lsl])))
        h = self.lsl2(torch.cat([F.linear(part, w[2], w[3])
                                 for part, (w, _, _) in zip(h.split([e - s for _, s, e in lsl]), lsl)]))
        t = torch.cat([w[4].expand(e - s) for w, s, e in lsl]).view(-1, *(1,) * (h.dim() - 1))
        h = t * dropout(h, self.cll_dropout, self.training)
        return torch.cat([out[:first], out[first:] + h]) if first else out + h


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, drop_residual: str | None):
        super().__init__()
        d = cfg.d_model
        self.self_attn = Attention(d, cfg.n_heads, cfg.attention_dropout, cross=False)
        self.ffn = FeedForward(d, cfg.ffn_dim, cfg.activation_dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.pre_norm, self.dropout = cfg.pre_norm, cfg.dropout
        # Liu et al. (2021): without this residual the encoder output is less tied to the
        # source positions, hence more language-agnostic (paper §3, "Residual" baseline).
        self.drop_residual = drop_residual

    def _sublayer(self, x, fn, norm, residual: bool):
        if self.pre_norm:
            y = dropout(fn(norm(x)), self.dropout, self.training)
            return x + y if residual else y
        y = dropout(fn(x), self.dropout, self.training)
        return norm(x + y if residual else y)

    def forward(self, x, mask):
        x = self._sublayer(x, lambda h: self.self_attn(h, mask=mask), self.norm1,
                           self.drop_residual != "self_attn")
        return self._sublayer(x, self.ffn, self.norm2, self.drop_residual != "ffn")


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, cll_index: int | None):
        super().__init__()
        d = cfg.d_model
        self.self_attn = Attention(d, cfg.n_heads, cfg.attention_dropout, cross=False)
        self.cross_attn = Attention(d, cfg.n_heads, cfg.attention_dropout, cross=True)
        self.cll = cll_index is not None
        self.ffn = CLLFeedForward(cfg, cll_index) if self.cll else FeedForward(d, cfg.ffn_dim, cfg.activation_dropout)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.pre_norm, self.dropout = cfg.pre_norm, cfg.dropout
        # Under the authors' rule a CLL sublayer drops its two paths itself (CLLFeedForward).
        self.ffn_dropout = 0.0 if self.cll and cfg.lsl_dropout == "authors" else cfg.dropout

    def _sublayer(self, x, fn, norm, p: float | None = None):
        p = self.dropout if p is None else p
        if self.pre_norm:
            return x + dropout(fn(norm(x)), p, self.training)
        return norm(x + dropout(fn(x), p, self.training))

    def forward(self, x, enc_out, enc_mask, groups, cache=None, use_lsl=True):
        x = self._sublayer(x, lambda h: self.self_attn(h, causal=True, cache=None if cache is None else cache["self"]),
                           self.norm1)
        x = self._sublayer(x, lambda h: self.cross_attn(h, memory=enc_out, mask=enc_mask,
                                                        cache=None if cache is None else cache["cross"]),
                           self.norm2)
        ffn = (lambda h: self.ffn(h, groups, use_lsl)) if self.cll else self.ffn
        return self._sublayer(x, ffn, self.norm3, self.ffn_dropout)


class CLLTransformer(nn.Module):
    """Encoder-decoder with tied embeddings/output projection and CLL in ``cfg.cll_layers``."""

    # The parameters that belong to one language, by name, for code that edits a trained model
    # (cll-extend grows the vocabulary and adds a language's LSLs): the shared embedding (input
    # and output, tied) and each LSL language's one Parameter holding its LSLs and t of every layer.
    EMBEDDING = "embed.weight"

    @staticmethod
    def lsl_name(slot: int) -> str:
        """The Parameter of the LSL language in ``slot`` (``cfg.lsl_languages`` order)."""
        return f"lsl.{slot}"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size, d, padding_idx=cfg.pad_id)
        nn.init.normal_(self.embed.weight, 0.0, d ** -0.5)
        with torch.no_grad():
            self.embed.weight[cfg.pad_id].zero_()
        self.register_buffer("positions", sinusoidal_positions(cfg.max_positions, d), persistent=False)
        self.encoder = nn.ModuleList(
            EncoderLayer(cfg, cfg.residual_sublayer if i == cfg.residual_layer else None)
            for i in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg, cfg.cll_layers.index(i) if i in cfg.cll_layers else None)
                                     for i in range(cfg.decoder_layers))
        # One Parameter per non-central language holding its LSL (w1, b1, w2, b2, t) of every CLL
        # layer: the engine handles one tensor per language instead of five per language and layer
        # (its per-tensor Python work made FCLL with 99 languages measurably slower than the
        # Baseline). An absent language still gets a zero gradient (touch_lsls, several ranks) or a
        # zero slot in ZeRO-2's flat partition (one rank), so AdamW's moments still move it.
        d, r = cfg.d_model, cfg.lsl_dim
        self._lsl_shapes = [(r, d), (r,), (d, r), (d,), (1,)]
        per_layer = sum(math.prod(shape) for shape in self._lsl_shapes)
        n_layers = len(cfg.cll_layers)
        self.lsl = nn.ParameterList(nn.Parameter(torch.zeros(n_layers * per_layer)) for _ in cfg.lsl_languages
                                    if n_layers)
        with torch.no_grad():
            for slot in range(len(self.lsl)):
                for w1, _, w2, _, t in self.lsl_views(slot):
                    nn.init.xavier_uniform_(w1)
                    nn.init.xavier_uniform_(w2)
                    t.fill_(cfg.t_init)
        if cfg.init == "xavier":
            self._xavier_init()
        self._register_load_state_dict_pre_hook(_read_old_layouts)
        self.enc_norm = nn.LayerNorm(d) if cfg.pre_norm else nn.Identity()
        self.dec_norm = nn.LayerNorm(d) if cfg.pre_norm else nn.Identity()
        # tgt_lang id (manifest order) -> LSL slot, -1 for the central language.
        slots = [cfg.lsl_languages.index(x) if x in cfg.lsl_languages else -1 for x in cfg.languages]
        self.register_buffer("lang_slot", torch.tensor(slots or [-1], dtype=torch.long), persistent=False)
        self._host_slots = slots

    @torch.no_grad()
    def _xavier_init(self) -> None:
        """fairseq's Transformer init (the paper's code): Xavier-uniform Linear weights with zero
        biases; query, key and value projections with gain 1/√2 (fairseq scales them so, as they
        are three projections of one input). Our fused key/value weight gets it per half."""
        for module in self.modules():
            if isinstance(module, Attention):
                nn.init.xavier_uniform_(module.q.weight, gain=2 ** -0.5)
                for half in module.kv.weight.chunk(2, dim=0):
                    nn.init.xavier_uniform_(half, gain=2 ** -0.5)
                nn.init.xavier_uniform_(module.out.weight)
                for linear in (module.q, module.kv, module.out):
                    nn.init.zeros_(linear.bias)
            elif isinstance(module, FeedForward):
                for linear in (module.fc1, module.fc2):
                    nn.init.xavier_uniform_(linear.weight)
                    nn.init.zeros_(linear.bias)

    def compile_blocks(self, backend: str = "inductor") -> None:
        """``torch.compile`` per block, as torchtitan does: each encoder layer, and in each decoder
        layer the attentions, the FFN and the LSL arithmetic, which see only tensors. The language
        routing (:class:`LangGroups`, host ints) stays eager, so a new target language never
        recompiles. ``dynamic=True`` traces batch and length symbolically: token-budget batches
        of every shape share one graph instead of one compile per shape. Parameter names and the
        state dict are unchanged."""
        for layer in self.encoder:
            layer.compile(backend=backend, dynamic=True)
        for layer in self.decoder:
            layer.self_attn.compile(backend=backend, dynamic=True)
            layer.cross_attn.compile(backend=backend, dynamic=True)
            inner = layer.ffn.ffn if layer.cll else layer.ffn
            inner.compile(backend=backend, dynamic=True)
            if layer.cll:
                layer.ffn.lsl = torch.compile(layer.ffn.lsl, backend=backend, dynamic=True)

    # -- pieces (also used by incremental decoding) ------------------------------------------
    def _embed(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        n = tokens.shape[1]
        if offset + n > self.cfg.max_positions:
            raise ValueError(f"sequence of {offset + n} tokens exceeds max_positions {self.cfg.max_positions}")
        x = self.embed(tokens) * math.sqrt(self.cfg.d_model) + self.positions[offset:offset + n].to(self.embed.weight.dtype)
        return dropout(x, self.cfg.dropout, self.training)

    def encode(self, src_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> enc_out (B, S, D) and the key mask (B, 1, 1, S), True where a real token is."""
        mask = (src_tokens != self.cfg.pad_id)[:, None, None, :]
        x = self._embed(src_tokens)
        for layer in self.encoder:
            x = layer(x, mask)
        return self.enc_norm(x), mask

    def lang_groups(self, tgt_lang: torch.Tensor, lang_runs: Sequence[tuple[int, int]] | None = None
                    ) -> LangGroups | None:
        """``lang_runs``: (target language, rows) runs in row order, when the caller knows them on
        the host (training and validation batches, ``Batch.lang_runs``): then no device value is
        read, provided the runs come in LSL order (the stream orders mixed batches so)."""
        if not self.cfg.cll_layers:
            return None
        groups = self._host_groups(lang_runs) if lang_runs is not None else None
        if groups is None:
            groups = LangGroups.from_slots(self.lang_slot[tgt_lang])
        groups.weights = {slot: self.lsl_views(slot) for slot, _, _ in groups.groups if slot >= 0}
        if len(groups.weights) > 1:
            slots = self.lang_slot[tgt_lang] if groups.order is None else self.lang_slot[tgt_lang[groups.order]]
            groups.index_lsl_rows(slots[next(s for slot, s, _ in groups.groups if slot >= 0):])
        return groups

    def _host_groups(self, lang_runs: Sequence[tuple[int, int]]) -> LangGroups | None:
        """Groups from host runs; None when their slots are out of order (then sorted on the device)."""
        groups, start = [], 0
        for lang, n in lang_runs:
            slot = self._host_slots[lang]
            if groups and groups[-1][0] == slot:
                groups[-1] = (slot, groups[-1][1], start + n)
            elif groups and groups[-1][0] > slot:
                return None
            else:
                groups.append((slot, start, start + n))
            start += n
        return LangGroups(groups)

    def lsl_views(self, slot: int) -> list[tuple[torch.Tensor, ...]]:
        """(w1 (R, D), b1 (R,), w2 (D, R), b2 (D,), t (1,)) of LSL ``slot`` for each CLL layer, as
        views of its Parameter (taken per forward: an engine may move the Parameter's storage)."""
        shapes, k = self._lsl_shapes * len(self.cfg.cll_layers), len(self._lsl_shapes)
        views = [c.view(shape) for c, shape in zip(self.lsl[slot].split([math.prod(x) for x in shapes]), shapes)]
        return [tuple(views[i:i + k]) for i in range(0, len(views), k)]

    def decode(self, prev_tokens, enc_out, enc_mask, tgt_lang, cache: list | None = None, offset: int = 0,
               use_lsl: bool = True, groups: LangGroups | None = None, features_only: bool = False
               ) -> torch.Tensor:
        """-> logits (B, T, V), or with ``features_only`` the decoder's output features (B, T, D)
        before the tied output projection (:func:`projected_loss` takes them). With ``cache`` (from
        :meth:`new_cache`), ``prev_tokens`` are the newest positions starting at ``offset``."""
        groups = groups if groups is not None else self.lang_groups(tgt_lang)
        x = self._embed(prev_tokens, offset)
        for i, layer in enumerate(self.decoder):
            x = layer(x, enc_out, enc_mask, groups, None if cache is None else cache[i], use_lsl)
        x = self.dec_norm(x)
        return x if features_only else F.linear(x, self.embed.weight)       # (B, T, V), tied weights

    def components(self) -> dict[tuple[int, str], nn.Module]:
        """(decoder layer, name) -> the module whose output is that component, for hooks: ``ffn1``
        and ``ffn2`` (the FFN's two linear layers, before the ReLU and after), and in CLL layers
        ``lsl1`` and ``lsl2`` (the LSL's two, before t_l and dropout). Paper Fig. 5's components."""
        out = {}
        for i, layer in enumerate(self.decoder):
            ffn = layer.ffn.ffn if layer.cll else layer.ffn
            out[i, "ffn1"], out[i, "ffn2"] = ffn.fc1, ffn.fc2
            if layer.cll:
                out[i, "lsl1"], out[i, "lsl2"] = layer.ffn.lsl1, layer.ffn.lsl2
        return out

    def attentions(self) -> dict[tuple[str, int], Attention]:
        """("encoder" | "decoder" | "cross", layer) -> its attention module."""
        out: dict[tuple[str, int], Attention] = {("encoder", i): layer.self_attn for i, layer in enumerate(self.encoder)}
        for i, layer in enumerate(self.decoder):
            out["decoder", i], out["cross", i] = layer.self_attn, layer.cross_attn
        return out

    def new_cache(self) -> list[dict]:
        return [{"self": {}, "cross": {}} for _ in self.decoder]

    def forward(self, src_tokens: torch.Tensor, prev_output_tokens: torch.Tensor,
                tgt_lang: torch.Tensor, lang_runs: Sequence[tuple[int, int]] | None = None,
                features_only: bool = False) -> torch.Tensor:
        """-> logits (B, T, V), or the features (B, T, D) with ``features_only`` (see :meth:`decode`)."""
        enc_out, enc_mask = self.encode(src_tokens)
        return self.decode(prev_output_tokens, enc_out, enc_mask, tgt_lang,
                           groups=self.lang_groups(tgt_lang, lang_runs), features_only=features_only)

    # -- helpers -------------------------------------------------------------------------------
    def shift_right(self, tgt_tokens: torch.Tensor) -> torch.Tensor:
        """Decoder input: bos + target without its last position (teacher forcing)."""
        bos = torch.full_like(tgt_tokens[:, :1], self.cfg.bos_id)
        return torch.cat([bos, tgt_tokens[:, :-1]], dim=1)

    def lsl_zero(self) -> torch.Tensor:
        """A zero that depends on every LSL Parameter: added to a loss, it gives each language a
        gradient (of zeros where the language is absent), one stack for all of them."""
        if not len(self.lsl):
            return self.embed.weight.new_zeros(())
        return torch.stack([p[0] for p in self.lsl]).sum() * 0.0

    def t_weights(self) -> dict[str, list[float]]:
        """Learned t_l per language (rows) and CLL layer (columns): paper Fig. 6."""
        if not self.cfg.cll_layers:
            return {}
        return {lang: [float(views[4].detach()) for views in self.lsl_views(i)]
                for i, lang in enumerate(self.cfg.lsl_languages)}


def train_flops(cfg: ModelConfig, rows: int, src_len: int, tgt_len: int) -> float:
    """Matmul FLOPs of one training step on a (rows × src_len, rows × tgt_len) batch: forward × 3,
    attention included, the LSLs counted for every row (MFU's numerator; bench_model's ratios)."""
    b, s, t = rows, src_len, tgt_len
    d, f, v, r = cfg.d_model, cfg.ffn_dim, cfg.vocab_size, cfg.lsl_dim
    enc = cfg.encoder_layers * (2 * b * s * (4 * d * d + 2 * d * f) + 4 * b * s * s * d)
    dec = cfg.decoder_layers * (2 * b * t * (4 * d * d + 2 * d * d + 2 * d * f) + 2 * b * s * 2 * d * d
                                + 4 * b * t * t * d + 4 * b * t * s * d)
    cll = len(cfg.cll_layers) * 2 * b * t * 2 * d * r
    out = 2 * b * t * d * v
    return 3.0 * (enc + dec + cll + out)


def _read_old_layouts(state_dict, prefix, *_):
    """Exports of earlier layouts load too (:func:`pack_per_layer_lsl`)."""
    pack_per_layer_lsl(state_dict, prefix)


# May go in v0.2.0: exports written before the LSLs moved into one Parameter per language.
def pack_per_layer_lsl(state_dict: dict, prefix: str = "") -> None:
    """Pack the per-layer LSL tensors of such an export (``decoder.{i}.ffn.{w1,b1,w2,b2,t}.{slot}``)
    into ``lsl.{slot}``, in place, so that it still loads (a ``load_state_dict`` pre-hook)."""
    old = sorted({k for k in state_dict if k.startswith(prefix + "decoder.")
                  and k.rsplit(".", 2)[-2] in ("w1", "b1", "w2", "b2", "t") and ".ffn." in k})
    if not old:
        return
    slots = sorted({int(k.rsplit(".", 1)[1]) for k in old})
    layers = sorted({int(k[len(prefix) + len("decoder."):].split(".")[0]) for k in old})
    for slot in slots:
        parts = [state_dict.pop(f"{prefix}decoder.{i}.ffn.{name}.{slot}").reshape(-1)
                 for i in layers for name in ("w1", "b1", "w2", "b2", "t")]
        state_dict[f"{prefix}lsl.{slot}"] = torch.cat(parts)


def label_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, pad_id: int, smoothing: float
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed cross entropy and summed NLL over non-pad target tokens, from logits
    (B, T, V): the form for code that has the logits anyway (analyses, tests). Training and
    validation use :func:`projected_loss`, which never makes them."""
    flat = logits.reshape(-1, logits.shape[-1])
    return _BlockedCrossEntropy.apply(flat, None, target.reshape(-1), pad_id, float(smoothing),
                                      _wants_grad(flat))


def projected_loss(features: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, pad_id: int,
                   smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`label_smoothed_loss` of the logits ``features @ weight.T`` (the tied output projection:
    ``features`` (B, T, D) from ``model(..., features_only=True)``, ``weight`` (V, D) the embedding),
    computed in blocks of rows so that neither the (B·T, V) logits nor their gradient is ever whole:
    at `small` (4,096 target tokens, V = 8,000) those were 64 MiB each in bf16, written fresh every
    step (issue 54's profile: fresh memory about 11% of the bf16 step on a CPU)."""
    flat = features.reshape(-1, features.shape[-1])
    return _BlockedCrossEntropy.apply(flat, weight, target.reshape(-1), pad_id, float(smoothing),
                                      _wants_grad(flat, weight))


def target_positions(features: torch.Tensor, target: torch.Tensor, pad_id: int, ntokens: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoder's features (N, D) and the targets (N,) of the ``ntokens`` non-pad target
    positions of a batch, in row order: what :func:`projected_loss` needs, without the pad
    positions' share of the output projection (its three (N × V × D) matmuls are the largest
    part of a small model's step; a length-sorted Multi30k batch is about 12% pad). ``ntokens``
    is the batch's non-pad count, known on the host (``Batch.ntokens``), so the selection has a
    static size and reads nothing from the device: a stable sort puts the kept positions first
    (``nonzero_static`` would do the same, but its CUDA kernel came with torch 2.6)."""
    flat = target.reshape(-1)
    features = features.reshape(-1, features.shape[-1])
    if ntokens == flat.numel():
        return features, flat
    keep = torch.argsort((flat == pad_id).to(torch.uint8), stable=True)[:ntokens]
    return features.index_select(0, keep), flat.index_select(0, keep)


def label_smoothed_loss_graph(logits: torch.Tensor, target: torch.Tensor, pad_id: int, smoothing: float
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`label_smoothed_loss` in plain tensor ops: what the blocked form is tested against."""
    # fp32 log-probabilities (bf16 logits lose too much in the sum), upcast inside the kernel.
    lprobs = F.log_softmax(logits.reshape(-1, logits.shape[-1]), dim=-1, dtype=torch.float32)   # (B*T, V)
    tgt = target.reshape(-1, 1)
    keep = tgt != pad_id
    nll = -(lprobs.gather(1, tgt) * keep).sum()
    # One log-softmax for both terms: torch's label_smoothing spreads ε uniformly over V classes.
    smooth = -(lprobs.sum(-1, keepdim=True) * keep).sum()
    loss = (1.0 - smoothing) * nll + smoothing / lprobs.shape[-1] * smooth
    return loss, nll.detach()


def projected_loss_graph(features: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, pad_id: int,
                         smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`projected_loss` in plain tensor ops: what ``train.compile`` compiles (its compiler
    fuses the element-wise work itself)."""
    return label_smoothed_loss_graph(F.linear(features, weight), target, pad_id, smoothing)


def _wants_grad(*tensors: torch.Tensor | None) -> bool:
    # Read here, not in the Function: its forward runs with grad mode off, and needs_input_grad
    # says True under torch.no_grad() too (validation would then compute gradients for nothing).
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


class _BlockedCrossEntropy(torch.autograd.Function):
    """Label-smoothed cross entropy in blocks of rows, fp32 inside, of logits ``x`` (N, V) or, with
    ``weight`` (V, D), of the logits ``x @ weight.T`` of features ``x`` (N, D).

    A block's fp32 log-probabilities give its rows' NLL and smoothing term (their sum); when a
    gradient is wanted they become the block's gradient of the logits in place, which goes straight
    into the inputs' gradients, and are dropped. So the forward computes the gradients (as fused
    linear cross-entropy kernels do) and the backward only scales them by the loss's incoming
    gradient (a scalar): the projection is never recomputed, and nothing of size N × V is saved.
    The gradient of ``(1-ε)·nll + ε/V·smooth`` with respect to logit ``x_v`` is
    ``p_v - ε/V - (1-ε)·[v = t]`` on kept rows and 0 on pad rows.

    Block size, in fp32 elements of (rows × V): on a CPU ``BLOCK_CPU`` and at least ``MIN_ROWS``
    rows (measured on the 2-core Xeon, loss forward and backward of 4,096 rows: at V = 8,000 about
    256 rows a block ran fastest, 1.8x (fp32) and 2.6x (bf16) the loss of whole logits; fewer rows
    than 256 left the matmuls and the weight gradient's per-block sum slow, 1.4x slower in bf16 at
    V = 32,000); on a GPU ``BLOCK_GPU`` (256 MiB of fp32: few kernels, the transient tensor bounded)."""

    BLOCK_CPU = 1 << 21
    BLOCK_GPU = 1 << 26
    MIN_ROWS = 256

    @staticmethod
    def rows_per_block(x: torch.Tensor, v: int) -> int:
        cls = _BlockedCrossEntropy
        block = cls.BLOCK_CPU if x.device.type == "cpu" else cls.BLOCK_GPU
        return max(1, min(x.shape[0], max(block // v, cls.MIN_ROWS)))    # never more rows than the batch has

    @staticmethod
    def forward(ctx, x, weight, target, pad_id: int, smoothing: float, with_grad: bool):
        n, v = x.shape[0], (x.shape[1] if weight is None else weight.shape[0])
        eps = smoothing
        keep = target != pad_id
        lp_t = torch.empty(n, dtype=torch.float32, device=x.device)       # log p of the target
        lp_sum = torch.empty(n, dtype=torch.float32, device=x.device)     # Σ_v log p_v
        grad_x = torch.empty_like(x) if with_grad else None
        # The weight's gradient sums over every block: in fp32, whatever the weight's dtype.
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=x.device) \
            if with_grad and weight is not None else None
        rows = _BlockedCrossEntropy.rows_per_block(x, v)
        scale = keep.to(torch.float32)[:, None]                            # (N, 1): 0 on pad rows
        at_target = torch.full((rows, 1), eps - 1.0, device=x.device)     # -(1-ε) at each row's target
        for s in range(0, n, rows):
            e = min(s + rows, n)
            logits = x[s:e] if weight is None else F.linear(x[s:e], weight)     # (rows, V)
            lp = F.log_softmax(logits, -1, dtype=torch.float32)                 # upcast inside
            torch.sum(lp, -1, out=lp_sum[s:e])
            lp_t[s:e] = lp.gather(1, target[s:e, None]).squeeze(1)
            if not with_grad:
                continue
            g = lp.exp_().sub_(eps / v)
            g.scatter_add_(1, target[s:e, None], at_target[:e - s])
            g = g.mul_(scale[s:e]).to(x.dtype)                                  # (rows, V)
            if weight is None:
                grad_x[s:e] = g
            else:
                grad_x[s:e] = g @ weight        # (rows, D); no out=: the bf16-in-fp32 mode takes none
                if grad_w.dtype == g.dtype:
                    grad_w.addmm_(g.t(), x[s:e])
                else:
                    grad_w += g.t() @ x[s:e]                                   # (V, D)
        nll = -(lp_t * keep).sum()
        smooth = -(lp_sum * keep).sum()
        loss = (1.0 - eps) * nll + eps / v * smooth
        ctx.save_for_backward(grad_x, grad_w)
        ctx.weight_dtype = None if weight is None else weight.dtype
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll):
        grad_x, grad_w = ctx.saved_tensors
        if grad_x is None:
            raise RuntimeError("this loss was computed without gradients (under torch.no_grad() or with "
                               "inputs that need none): compute it again with grad enabled")
        grad_x = grad_x * grad_loss.to(grad_x.dtype)
        if grad_w is not None:
            grad_w = (grad_w * grad_loss).to(ctx.weight_dtype)
        return grad_x, grad_w, None, None, None, None
