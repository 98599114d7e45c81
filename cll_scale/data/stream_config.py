"""The recipe's ``data`` section (:class:`StreamConfig`), apart from the stream that reads it
(:mod:`cll_scale.data.stream`, which imports torch), so that ``cll-train`` builds its flags without
importing torch: ``--help`` answers at once."""
from __future__ import annotations

from dataclasses import dataclass

from cll_scale.core.settings import setting
from cll_scale.data.languages import Direction

MIXINGS = ("mixed", "direction")
VERIFY = ("full", "size", "none")


@dataclass
class StreamConfig:
    """The recipe's ``data`` section: what the training stream feeds."""
    split: str = setting("train", "the split to train on")
    batch_tokens: int = setting(4096, "token budget of a microbatch: sentences x padded max(source, "
                              "target) length")
    max_sentences: int = setting(0, "sentences per microbatch at most (0: no cap)")
    temperature: float = setting(5.0, "direction sampling temperature T: q_d ~ n_d^(1/T) (1: by size; large: uniform)")
    pool_blocks: int = setting(8, "blocks shuffled and bucketed together, at most")
    pool_rows: int = setting(262_144, "rows pooled over all directions at most, per rank (~310 B a row)")
    seed: int = setting(1, "seed of the data order")
    add_lang_tag: bool = setting(True, "prepend the <2xx> target-language tag to the source (paper §5.2 trains "
                            "without it as an ablation)")
    directions: list[Direction] | None = setting(None, "train on this subset of the split's directions, e.g. [de-en, en-de]")
    verify: str = setting("full", "shards checked at start: full (sha256), size or none", choices=VERIFY)
    mixing: str = setting("mixed", "mixed: many directions per microbatch (fairseq's merged batches, the authors' "
                     "code); direction: one per microbatch (the rule of older runs, whose records lack "
                     "the key)", choices=MIXINGS)
    mix_rows: int = setting(8192, "rows of a mixed pool, sorted by length and cut into batches")
    mix_directions: int = setting(0, "directions drawn per mixed pool (0: all): with many target languages a batch "
                             "then holds at most this many LSL groups")
    rows_fraction: float = setting(1.0, "train on this share of each direction's rows (its first rows, to the "
                              "nearest row): how much the amount of data matters, at equal steps")

    def __post_init__(self):
        if self.directions is not None:
            self.directions = [Direction.parse(str(d)) for d in self.directions]
            twice = sorted({d for d in self.directions if self.directions.count(d) > 1})
            if twice:       # a direction listed twice would be sampled as two
                raise ValueError(f"data.directions lists {', '.join(twice)} twice")
        if min(self.batch_tokens, self.pool_blocks, self.pool_rows, self.mix_rows) < 1 or self.max_sentences < 0:
            raise ValueError("batch_tokens, pool_blocks, pool_rows and mix_rows must be >= 1, max_sentences >= 0")
        if not 0 <= self.mix_directions <= self.mix_rows:
            raise ValueError(f"data.mix_directions must be in [0, data.mix_rows], not {self.mix_directions}")
        if not 0.0 < self.rows_fraction <= 1.0:
            raise ValueError(f"data.rows_fraction must be in (0, 1], not {self.rows_fraction}")
        if self.mixing not in MIXINGS:
            raise ValueError(f"data.mixing must be one of {', '.join(MIXINGS)}, not {self.mixing!r}")
        if self.mix_directions and self.mixing != "mixed":
            raise ValueError(f"data.mix_directions={self.mix_directions} applies to data.mixing: mixed; with "
                             f"data.mixing: {self.mixing} every microbatch holds one direction")
        if self.temperature <= 0 or self.seed < 0:
            raise ValueError("data.temperature must be > 0 and data.seed >= 0")
        if self.verify not in VERIFY:
            raise ValueError("verify must be 'size', 'full' or 'none'")
