"""Paper §5's analyses of one model: layer attribution (Fig. 5) and attention maps (Fig. 3).

Plain PyTorch and Captum on an export, no DeepSpeed. The CLI is ``cll-analyze``
(:mod:`cll_scale.analyze`); the demo's "why this language?" view calls :func:`attribute`.

Attribution. For each decoder layer and component ``c`` — ``ffn1``/``ffn2``, the outputs of the
FFN's two linear layers, and in CLL layers ``lsl1``/``lsl2``, the LSL's two — integrated
gradients (Sundararajan et al. 2017, Captum's ``LayerIntegratedGradients``) over the path that
scales the component's output from zero to its value, the rest of the network fixed, for each
target token's log-probability (teacher-forced). Summed over the positions and hidden units,
one (token, layer, component) value: how much the component raised (> 0) or lowered (< 0) the
token's log-probability. Completeness: the values sum to ``log p(token) - log p(token | c's output
set to 0)``; Captum's convergence delta is the gap, reported with every result. ``ffn2`` set to
zero removes the FFN's whole contribution to the residual stream and ``lsl2`` the LSL's, so the
signs of those two are "the FFN's" and "the LSL's" in Fig. 5's reading.
"""
from __future__ import annotations

import contextlib
import math
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from cll_scale.core.hardware import available_memory, size_text
from cll_scale.data.inputs import target_ids
from cll_scale.evaluation.translator import Translator
from cll_scale.model.config import ModelConfig
from cll_scale.model.model import CLLTransformer

COMPONENTS = ("ffn1", "ffn2", "lsl1", "lsl2")


@dataclass
class Example:
    """One sentence pair encoded as the model was trained, for teacher forcing."""
    src_text: str
    tgt_text: str
    tgt_lang: str
    src_tokens: torch.Tensor            # (1, S): [<tgt>] source </s>
    prev_tokens: torch.Tensor           # (1, T): <s> target
    target: torch.Tensor                # (1, T): target </s>
    src_pieces: list[str]
    tgt_pieces: list[str]               # the T target pieces, "</s>" last
    lang_tag: bool                      # whether src_tokens start with the tag
    tgt_lang_id: torch.Tensor           # (1,): the target language's id (manifest order)


def prepare(translator: Translator, src_text: str, tgt_lang: str, tgt_text: str | None = None,
            omit_tag: bool = False) -> Example:
    """Encode a pair; without ``tgt_text`` the target is the model's own translation (beam of the
    translator's settings), so the attribution explains what the model wrote."""
    lang = translator.check_language(tgt_lang)
    if not src_text.strip():
        raise ValueError("the source sentence is empty")
    if tgt_text is None:
        tgt_text = translator.translate([src_text], tgt_lang, omit_tag=omit_tag)[0]
    src_ids = translator.encode(src_text.strip(), tgt_lang, omit_tag)
    longest = translator.model.cfg.max_positions - 2
    tgt_ids = target_ids(translator.sp.encode(tgt_text.strip())[:longest], translator.eos)
    sp, device = translator.sp, translator.device
    return Example(src_text, tgt_text, tgt_lang, torch.tensor([src_ids], device=device),
                   torch.tensor([[translator.bos] + tgt_ids[:-1]], device=device),
                   torch.tensor([tgt_ids], device=device), [sp.id_to_piece(i) for i in src_ids],
                   [sp.id_to_piece(i) for i in tgt_ids[:-1]] + ["</s>"], translator.lang_tag and not omit_tag,
                   torch.tensor([lang], device=device))


def token_log_probs(model: CLLTransformer, ex: Example, rows: int = 1, use_lsl: bool = True) -> torch.Tensor:
    """(rows, T) log-probability of each target token, the example repeated ``rows`` times."""
    src = ex.src_tokens.expand(rows, -1)
    prev, tgt = ex.prev_tokens.expand(rows, -1), ex.target.expand(rows, -1)
    enc_out, enc_mask = model.encode(src)
    logits = model.decode(prev, enc_out, enc_mask, ex.tgt_lang_id.expand(rows), use_lsl=use_lsl)
    return F.log_softmax(logits.float(), -1).gather(-1, tgt[..., None])[..., 0]


