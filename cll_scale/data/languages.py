"""Language codes, directions and the target-language tag convention (defined once, here).

The target language is given to the model twice:
  * as the first source token ``<2xx>`` (Johnson et al. 2017; paper §3), a SentencePiece
    *control* symbol inserted by id, never parsed from user text;
  * as an integer id per sentence (``tgt_lang``), an index into the manifest's language list,
    which selects the language-specific layer (LSL) of paper Eq. (3).
"""
from __future__ import annotations

import re

# ISO 639-1 codes (plus the deprecated ``sh`` that OPUS-100 uses). A code outside this set is
# most often a typo or a stray file (``train.en.bak``), so it is an error unless the user
# allows it explicitly.
ISO_639_1 = frozenset("""
aa ab ae af ak am an ar as av ay az ba be bg bh bi bm bn bo br bs ca ce ch co cr cs cu cv cy
da de dv dz ee el en eo es et eu fa ff fi fj fo fr fy ga gd gl gn gu gv ha he hi ho hr ht hu
hy hz ia id ie ig ii ik io is it iu ja jv ka kg ki kj kk kl km kn ko kr ks ku kv kw ky la lb
lg li ln lo lt lu lv mg mh mi mk ml mn mr ms mt my na nb nd ne ng nl nn no nr nv ny oc oj om
or os pa pi pl ps pt qu rm rn ro ru rw sa sc sd se sg sh si sk sl sm sn so sq sr ss st su sv
sw ta te tg th ti tk tl tn to tr ts tt tw ty ug uk ur uz ve vi vo wa wo xh yi yo za zh zu
""".split())

_CODE_RE = re.compile(r"^[a-z]{2,3}(_[a-zA-Z0-9]{2,8})?$")


class LanguageError(ValueError):
    """An unknown, malformed or duplicated language code."""


def check_language(code: str, allowed_extra: frozenset[str] | set[str] = frozenset(), where: str = "") -> str:
    """Return ``code`` if it is a known language code, else raise :class:`LanguageError`."""
    place = f" ({where})" if where else ""
    if not _CODE_RE.match(code):
        raise LanguageError(f"malformed language code {code!r}{place}: expected e.g. 'de' or 'pt_br'")
    base = code.split("_")[0]
    if code in allowed_extra or base in ISO_639_1:
        return code
    raise LanguageError(
        f"unknown language code {code!r}{place}: not an ISO 639-1 code; "
        f"pass --allow-lang {code} if it is intended")


def check_languages(codes, allowed_extra=frozenset(), where: str = "") -> list[str]:
    """Validate a list of codes: each known, none repeated (case-insensitively)."""
    seen: dict[str, str] = {}
    for code in codes:
        check_language(code, allowed_extra, where)
        key = code.lower()
        if key in seen:
            raise LanguageError(f"duplicate language code {code!r}{' (' + where + ')' if where else ''}")
        seen[key] = code
    return list(codes)


def lang_tag(code: str) -> str:
    """The control symbol that asks for target language ``code``: ``<2de>``."""
    return f"<2{code}>"


class Direction(str):
    """A translation direction ``src -> tgt``. It is its own written form, ``"src-tgt"`` (a
    ``str``), so manifests, JSON, dictionary keys and flags hold it as they always have, while
    code reads ``.src`` and ``.tgt`` instead of splitting the string."""

    __slots__ = ()

    def __new__(cls, src: str, tgt: str) -> "Direction":
        return super().__new__(cls, f"{src}-{tgt}")

    @property
    def src(self) -> str:
        return self.partition("-")[0]

    @property
    def tgt(self) -> str:
        return self.partition("-")[2]

    def __iter__(self):
        """``src, tgt = Direction.parse("de-fr")``."""
        return iter((self.src, self.tgt))

    def __repr__(self) -> str:
        return f"Direction({self.src!r}, {self.tgt!r})"

    def __reduce__(self):            # pickles (process pools) as a Direction, not as its characters
        return Direction, (self.src, self.tgt)

    @classmethod
    def parse(cls, text: str) -> "Direction":
        if isinstance(text, Direction):
            return text
        parts = text.strip().split("-")
        if len(parts) != 2 or not all(parts):
            raise LanguageError(f"malformed direction {text!r}: expected 'src-tgt', e.g. 'de-fr'")
        if parts[0] == parts[1]:
            raise LanguageError(f"direction {text!r} translates a language into itself")
        return cls(parts[0], parts[1])

    def reverse(self) -> "Direction":
        return Direction(self.tgt, self.src)


def targets_by_source(directions: list[Direction]) -> dict[str, list[str]]:
    """Each source language's supervised targets, in the order the directions are given."""
    targets: dict[str, list[str]] = {}
    for d in directions:
        targets.setdefault(d.src, []).append(d.tgt)
    return targets


def strict_dependence(directions: list[Direction]) -> bool:
    """The paper's *strict dependence* (§4.1, the triangle against the square): every source
    language is trained into exactly one target, so a model can answer in the right language
    without reading the tag, and a zero-shot direction collapses into that one target."""
    targets = targets_by_source(directions)
    return bool(targets) and all(len(t) == 1 for t in targets.values())
