"""Each model's evaluation on every test split, cached beside the report and keyed by the export
and the decoding settings: a re-run after an interruption, or with more seeds, decodes only what
is new, and a record (no weights) is evaluated from its cache alone."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from cll_scale.core.cli import pick_device
from cll_scale.core.jsonfiles import read_json_object
from cll_scale.core.outputs import json_text, write_atomic
from cll_scale.data.manifest import MANIFEST, Manifest
from cll_scale.evaluation.evaluator import evaluate_entries, file_name, select_directions
from cll_scale.evaluation.report import ModelEntry
from cll_scale.evaluation.testsets import pairs_from_shards
from cll_scale.evaluation.translator import TranslateConfig, Translator
from cll_scale.model.decode_config import DecodeConfig
from cll_scale.repro.records import export_id, is_record
from cll_scale.training.rundir import chosen_export


@dataclass(frozen=True)
class EvalSettings:
    """How every model of a study is evaluated (the cache key, with the export)."""
    splits: tuple[str, ...]
    beam: int = DecodeConfig.beam
    max_sentences: int = 0              # the first N sentences of each direction; 0: all
    ablate_lsl: bool = False            # also with the LSLs off (paper Tables 9-10)
    omit_lang_tag: bool = False         # also without the language tag (paper Table 8)
    lid: tuple[str, ...] = ("langdetect",)

    def decoding(self) -> dict:
        """The settings a cached evaluation must match."""
        key = {"beam": self.beam, "max_sentences": self.max_sentences, "ablate_lsl": self.ablate_lsl,
               "lid": list(self.lid)}
        if self.omit_lang_tag:      # only when asked: the evaluations cached before it existed still match
            key["omit_lang_tag"] = True
        return key

    def key(self, run_dir: Path) -> dict:
        """What a model's cached evaluation must have been made with: its export and these settings."""
        return {"export": export_id(run_dir), **self.decoding()}


def cached_evaluation(figs: Path, name: str, split: str) -> dict:
    """The cached evaluation of ``name`` on ``split`` beside the report ``figs`` ({} when none):
    ``{"settings": ..., "entries": ...}``."""
    path = figs / "evaluated" / split / f"{file_name(name)}.json"
    return read_json_object(path) if path.exists() else {}


class Evaluations:
    """``of(name, run_dir)``: split -> the model's report entries, from
    ``<report>/evaluated/<split>/<model>.json`` where its export and settings match, else decoded
    now (hypotheses under ``<report>/hyps/<split>``)."""

    def __init__(self, settings: EvalSettings, shards: Path, figs: Path, pool):
        self.settings, self.shards, self.figs, self.pool = settings, shards, figs, pool
        self.device = pick_device(None)             # where every model is decoded
        self.decoding = settings.decoding()
        self.done: dict[str, dict[str, dict[str, ModelEntry]]] = {}     # model -> split -> entries
        self.test_sets: dict[str, tuple] = {}       # read only if some model has to be decoded
        self.manifest: Manifest | None = None       # the shards', read once with the first test set

    def has_test_sets(self) -> bool:
        """Whether the shards the test sets are read from are here."""
        return (self.shards / MANIFEST).is_file()

    def test_set(self, split: str) -> tuple:
        if split not in self.test_sets:
            self.manifest = self.manifest or Manifest.load(self.shards)
            pairs = pairs_from_shards(self.shards, split, self.manifest)
            self.test_sets[split] = pairs, select_directions(pairs, None, split)
        return self.test_sets[split]

    def cached(self, name: str, run_dir: Path, split: str, key: dict) -> dict[str, ModelEntry] | None:
        """The cached entries of ``split`` if they were decoded with ``key``; a record without
        them cannot be decoded (it has no weights) and is refused."""
        previous = cached_evaluation(self.figs, name, split)
        if previous.get("settings") == key:
            print(f"[cll-repro] {split}: {name} evaluated before with this export and these settings, "
                  f"reusing {self.figs / 'evaluated' / split / (file_name(name) + '.json')}", file=sys.stderr)
            return {entry: ModelEntry.from_json(d) for entry, d in previous["entries"].items()}
        if is_record(run_dir):
            before = {k: v for k, v in previous.get("settings", {}).items() if k != "export"}
            raise ValueError(
                f"{name}: only its record is left ({run_dir}: no weights), and it was not evaluated on "
                f"{split} with these settings ({json_text(self.decoding)}; before: {json_text(before)}): "
                f"evaluate with the settings it was evaluated with, or move the record away to train it again")
        return None

    def of(self, name: str, run_dir: Path) -> dict[str, dict[str, ModelEntry]]:
        if name in self.done:
            return self.done[name]
        key = self.settings.key(run_dir)
        s = self.settings
        result, translator = {}, None
        for split in s.splits:
            entries = self.cached(name, run_dir, split, key)
            if entries is not None:
                result[split] = entries
                continue
            print(f"[cll-repro] evaluating on {split}: {name}", file=sys.stderr)
            if translator is None:
                translator = Translator.load(chosen_export(run_dir), self.device,
                                             TranslateConfig(DecodeConfig(beam=s.beam)))
            pairs, directions = self.test_set(split)
            result[split] = evaluate_entries(translator, name, pairs, directions, s.max_sentences, s.ablate_lsl,
                                             lambda m: print(m, file=sys.stderr), s.lid, self.pool,
                                             self.figs / "hyps" / split, s.omit_lang_tag)
            write_atomic(self.figs / "evaluated" / split / f"{file_name(name)}.json",
                         json_text({"settings": key, "entries": {k: e.to_json() for k, e in result[split].items()}},
                                   indent=1, ensure_ascii=False))
        self.done[name] = result
        return result
