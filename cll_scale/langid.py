"""Language identification for the off-target rate (paper §4: langdetect, seeded).

Two decisions are reported side by side:
* ``plain`` — langdetect over its 55 languages, as in the paper;
* ``restricted`` — the same detector with a prior over the model's own languages only, which
  fixes most of langdetect's confusions on short sentences (cs→sk/hr, ro→es, nl→no).
"""
from __future__ import annotations

from functools import lru_cache

from langdetect import DetectorFactory
from langdetect import detector_factory
from langdetect.lang_detect_exception import LangDetectException

DetectorFactory.seed = 0      # langdetect is randomised: unseeded labels change run to run

# Our codes -> langdetect's (it splits Chinese; everything else is ISO 639-1 already).
_ALIASES = {"zh": ("zh-cn", "zh-tw")}


def _to_ours(code: str) -> str:
    return "zh" if code.startswith("zh-") else code


@lru_cache(maxsize=1)
def _factory():
    detector_factory.init_factory()
    return detector_factory._factory


def supported(languages: list[str]) -> list[str]:
    known = set(_factory().langlist)
    return [x for x in languages if any(a in known for a in _ALIASES.get(x, (x,)))]


def detect(text: str, restrict_to: list[str] | None = None) -> str | None:
    """Detected language (our code), or None when the text has no letters to judge."""
    if not text or not text.strip():
        return None
    detector = _factory().create()
    if restrict_to:
        prior = {a: 1.0 for x in supported(restrict_to) for a in _ALIASES.get(x, (x,))}
        if prior:
            detector.set_prior_map(prior)
    detector.append(text)
    try:
        return _to_ours(detector.detect())
    except LangDetectException:
        return None
