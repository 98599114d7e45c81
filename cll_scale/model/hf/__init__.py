"""The model as a ``transformers`` remote-code package: the files that ``cll_scale.model.hf_export``
copies into a transformers directory, beside its ``config.json``, ``model.safetensors`` and
SentencePiece model. They import nothing of cll_scale (whoever loads that directory may not have
it), only torch, sentencepiece and transformers (5.x); nothing here imports them on its own.
"""
