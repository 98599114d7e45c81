"""An ``export/`` rewritten for ``transformers``: a directory that loads with
``AutoModelForSeq2SeqLM.from_pretrained(DIR, trust_remote_code=True)`` and
``AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)``, and translates as the
:class:`~cll_scale.evaluation.translator.Translator` does. ::

    config.json              CLLConfig, with auto_map to the remote code below
    generation_config.json   cll-translate's search: beam 4, length penalty 1, early stopping
    model.safetensors        the weights, renamed for the remote code; each CLL layer's LSLs
                             stacked over the languages
    spm.model                the SentencePiece model
    tokenizer_config.json    CLLTokenizer: tags, eos, truncation as the Translator encodes
    configuration_cll.py, modeling_cll.py, tokenization_cll.py
                             the model in transformers (``cll_scale/model/hf/``), importing no cll_scale

Writing needs no transformers (torch and safetensors only); loading the directory does.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from cll_scale.core.outputs import json_text
from cll_scale.model.decode_config import DecodeConfig
from cll_scale.model.export import ExportInfo, load_export
from cll_scale.model.model import CLLTransformer

REMOTE_CODE = Path(__file__).parent / "hf"
CODE_FILES = ("configuration_cll.py", "modeling_cll.py", "tokenization_cll.py")
FILES = ("config.json", "generation_config.json", "model.safetensors", "spm.model", "tokenizer_config.json",
         *CODE_FILES)
AUTO_MAP = {"AutoConfig": "configuration_cll.CLLConfig",
            "AutoModelForSeq2SeqLM": "modeling_cll.CLLForConditionalGeneration"}


def hf_state_dict(model: CLLTransformer) -> dict[str, torch.Tensor]:
    """Our state dict under the remote code's names: ``encoder.*`` / ``decoder.*`` become
    ``encoder_layers.*`` / ``decoder_layers.*``, and each language's one LSL Parameter is split
    per CLL layer into ``decoder_layers.{i}.ffn.lsl_{w1,b1,w2,b2,t}``, stacked over the languages
    in ``lsl_languages`` order."""
    out = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("lsl."):
            continue
        head, _, rest = name.partition(".")
        key = {"encoder": "encoder_layers", "decoder": "decoder_layers"}.get(head, head)
        out[f"{key}.{rest}" if rest else key] = tensor
    views = [model.lsl_views(slot) for slot in range(len(model.lsl))]       # [slot][cll index] -> 5 tensors
    d, r = model.cfg.d_model, model.cfg.lsl_dim
    shapes = {"w1": (r, d), "b1": (r,), "w2": (d, r), "b2": (d,), "t": ()}
    for index, layer in enumerate(model.cfg.cll_layers):
        for k, (part, shape) in enumerate(shapes.items()):
            # (L, *shape); t_l is a (1,) view per language, stacked to (L,)
            stacked = torch.stack([v[index][k].reshape(shape) for v in views]) if views else torch.zeros(0, *shape)
            out[f"decoder_layers.{layer}.ffn.lsl_{part}"] = stacked
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in out.items()}


def hf_config(model: CLLTransformer, tokenizer, lang_tag: bool, max_source_subwords: int,
              decode: DecodeConfig) -> dict:
    cfg = model.cfg
    return {
        "model_type": "cll_transformer", "architectures": ["CLLForConditionalGeneration"], "auto_map": AUTO_MAP,
        "vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "n_heads": cfg.n_heads, "ffn_dim": cfg.ffn_dim,
        "encoder_layers": cfg.encoder_layers, "decoder_layers": cfg.decoder_layers,
        "max_positions": cfg.max_positions, "pre_norm": cfg.pre_norm, "dropout": cfg.dropout,
        "attention_dropout": cfg.attention_dropout, "activation_dropout": cfg.activation_dropout,
        "cll_layers": cfg.cll_layers, "lsl_dim": cfg.lsl_dim, "cll_dropout": cfg.cll_dropout,
        "lsl_dropout": cfg.lsl_dropout, "residual_sublayer": cfg.residual_sublayer,
        "residual_layer": cfg.residual_layer, "languages": cfg.languages, "lsl_languages": cfg.lsl_languages,
        "lang_tag": lang_tag, "lang_tag_ids": tokenizer.lang_tag_ids, "use_lsl": True,
        "max_len_a": decode.max_len_a, "max_len_b": decode.max_len_b, "min_len": decode.min_len,
        "max_source_subwords": max_source_subwords, "pad_token_id": tokenizer.pad_id,
        "bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id,
        "decoder_start_token_id": tokenizer.bos_id,
    }


def write_hf_export(export_dir: str | os.PathLike, out: str | os.PathLike,
                    decode: DecodeConfig | None = None) -> None:
    """Write the transformers directory of ``export_dir`` into the directory ``out`` (:data:`FILES`;
    the caller owns ``out`` and makes it appear whole: cll-export writes into a temporary one).
    ``decode``: the beam and length limits written as the directory's defaults (cll-translate's)."""
    decode, out = decode or DecodeConfig(), Path(out)
    info = ExportInfo.load(export_dir)
    model, manifest = load_export(export_dir)
    tok = manifest.tokenizer
    # the Translator's cut of a long source (its max_src with the default settings)
    max_source = min(manifest.max_length, model.cfg.max_positions - 2)
    save_file(hf_state_dict(model), out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json_text(hf_config(model, tok, info.lang_tag, max_source, decode), indent=1))
    (out / "generation_config.json").write_text(json_text({
        "decoder_start_token_id": tok.bos_id, "bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id,
        "pad_token_id": tok.pad_id, "num_beams": decode.beam, "length_penalty": decode.len_penalty,
        # a sentence is done with `beam` finished hypotheses, as in cll_scale.model.decoding
        "early_stopping": True}, indent=1))
    shutil.copyfile(Path(export_dir) / "spm.model", out / "spm.model")
    (out / "tokenizer_config.json").write_text(json_text({
        "tokenizer_class": "CLLTokenizer", "auto_map": {"AutoTokenizer": ["tokenization_cll.CLLTokenizer", None]},
        "lang_tag_ids": tok.lang_tag_ids, "lang_tag": info.lang_tag, "max_source_subwords": max_source,
        "model_max_length": model.cfg.max_positions}, indent=1))
    for name in CODE_FILES:
        shutil.copyfile(REMOTE_CODE / name, out / name)
