"""Language identification for the off-target rate (paper §4: langdetect, seeded).

langdetect's decisions, reported side by side:
* ``plain`` — langdetect over its 55 languages, as in the paper;
* ``restricted`` — the same detector with a prior over the model's own languages only, which
  fixes most of langdetect's confusions on short sentences (cs→sk/hr, ro→es, nl→no).

A second identifier, lingua (``lingua-language-detector``: n-gram models inside the wheel, in
Rust, ~0.1 ms a sentence against langdetect's ~3 ms), is built for short and mixed-language text:
:class:`Lingua` decides among the model's languages only, and labels the spans of a sentence
that switches language mid-way.
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


class Lingua:
    """lingua restricted to ``languages`` (our codes; those lingua does not know are left out,
    listed in :attr:`unknown`). Needs at least two languages it knows."""

    def __init__(self, languages: list[str]):
        from lingua import IsoCode639_1, Language, LanguageDetectorBuilder
        known = {name.lower(): getattr(IsoCode639_1, name) for name in dir(IsoCode639_1) if name.isupper()}
        supported = {lang.iso_code_639_1.name.lower() for lang in Language.all()}
        self.languages = [x for x in dict.fromkeys(languages) if x in supported and x in known]
        self.unknown = [x for x in dict.fromkeys(languages) if x not in self.languages]
        if len(self.languages) < 2:
            raise ValueError(f"lingua needs two or more languages it knows; of {', '.join(languages)} "
                             f"it knows {', '.join(self.languages) or 'none'}")
        self._detector = LanguageDetectorBuilder.from_languages(
            *(Language.from_iso_code_639_1(known[x]) for x in self.languages)).build()

    @staticmethod
    def _code(language) -> str | None:
        return None if language is None else language.iso_code_639_1.name.lower()

    def detect_many(self, texts: list[str]) -> list[str | None]:
        """One language per text (None for text without letters). One thread: evaluation runs
        several scoring processes at once already."""
        return [self._code(self._detector.detect_language_of(t)) if t and t.strip() else None for t in texts]

    def spans(self, text: str) -> list[tuple[str, int]]:
        """The runs of one language in ``text``: (language, words), in order."""
        if not text or not text.strip():
            return []
        return [(self._code(r.language), r.word_count) for r in self._detector.detect_multiple_languages_of(text)]
