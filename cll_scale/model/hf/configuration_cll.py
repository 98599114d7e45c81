"""Configuration of a cll-scale model exported for transformers (``AutoConfig``, remote code).

Written by cll-scale's exporter: the Transformer's sizes, where the Central Language-aware Layers
are (Qu & Watanabe 2022, Eq. 3), the languages and their tags, and the decoding limits of
cll-translate (an output ends by ``max_len_a * source length + max_len_b`` subwords).
"""
from transformers import PretrainedConfig


class CLLConfig(PretrainedConfig):
    model_type = "cll_transformer"

    def __init__(self, vocab_size=8000, d_model=256, n_heads=4, ffn_dim=1024, encoder_layers=3, decoder_layers=3,
                 max_positions=1024, pre_norm=True, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
                 cll_layers=(), lsl_dim=256, cll_dropout=0.2, lsl_dropout="authors", residual_sublayer=None,
                 residual_layer=None, languages=(), lsl_languages=(), lang_tag=True, lang_tag_ids=None,
                 use_lsl=True, max_len_a=1.5, max_len_b=10, min_len=1, max_source_subwords=None,
                 pad_token_id=0, bos_token_id=2, eos_token_id=3, decoder_start_token_id=2, **kwargs):
        self.vocab_size, self.d_model, self.n_heads, self.ffn_dim = vocab_size, d_model, n_heads, ffn_dim
        self.encoder_layers, self.decoder_layers, self.max_positions = encoder_layers, decoder_layers, max_positions
        self.pre_norm, self.dropout = pre_norm, dropout
        self.attention_dropout, self.activation_dropout = attention_dropout, activation_dropout
        # decoder layers (0-based) whose FFN is a CLL; the LSLs' inner size and dropout
        self.cll_layers, self.lsl_dim, self.cll_dropout = list(cll_layers), lsl_dim, cll_dropout
        # "authors": the FFN and the LSL output each get their own dropout once, then are added;
        # "double": the sum is dropped again by the decoder layer (training only)
        self.lsl_dropout = lsl_dropout
        # the encoder layer whose "ffn" or "self_attn" sublayer has no residual (Liu et al. 2021)
        self.residual_sublayer, self.residual_layer = residual_sublayer, residual_layer
        # target languages in the model's order (tgt_lang ids), those with an LSL (all but the
        # central language) and each language's tag id (<2xx>)
        self.languages, self.lsl_languages = list(languages), list(lsl_languages)
        self.lang_tag, self.lang_tag_ids = lang_tag, dict(lang_tag_ids or {})
        self.use_lsl = use_lsl
        self.max_len_a, self.max_len_b, self.min_len = max_len_a, max_len_b, min_len
        self.max_source_subwords = max_source_subwords
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         decoder_start_token_id=decoder_start_token_id, is_encoder_decoder=True, **kwargs)
