"""The tokenizer of a cll-scale model exported for transformers (``AutoTokenizer``, remote code).

A source sentence is encoded as cll-scale trained the model: ``<2tgt> subwords </s>`` (or
``subwords </s>`` for a model trained without tags), its subwords SentencePiece's own, cut to
``max_source_subwords``. The target language is ``tgt_lang``: set it on the tokenizer
(``tokenizer.tgt_lang = "de"``) or per call (``tokenizer(texts, tgt_lang="de")``). The tags are
SentencePiece control symbols: never read from typed text, dropped by ``decode``.
"""
import os
import shutil

import sentencepiece as spm
from transformers import PreTrainedTokenizer

VOCAB_FILES_NAMES = {"vocab_file": "spm.model"}


class CLLTokenizer(PreTrainedTokenizer):
    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, lang_tag_ids=None, lang_tag=True, tgt_lang=None, max_source_subwords=None,
                 bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>", **kwargs):
        self.vocab_file = vocab_file
        self.sp = spm.SentencePieceProcessor(model_file=str(vocab_file))
        self.lang_tag_ids = dict(lang_tag_ids or {})
        self.lang_tag, self.max_source_subwords = lang_tag, max_source_subwords
        self._tgt_lang = None
        # SentencePiece splits the whole text: an added token's string typed in it stays text.
        kwargs.setdefault("split_special_tokens", True)
        super().__init__(bos_token=bos_token, eos_token=eos_token, unk_token=unk_token, pad_token=pad_token,
                         lang_tag_ids=self.lang_tag_ids, lang_tag=lang_tag, max_source_subwords=max_source_subwords,
                         **kwargs)
        self.tgt_lang = tgt_lang

    @property
    def tgt_lang(self):
        return self._tgt_lang

    @tgt_lang.setter
    def tgt_lang(self, code):
        if code is not None and code not in self.lang_tag_ids:
            raise ValueError(f"unknown target language {code!r}; this model knows {sorted(self.lang_tag_ids)}")
        self._tgt_lang = code

    def __call__(self, *args, tgt_lang=None, **kwargs):
        if tgt_lang is None:
            return super().__call__(*args, **kwargs)
        before, self.tgt_lang = self.tgt_lang, tgt_lang
        try:
            return super().__call__(*args, **kwargs)
        finally:
            self.tgt_lang = before

    @property
    def vocab_size(self):
        return self.sp.get_piece_size()

    def get_vocab(self):
        return {self.sp.id_to_piece(i): i for i in range(self.vocab_size)}

    def _tokenize(self, text, **kwargs):
        return self.sp.encode(text, out_type=str)

    def _convert_token_to_id(self, token):
        return self.sp.piece_to_id(token)

    def _convert_id_to_token(self, index):
        return self.sp.id_to_piece(index)

    def convert_tokens_to_string(self, tokens):
        return self.sp.decode_pieces(tokens)

    def _decode(self, token_ids, skip_special_tokens=False, **kwargs):
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        if skip_special_tokens:
            ids = [i for i in ids if i not in set(self.all_special_ids)]
        return self.sp.decode(ids)

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        """``[<2tgt>] subwords </s>`` (a pair: the two joined, as one source)."""
        ids = list(token_ids_0) + list(token_ids_1 or [])
        if self.max_source_subwords is not None:
            ids = ids[:self.max_source_subwords]
        if not self.lang_tag:
            return ids + [self.eos_token_id]
        if self.tgt_lang is None:
            raise ValueError("set the target language first: tokenizer.tgt_lang = 'de', or tokenizer(texts, "
                             "tgt_lang='de')")
        return [self.lang_tag_ids[self.tgt_lang]] + ids + [self.eos_token_id]

    def get_special_tokens_mask(self, token_ids_0, token_ids_1=None, already_has_special_tokens=False):
        if already_has_special_tokens:
            return [int(i in set(self.all_special_ids) or i in self.lang_tag_ids.values()) for i in token_ids_0]
        n = min(len(token_ids_0) + len(token_ids_1 or []), self.max_source_subwords or 1 << 62)
        return ([1] if self.lang_tag else []) + [0] * n + [1]

    def num_special_tokens_to_add(self, pair=False):
        return 2 if self.lang_tag else 1

    def save_vocabulary(self, save_directory, filename_prefix=None):
        out = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + "spm.model")
        if os.path.abspath(out) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, out)
        return (out,)
