"""cll-scale: multilingual NMT with Central Language-aware Layers (Qu & Watanabe, COLING 2022)."""
__version__ = "0.1.0"
