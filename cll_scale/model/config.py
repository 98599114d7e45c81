"""The model's section of a recipe (``model``): :class:`ModelConfig` and the size presets.

The vocabulary, special ids and languages come from the shards' manifest; the sizes from a preset
(:data:`PRESETS`); the CLL variant and its details from the recipe.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from cll_scale.core.compat import LEGACY_MODEL
from cll_scale.core.settings import setting

VARIANTS = ("baseline", "residual", "sd", "fcll", "custom")
RESIDUAL_SUBLAYERS = ("ffn", "self_attn")
INITS = ("torch", "xavier")
LSL_DROPOUTS = ("authors", "double")


@dataclass
class ModelConfig:
    """Encoder-decoder Transformer with optional CLL (paper Eq. 3) in the decoder. The vocabulary,
    special ids and languages come from the shards' manifest, the sizes from the preset."""

    vocab_size: int = 8000
    pad_id: int = 0
    bos_id: int = 2
    eos_id: int = 3
    d_model: int = setting(256, "model width D")
    n_heads: int = setting(4, "attention heads")
    ffn_dim: int = setting(1024, "inner size of the feed-forward layers")
    encoder_layers: int = setting(3, "encoder layers")
    decoder_layers: int = setting(3, "decoder layers")
    max_positions: int = setting(1024, "longest sequence the position table holds")
    pre_norm: bool = setting(True, "layer norm before each sublayer (false: after, as the paper's fairseq models)")
    dropout: float = setting(0.1, "dropout on sublayer outputs and embeddings")
    attention_dropout: float = setting(0.0, "dropout on attention weights")
    activation_dropout: float = setting(0.0, "dropout inside the feed-forward layers")
    init: str = setting("torch", "Linear weights: torch's default, or xavier as fairseq (the paper's code): "
                   "Xavier-uniform, zero biases", choices=INITS)
    # --- CLL (paper §3, Eq. 3) -------------------------------------------------------------
    languages: list[str] = field(default_factory=list)   # index = tgt_lang id (manifest order)
    central_language: str | None = None                   # None: every language has an LSL
    variant: str = setting("fcll", "baseline, residual, sd, fcll (paper §4), or custom with model.cll_layers",
                      choices=VARIANTS, flag="--variant")
    cll_layers: list[int] | None = setting(None, "decoder layers (0-based) with CLL, e.g. [0, 2]; set by the "
                                      "variant unless it is custom")
    lsl_dim: int = setting(256, "R, inner size of each language-specific layer")
    cll_dropout: float = setting(0.2, "dropout on the LSL output (paper App. A: 0.2-0.3)")
    lsl_dropout: str = setting("authors", "authors: the FFN output gets `dropout` and the LSL output `cll_dropout`, "
                          "each once, then they are added; double: the sum is dropped again, so the LSL "
                          "output twice (the rule of older runs)", choices=LSL_DROPOUTS)
    t_init: float = setting(0.1, "initial t_l, the learned weight of each LSL")
    # --- Residual removal (Liu et al. 2021) in the middle encoder layer ---------------------
    residual_sublayer: str | None = setting(None, "drop the residual of this sublayer of one encoder layer: ffn "
                                       "(the paper's code) or self_attn (Liu et al. 2021); residual/sd set ffn",
                                       choices=RESIDUAL_SUBLAYERS)
    residual_layer: int | None = setting(None, "0-based encoder layer of the removed residual (default: the "
                                         "middle one)")

    def __post_init__(self):
        for name in ("dropout", "attention_dropout", "activation_dropout", "cll_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:     # 1.0 divides by zero, above 1 flips the sign of activations
                raise ValueError(f"model.{name} must be in [0, 1), not {value}")
        for name in ("vocab_size", "d_model", "n_heads", "ffn_dim", "encoder_layers", "decoder_layers",
                     "max_positions", "lsl_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, not {getattr(self, name)}")
        if not math.isfinite(self.t_init):
            raise ValueError(f"model.t_init must be finite, not {self.t_init}")
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.lsl_dropout not in LSL_DROPOUTS:
            raise ValueError(f"model.lsl_dropout must be one of {LSL_DROPOUTS}, not {self.lsl_dropout!r}")
        if self.init not in INITS:
            raise ValueError(f"model.init must be one of {INITS}, not {self.init!r}")
        if self.residual_sublayer not in (None, *RESIDUAL_SUBLAYERS):
            raise ValueError(f"residual_sublayer must be one of {RESIDUAL_SUBLAYERS} or None")
        if self.central_language is not None and self.central_language not in self.languages:
            raise ValueError(f"central language {self.central_language!r} is not in {self.languages}")
        self.resolve_variant()

    def resolve_variant(self) -> None:
        """Baseline: no CLL. Residual: drop one residual of the middle encoder layer. SD:
        Residual + CLL in decoder layer N/2+1 (1-based). FCLL: CLL in every decoder layer."""
        mid_dec = self.decoder_layers // 2
        if self.variant == "baseline":
            self.cll_layers, self.residual_sublayer = [], None
        elif self.variant == "residual":
            self.cll_layers = []
            self.residual_sublayer = self.residual_sublayer or "ffn"
        elif self.variant == "sd":
            self.cll_layers = [mid_dec]
            self.residual_sublayer = self.residual_sublayer or "ffn"
        elif self.variant == "fcll":
            self.cll_layers = list(range(self.decoder_layers))
        elif self.cll_layers is None:
            raise ValueError("variant 'custom' needs cll_layers")
        bad = [i for i in self.cll_layers if not 0 <= i < self.decoder_layers]
        if bad:
            raise ValueError(f"cll_layers {bad} outside 0..{self.decoder_layers - 1}")
        self.cll_layers = sorted(set(self.cll_layers))
        if self.residual_sublayer and self.residual_layer is None:
            self.residual_layer = self.encoder_layers // 2
        if self.residual_layer is not None and not 0 <= self.residual_layer < self.encoder_layers:
            raise ValueError(f"residual_layer {self.residual_layer} outside the encoder")

    @property
    def lsl_languages(self) -> list[str]:
        """Languages that get an LSL: every one but the central language."""
        return [x for x in self.languages if x != self.central_language]

    def parameter_count(self) -> int:
        """The model's parameters, counted from its sizes without building it (the layout of
        :class:`cll_scale.model.model.CLLTransformer`): a size too large for memory is refused
        by this count before anything is allocated."""
        d, f, r = self.d_model, self.ffn_dim, self.lsl_dim
        attention = 4 * d * d + 4 * d                    # q, kv (2d), out, with biases
        ffn = 2 * d * f + f + d
        encoder = self.encoder_layers * (attention + ffn + 4 * d)          # + 2 LayerNorms
        decoder = self.decoder_layers * (2 * attention + ffn + 6 * d)      # + 3 LayerNorms
        lsl = len(self.lsl_languages) * len(self.cll_layers or []) * (2 * r * d + r + d + 1)
        return self.vocab_size * d + encoder + decoder + lsl + (4 * d if self.pre_norm else 0)

    def training_bytes(self) -> int:
        """What training holds for the model at least: fp32 weights, gradients and AdamW's two
        moments (16 bytes a parameter), and the position table (``max_positions`` x ``d_model``)."""
        return 16 * self.parameter_count() + 4 * self.max_positions * self.d_model

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "ModelConfig":
        return cls(**{**LEGACY_MODEL, **d})


# Size presets (the rest of ModelConfig keeps its defaults). `small` is the CPU experiment size,
# `mini` the quickstart's (half its width: about 3x fewer FLOPs a target token with an 8,000-subword
# vocabulary; why it, docs/usage.md, "Set-up"),
# `base` the paper's OPUS-100 model (App. A), `big` the usual Transformer-big. `paper` is the
# model of the authors' code for the triangle and Europarl runs (github zhiqu22/AdapNonCenter, a
# fairseq `transformer`): 5+5 post-norm layers, dropout 0.3, Xavier init, and LSLs hard-coded at
# 512 -> 1024 -> 512 with CLL dropout 0.3. Their dropout after `t_l ·` equals ours before it
# (dropout commutes with a scalar).
# The preset of a recipe that names none.
DEFAULT_PRESET = "small"

PRESETS: dict[str, dict] = {
    "tiny": dict(d_model=32, n_heads=2, ffn_dim=64, encoder_layers=2, decoder_layers=2, lsl_dim=16,
                 max_positions=512),
    "mini": dict(d_model=128, n_heads=4, ffn_dim=512, encoder_layers=3, decoder_layers=3, lsl_dim=128),
    "small": dict(d_model=256, n_heads=4, ffn_dim=1024, encoder_layers=3, decoder_layers=3, lsl_dim=256),
    "base": dict(d_model=512, n_heads=8, ffn_dim=2048, encoder_layers=6, decoder_layers=6, lsl_dim=256),
    "paper": dict(d_model=512, n_heads=8, ffn_dim=2048, encoder_layers=5, decoder_layers=5, lsl_dim=1024,
                  dropout=0.3, cll_dropout=0.3, pre_norm=False, init="xavier"),
    "big": dict(d_model=1024, n_heads=16, ffn_dim=4096, encoder_layers=6, decoder_layers=6, lsl_dim=512,
                dropout=0.3),
}
