"""The decoding settings (:class:`DecodeConfig`), apart from the search itself so that the commands
build their parsers from them without importing torch: ``--help`` answers at once."""
from __future__ import annotations

from dataclasses import dataclass

from cll_scale.core.settings import setting


@dataclass
class DecodeConfig:
    # The help texts are the commands' flags (cll_scale.core.cli.add_config_arguments).
    beam: int = setting(4, "beam size (1: greedy)")
    len_penalty: float = setting(1.0, "length penalty: a hypothesis scores sum log p / length ** len_penalty")
    max_len_a: float = setting(1.5, "longest output = a · source length + b: a")
    max_len_b: int = setting(10, "longest output = a · source length + b: b")
    min_len: int = setting(1, "shortest output, in subwords before eos")

    def __post_init__(self):
        import math
        if self.beam < 1:
            raise ValueError(f"beam must be >= 1, not {self.beam}")
        if not math.isfinite(self.len_penalty):
            raise ValueError(f"len_penalty must be a finite number, not {self.len_penalty}")
        if not (math.isfinite(self.max_len_a) and self.max_len_a >= 0) or self.max_len_b < 1:
            raise ValueError(f"max length = a * source length + b needs a >= 0 and b >= 1 "
                             f"(got a={self.max_len_a}, b={self.max_len_b}): otherwise every output is empty")
        if self.min_len < 0:
            raise ValueError(f"min_len must be >= 0, not {self.min_len}")