@contextlib.contextmanager
def _gated(module: torch.nn.Module) -> Iterator[dict]:
    """Multiplies ``module``'s output by ``holder["gate"]`` (one value per row): gate 0 removes
    the component, 1 keeps it. Registered before Captum's own hook, which then sees the gated
    output: its baseline (gate 0) is the component at zero."""
    holder: dict = {}

    def hook(_module, _inputs, output):
        return output * holder["gate"].view(-1, *([1] * (output.dim() - 1))).to(output.dtype)

    handle = module.register_forward_hook(hook)
    try:
        yield holder
    finally:
        handle.remove()


@dataclass
class Attribution:
    """One sentence's Fig. 5: ``values[c][layer][token]``; None where the layer has no such
    component (no LSL in a plain layer, or for the central language)."""
    example: Example
    values: dict[str, list[list[float] | None]]
    effect: dict[str, list[list[float] | None]]       # log p(token) - log p(token | component zeroed)
    delta: dict[str, list[list[float] | None]]        # Captum's convergence delta (sum - effect)
    log_probs: list[float] = field(default_factory=list)

    def max_abs_delta(self) -> float:
        return max((abs(x) for rows in self.delta.values() for row in rows if row for x in row), default=0.0)

    def per_token(self, name: str) -> list[float] | None:
        """``name``'s attribution per target token, summed over the decoder layers that have it."""
        rows = [row for row in self.values[name] if row is not None]
        return [sum(col) for col in zip(*rows)] if rows else None

    def to_json(self) -> dict:
        ex = self.example
        return {"src_text": ex.src_text, "tgt_text": ex.tgt_text, "tgt_lang": ex.tgt_lang, "lang_tag": ex.lang_tag,
                "src_pieces": ex.src_pieces, "tgt_pieces": ex.tgt_pieces, "log_probs": self.log_probs,
                "attribution": self.values, "effect": self.effect, "delta": self.delta,
                "max_abs_delta": self.max_abs_delta()}


# -- what an attribution allocates ---------------------------------------------------------------
# The share of the memory available at the start that an attribution may take: the rest is the
# model, the texts, the allocator's slack and the machine's other processes.
MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class MemoryBudget:
    """What an attribution may allocate: ``host`` for the quadrature (numpy, always on the host),
    ``device`` for the passes through the model."""
    host: int
    device: int

    @classmethod
    def now(cls, device: str | torch.device = "cpu") -> "MemoryBudget":
        host = int(MEMORY_SHARE * available_memory("cpu"))
        return cls(host, host if torch.device(device).type != "cuda" else int(MEMORY_SHARE * available_memory(device)))


def quadrature_bytes(n_steps: int) -> int:
    """Captum's Gauss-Legendre nodes and weights come from numpy's ``leggauss(n_steps)``, which
    builds an ``n_steps × n_steps`` companion matrix and takes its eigenvalues (a float64 copy):
    16 · n_steps² bytes at the peak (measured), for any sentence, before the model runs at all."""
    return 16 * n_steps * n_steps


def max_steps(budget: int) -> int:
    """The most integration steps whose quadrature fits in ``budget`` bytes."""
    return math.isqrt(max(budget, 0) // 16)


def step_bytes(cfg: ModelConfig, src_len: int, tgt_len: int) -> int:
    """Bytes of one integration step of a sentence: ``T`` rows (one per target token), each a
    forward pass kept for the backward one. Per row, in fp32 values: the logits, their log-softmax
    and its gradient (3 · T · V), each layer's activations per position (the model width about 14
    times, the FFN's and LSL's inner sizes twice) and the attention weights (3 · H per query-key
    pair). Within about 10 % of the peak measured on the tiny and small presets (CPU, fp32)."""
    s, t = src_len, tgt_len
    width = 14 * cfg.d_model + 2 * cfg.ffn_dim + 2 * cfg.lsl_dim
    row = (3 * t * cfg.vocab_size + (cfg.encoder_layers * s + cfg.decoder_layers * t) * width
           + 3 * cfg.n_heads * (cfg.encoder_layers * s * s + cfg.decoder_layers * (t * t + t * s)))
    return 4 * t * row


def longest_target(cfg: ModelConfig, src_len: int, budget: int) -> int:
    """The longest target (tokens, ``</s>`` included) of which one integration step fits in
    ``budget`` bytes; 0 when none does."""
    lo, hi = 0, cfg.max_positions
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if step_bytes(cfg, src_len, mid) <= budget else (lo, mid - 1)
    return lo


def check_fits(cfg: ModelConfig, ex: "Example", n_steps: int, budget: MemoryBudget) -> int:
    """Refuse an attribution that cannot fit in ``budget`` (numpy would ask for terabytes, or
    the machine would swap and be killed); return the integration steps per pass through the
    model that fit (all of them when they do)."""
    if quadrature_bytes(n_steps) > budget.host:
        raise ValueError(f"{n_steps} integration steps need {size_text(quadrature_bytes(n_steps))} for the "
                         f"quadrature alone, more than the {size_text(budget.host)} allowed; at most "
                         f"{max_steps(budget.host)} fit")
    s, t = ex.src_tokens.shape[1], ex.target.shape[1]
    step = step_bytes(cfg, s, t)
    if step > budget.device:
        raise ValueError(f"a target of {t} tokens needs {size_text(step)} per integration step, more than the "
                         f"{size_text(budget.device)} allowed; the longest that fits is "
                         f"{longest_target(cfg, s, budget.device)} tokens")
    return min(n_steps, budget.device // step)


def attribute(model: CLLTransformer, ex: Example, n_steps: int = 32, internal_batch_size: int = 0,
              components: tuple[str, ...] = COMPONENTS, budget: MemoryBudget | None = None) -> Attribution:
    """Every (component, layer) of ``components`` for every target token; see the module doc.
    ``ffn2`` and ``lsl2`` alone answer "FFN against LSL" at half the cost (the demo's view).
    Captum evaluates all ``n_steps`` × T rows in one pass unless ``internal_batch_size`` (rows per
    pass) says otherwise; 0: as many steps per pass as fit in ``budget`` (default: a share of the
    memory available now, :data:`MEMORY_SHARE`), so that memory does not grow with the steps.
    What cannot fit at all is refused (:func:`check_fits`)."""
    from captum.attr import LayerIntegratedGradients

    if n_steps < 2:
        raise ValueError(f"n_steps must be >= 2, not {n_steps}")
    unknown = [c for c in components if c not in COMPONENTS]
    if unknown:
        raise ValueError(f"unknown components {unknown}; choose from {', '.join(COMPONENTS)}")
    per_pass = check_fits(model.cfg, ex, n_steps, budget or MemoryBudget.now(ex.target.device))
    if not internal_batch_size and per_pass < n_steps:
        internal_batch_size = per_pass * ex.target.shape[1]
    was_training = model.training
    model.eval()
    n_layers, t = len(model.decoder), ex.target.shape[1]
    has_lsl = bool(model.cfg.cll_layers) and int(model.lang_slot[ex.tgt_lang_id]) >= 0
    values = {c: [None] * n_layers for c in COMPONENTS}
    effect = {c: [None] * n_layers for c in COMPONENTS}
    delta = {c: [None] * n_layers for c in COMPONENTS}
    ones = torch.ones(t, 1, device=ex.target.device)
    targets = list(range(t))              # row i explains token i
    try:
        with torch.no_grad():             # the model as it is: the same for every component
            full = token_log_probs(model, ex)[0]
        for (layer, name), module in model.components().items():
            if name not in components or (name.startswith("lsl") and not has_lsl):
                continue
            with _gated(module) as holder:
                def scores(gate: torch.Tensor) -> torch.Tensor:
                    holder["gate"] = gate
                    return token_log_probs(model, ex, gate.shape[0])
                lig = LayerIntegratedGradients(scores, module)
                attr, gap = lig.attribute(ones, baselines=torch.zeros_like(ones), target=targets, n_steps=n_steps,
                                          internal_batch_size=internal_batch_size or None,
                                          return_convergence_delta=True)
                with torch.no_grad():
                    removed = scores(torch.zeros(1, 1, device=ones.device))[0]     # the component at zero
            values[name][layer] = attr.sum(dim=tuple(range(1, attr.dim()))).tolist()
            effect[name][layer] = (full - removed).tolist()
            delta[name][layer] = gap.tolist()
    finally:
        model.train(was_training)
    return Attribution(ex, values, effect, delta, full.tolist())


# -- token classes of the summary -----------------------------------------------------------------
def is_symbol_piece(piece: str) -> bool:
    """Punctuation, digits or symbols only (the SentencePiece word marker aside), or the end of
    sentence: the "common" tokens of Fig. 5's reading."""
    text = piece.replace("\u2581", "")
    if piece == "</s>":
        return True
    return bool(text) and all(unicodedata.category(ch)[0] in "PNS" for ch in text)


def language_pieces(translator: Translator, texts_by_lang: dict[str, list[str]]) -> dict[str, set[str]]:
    """Language -> the pieces its texts use."""
    return {lang: {p for text in texts for p in translator.sp.encode(text, out_type=str)}
            for lang, texts in texts_by_lang.items()}


def token_class(piece: str, lang: str, pieces: dict[str, set[str]]) -> str:
    """``symbol`` (:func:`is_symbol_piece`), ``shared`` (a word piece that the texts of another
    language use too, e.g. names, cognates) or ``specific`` (used by ``lang``'s texts alone, or by
    none: a piece only the model wrote)."""
    if is_symbol_piece(piece):
        return "symbol"
    others = any(piece in used for other, used in pieces.items() if other != lang)
    return "shared" if others else "specific"


def summarize(results: list[Attribution], pieces: dict[str, set[str]]) -> dict:
    """Over every (token, layer) pair with an LSL: per token class, the share where the LSL's
    attribution (``lsl2``) and the FFN's (``ffn2``) have opposite signs, and each component's mean
    absolute attribution; with the largest convergence delta, and the sum of the deltas' sizes
    relative to the sum of the effects' (how far completeness holds overall)."""
    by_class: dict[str, dict] = {}
    worst, gaps, effects = 0.0, 0.0, 0.0
    for res in results:
        ex = res.example
        worst = max(worst, res.max_abs_delta())
        for c in COMPONENTS:
            for layer, row in enumerate(res.delta[c]):
                if row:
                    gaps += sum(map(abs, row))
                    effects += sum(map(abs, res.effect[c][layer]))
        for i, piece in enumerate(ex.tgt_pieces):
            cls = by_class.setdefault(token_class(piece, ex.tgt_lang, pieces),
                                      {"tokens": 0, "pairs": 0, "opposite": 0, **{c: 0.0 for c in COMPONENTS},
                                       **{f"n_{c}": 0 for c in COMPONENTS}})
            cls["tokens"] += 1
            for layer in range(len(res.values["ffn2"])):
                for c in COMPONENTS:
                    if res.values[c][layer] is not None:
                        cls[c] += abs(res.values[c][layer][i])
                        cls[f"n_{c}"] += 1
                lsl, ffn = res.values["lsl2"][layer], res.values["ffn2"][layer]
                if lsl is not None:
                    cls["pairs"] += 1
                    cls["opposite"] += int(lsl[i] * ffn[i] < 0)
    table = {}
    for name, cls in sorted(by_class.items()):
        table[name] = {"tokens": cls["tokens"], "pairs_with_lsl": cls["pairs"],
                       "opposite_sign_share": cls["opposite"] / cls["pairs"] if cls["pairs"] else None,
                       **{f"mean_abs_{c}": cls[c] / cls[f"n_{c}"] if cls[f"n_{c}"] else None for c in COMPONENTS}}
    return {"sentences": len(results), "classes": table, "max_abs_delta": worst,
            "relative_delta": gaps / effects if effects else 0.0}


# -- attention (Fig. 3) ---------------------------------------------------------------------------
@contextlib.contextmanager
def keeping_attention(model: CLLTransformer) -> Iterator[dict]:
    """Within the block every attention keeps its weights; yields (kind, layer) -> module."""
    modules = model.attentions()
    for m in modules.values():
        m.keep_weights = True
    try:
        yield modules
    finally:
        for m in modules.values():
            m.keep_weights, m.weights = False, None


@torch.no_grad()
def attention_maps(model: CLLTransformer, ex: Example) -> dict[str, list[torch.Tensor]]:
    """kind (encoder / decoder / cross) -> per layer (H, queries, keys) weights of one teacher-
    forced pass."""
    was_training = model.training
    model.eval()
    try:
        with keeping_attention(model) as modules:
            token_log_probs(model, ex)
            out: dict[str, list[torch.Tensor]] = {}
            for (kind, _layer), m in modules.items():
                out.setdefault(kind, []).append(m.weights[0].cpu())
    finally:
        model.train(was_training)
    return out


def tag_share(weights: torch.Tensor) -> float:
    """Mean weight that the queries of a (H, Q, S) encoder map give the first key (the tag)."""
    return float(weights[..., 0].mean())
