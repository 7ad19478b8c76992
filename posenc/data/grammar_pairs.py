"""The embedded default parallel corpus: English-German sentence pairs from a small grammar.

No package on PyPI that we could find ships a real parallel corpus (Tatoeba, Europarl, ...)
inside its wheel under a licence that lets us read it (see docs/translation.md, "Translation
data"), so the default is generated, deterministically, from a hand-written grammar of
English and German. Every pair is grammatical in both languages and its German side is a
correct translation of the English side, with what makes translation more than word substitution:

- gender, case and number agreement: `a big dog` -> `ein großer Hund` (nominative),
  `sees a big dog` -> `sieht einen großen Hund` (accusative), `my old houses` -> `meine alten
  Häuser`; weak, mixed and strong adjective endings.
- verb agreement with the subject (`ich sehe`, `du siehst`, `er sieht`, `wir sehen`).
- word order: time adverbs move before the object (`sees the ball today` -> `sieht heute den
  Ball`), English `often` moves after the German verb, and subordinate clauses (`because`,
  `while`) put the verb last (`weil der Hund heute den Ball sieht`).

A sentence is one to six clauses joined by `and`, `but`, `because` and `while`, so lengths range
from ~20 to ~300 bytes: training on short pairs and testing on long ones is meaningful.

Generation uses `random.Random(seed).random()` only, whose sequence Python guarantees across
versions, so the corpus (and its sha256, pinned in the tests) is the same everywhere.
"""

from __future__ import annotations

import functools
import random
from typing import NamedTuple

# Bump when the grammar changes: the content hash changes with it anyway.
GRAMMAR_VERSION = 1
# Pairs per split, in the order they are generated (all pairs are distinct).
SPLIT_SIZES: dict[str, int] = {"train": 20000, "validation": 1000, "test": 1000}
# Probability of 1, 2, ... clauses in a sentence.
_CLAUSE_WEIGHTS = (0.40, 0.27, 0.15, 0.09, 0.05, 0.04)
_SEED = 20240519


class _Noun(NamedTuple):
    en: str
    en_pl: str
    gender: str  # "m", "f" or "n"
    de: str
    de_pl: str
    kind: str  # "animate", "food", "text" or "thing"


class _Verb(NamedTuple):
    en: str  # base form ("see"); the 3rd person singular adds "s" unless en_3sg is given
    en_3sg: str
    de: tuple[str, str, str, str]  # ich, du, er/sie/es, wir/sie
    objects: tuple[str, ...]  # noun kinds the verb takes as object


_NOUNS = (
    _Noun("dog", "dogs", "m", "Hund", "Hunde", "animate"),
    _Noun("cat", "cats", "f", "Katze", "Katzen", "animate"),
    _Noun("child", "children", "n", "Kind", "Kinder", "animate"),
    _Noun("teacher", "teachers", "m", "Lehrer", "Lehrer", "animate"),
    _Noun("woman", "women", "f", "Frau", "Frauen", "animate"),
    _Noun("man", "men", "m", "Mann", "Männer", "animate"),
    _Noun("girl", "girls", "n", "Mädchen", "Mädchen", "animate"),
    _Noun("brother", "brothers", "m", "Bruder", "Brüder", "animate"),
    _Noun("sister", "sisters", "f", "Schwester", "Schwestern", "animate"),
    _Noun("friend", "friends", "m", "Freund", "Freunde", "animate"),
    _Noun("doctor", "doctors", "m", "Arzt", "Ärzte", "animate"),
    _Noun("bird", "birds", "m", "Vogel", "Vögel", "animate"),
    _Noun("horse", "horses", "n", "Pferd", "Pferde", "animate"),
    _Noun("mouse", "mice", "f", "Maus", "Mäuse", "animate"),
    _Noun("apple", "apples", "m", "Apfel", "Äpfel", "food"),
    _Noun("cake", "cakes", "m", "Kuchen", "Kuchen", "food"),
    _Noun("banana", "bananas", "f", "Banane", "Bananen", "food"),
    _Noun("pear", "pears", "f", "Birne", "Birnen", "food"),
    _Noun("egg", "eggs", "n", "Ei", "Eier", "food"),
    _Noun("book", "books", "n", "Buch", "Bücher", "text"),
    _Noun("letter", "letters", "m", "Brief", "Briefe", "text"),
    _Noun("newspaper", "newspapers", "f", "Zeitung", "Zeitungen", "text"),
    _Noun("story", "stories", "f", "Geschichte", "Geschichten", "text"),
    _Noun("car", "cars", "n", "Auto", "Autos", "thing"),
    _Noun("house", "houses", "n", "Haus", "Häuser", "thing"),
    _Noun("table", "tables", "m", "Tisch", "Tische", "thing"),
    _Noun("chair", "chairs", "m", "Stuhl", "Stühle", "thing"),
    _Noun("door", "doors", "f", "Tür", "Türen", "thing"),
    _Noun("window", "windows", "n", "Fenster", "Fenster", "thing"),
    _Noun("ball", "balls", "m", "Ball", "Bälle", "thing"),
    _Noun("flower", "flowers", "f", "Blume", "Blumen", "thing"),
    _Noun("tree", "trees", "m", "Baum", "Bäume", "thing"),
    _Noun("picture", "pictures", "n", "Bild", "Bilder", "thing"),
    _Noun("key", "keys", "m", "Schlüssel", "Schlüssel", "thing"),
    _Noun("bag", "bags", "f", "Tasche", "Taschen", "thing"),
    _Noun("cup", "cups", "f", "Tasse", "Tassen", "thing"),
    _Noun("lamp", "lamps", "f", "Lampe", "Lampen", "thing"),
    _Noun("shoe", "shoes", "m", "Schuh", "Schuhe", "thing"),
    _Noun("hat", "hats", "m", "Hut", "Hüte", "thing"),
    _Noun("boat", "boats", "n", "Boot", "Boote", "thing"),
)

_ANY = ("animate", "food", "text", "thing")
_THINGS = ("food", "text", "thing")
_VERBS = (
    _Verb("see", "sees", ("sehe", "siehst", "sieht", "sehen"), _ANY),
    _Verb("find", "finds", ("finde", "findest", "findet", "finden"), _ANY),
    _Verb("look for", "looks for", ("suche", "suchst", "sucht", "suchen"), _ANY),
    _Verb("need", "needs", ("brauche", "brauchst", "braucht", "brauchen"), _ANY),
    _Verb("love", "loves", ("liebe", "liebst", "liebt", "lieben"), _ANY),
    _Verb("like", "likes", ("mag", "magst", "mag", "mögen"), _ANY),
    _Verb("paint", "paints", ("male", "malst", "malt", "malen"), _ANY),
    _Verb("draw", "draws", ("zeichne", "zeichnest", "zeichnet", "zeichnen"), _ANY),
    _Verb("buy", "buys", ("kaufe", "kaufst", "kauft", "kaufen"), _THINGS),
    _Verb("sell", "sells", ("verkaufe", "verkaufst", "verkauft", "verkaufen"), _THINGS),
    _Verb("have", "has", ("habe", "hast", "hat", "haben"), _ANY),
    _Verb("take", "takes", ("nehme", "nimmst", "nimmt", "nehmen"), _THINGS),
    _Verb("carry", "carries", ("trage", "trägst", "trägt", "tragen"), _ANY),
    _Verb("bring", "brings", ("bringe", "bringst", "bringt", "bringen"), _THINGS),
    _Verb("wash", "washes", ("wasche", "wäschst", "wäscht", "waschen"), ("animate", "thing")),
    _Verb("hold", "holds", ("halte", "hältst", "hält", "halten"), _ANY),
    _Verb("eat", "eats", ("esse", "isst", "isst", "essen"), ("food",)),
    _Verb("read", "reads", ("lese", "liest", "liest", "lesen"), ("text",)),
    _Verb("write", "writes", ("schreibe", "schreibst", "schreibt", "schreiben"), ("text",)),
    _Verb("open", "opens", ("öffne", "öffnest", "öffnet", "öffnen"), ("text", "thing")),
)

# (English, German stem).
_ADJECTIVES = (
    ("big", "groß"),
    ("small", "klein"),
    ("old", "alt"),
    ("young", "jung"),
    ("red", "rot"),
    ("green", "grün"),
    ("blue", "blau"),
    ("new", "neu"),
    ("beautiful", "schön"),
    ("tired", "müde"),
    ("heavy", "schwer"),
    ("cheap", "billig"),
    ("strange", "seltsam"),
    ("friendly", "freundlich"),
    ("hungry", "hungrig"),
    ("yellow", "gelb"),
    ("white", "weiß"),
    ("black", "schwarz"),
)

# (English, German, kind): "time" goes before a German object, "place" after it, "often" before
# the English verb.
_ADVERBIALS = (
    ("today", "heute", "time"),
    ("every day", "jeden Tag", "time"),
    ("in the morning", "am Morgen", "time"),
    ("in the evening", "am Abend", "time"),
    ("again", "wieder", "time"),
    ("often", "oft", "often"),
    ("in the garden", "im Garten", "place"),
    ("at home", "zu Hause", "place"),
    ("in the city", "in der Stadt", "place"),
    ("after school", "nach der Schule", "time"),
)

# Pronoun subjects: (English, German, person index into _Verb.de, English takes the 3sg form).
_PRONOUNS = (
    ("I", "ich", 0, False),
    ("you", "du", 1, False),
    ("he", "er", 2, True),
    ("she", "sie", 2, True),
    ("we", "wir", 3, False),
    ("they", "sie", 3, False),
)

# German determiners by case and gender ("pl": plural); a missing key is never drawn ("a" has no
# plural, a bare noun no singular).
_DE_DETERMINERS = {
    "the": {
        "nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
        "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
    },
    "this": {
        "nom": {"m": "dieser", "f": "diese", "n": "dieses", "pl": "diese"},
        "acc": {"m": "diesen", "f": "diese", "n": "dieses", "pl": "diese"},
    },
    "a": {
        "nom": {"m": "ein", "f": "eine", "n": "ein"},
        "acc": {"m": "einen", "f": "eine", "n": "ein"},
    },
    "my": {
        "nom": {"m": "mein", "f": "meine", "n": "mein", "pl": "meine"},
        "acc": {"m": "meinen", "f": "meine", "n": "mein", "pl": "meine"},
    },
    "your": {
        "nom": {"m": "dein", "f": "deine", "n": "dein", "pl": "deine"},
        "acc": {"m": "deinen", "f": "deine", "n": "dein", "pl": "deine"},
    },
    "": {"nom": {"pl": ""}, "acc": {"pl": ""}},  # bare plural: "dogs" -> "Hunde"
}
_EN_PLURAL_DETERMINER = {"the": "the", "this": "these", "my": "my", "your": "your", "": ""}
# Adjective endings: weak after der/dieser, mixed after ein/mein/dein, strong with no article.
_WEAK = {
    "nom": {"m": "e", "f": "e", "n": "e", "pl": "en"},
    "acc": {"m": "en", "f": "e", "n": "e", "pl": "en"},
}
_MIXED = {
    "nom": {"m": "er", "f": "e", "n": "es", "pl": "en"},
    "acc": {"m": "en", "f": "e", "n": "es", "pl": "en"},
}
_STRONG = {"nom": {"pl": "e"}, "acc": {"pl": "e"}}
_ENDINGS = {"the": _WEAK, "this": _WEAK, "a": _MIXED, "my": _MIXED, "your": _MIXED, "": _STRONG}
# Conjunctions: (English, German, German clause is subordinate (verb last), German comma).
_CONJUNCTIONS = (
    ("and", "und", False, ""),
    ("but", "aber", False, ","),
    ("because", "weil", True, ","),
    ("while", "während", True, ","),
)


class _Draw:
    """Uniform choices from `random.Random.random()`, the one stream Python keeps stable."""

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def index(self, n: int) -> int:
        return min(int(self._rng.random() * n), n - 1)

    def pick(self, items):
        return items[self.index(len(items))]

    def chance(self, p: float) -> bool:
        return self._rng.random() < p

    def weighted(self, weights: tuple[float, ...]) -> int:
        u = self._rng.random() * sum(weights)
        for i, w in enumerate(weights):
            u -= w
            if u < 0:
                return i
        return len(weights) - 1


def _adjective_form(stem: str, ending: str) -> str:
    # "müde" + "e" -> "müde", + "en" -> "müden": the stem's final e absorbs the ending's.
    return stem + (ending[1:] if stem.endswith("e") else ending)


def _noun_phrase(draw: _Draw, kinds: tuple[str, ...], case: str) -> tuple[str, str, int]:
    """(English, German, German verb person) of a random noun phrase in `case`."""
    noun = draw.pick([n for n in _NOUNS if n.kind in kinds])
    plural = draw.chance(0.3)
    det = draw.pick(
        ("the", "this", "my", "your", "") if plural else ("the", "this", "a", "my", "your")
    )
    adjective = draw.pick(_ADJECTIVES) if draw.chance(0.5) else None
    key = "pl" if plural else noun.gender
    en_words = [_EN_PLURAL_DETERMINER[det] if plural else det]
    de_words = [_DE_DETERMINERS[det][case][key]]
    if adjective is not None:
        en_words.append(adjective[0])
        de_words.append(_adjective_form(adjective[1], _ENDINGS[det][case][key]))
    en_words.append(noun.en_pl if plural else noun.en)
    de_words.append(noun.de_pl if plural else noun.de)
    if det == "a" and en_words[1][0] in "aeiou":
        en_words[0] = "an"
    return (
        " ".join(w for w in en_words if w),
        " ".join(w for w in de_words if w),
        3 if plural else 2,
    )


def _clause(draw: _Draw, subordinate: bool) -> tuple[str, str]:
    """One clause (English, German); German main clauses are verb-second, subordinate verb-last."""
    verb = draw.pick(_VERBS)
    if draw.chance(0.35):
        en_subj, de_subj, person, third = draw.pick(_PRONOUNS)
    else:
        en_subj, de_subj, person = _noun_phrase(draw, ("animate",), "nom")
        third = person == 2
    en_obj, de_obj, _ = _noun_phrase(draw, verb.objects, "acc")
    adverbial = draw.pick(_ADVERBIALS) if draw.chance(0.5) else None
    en_verb = verb.en_3sg if third else verb.en
    de_verb = verb.de[person]
    en_adv, de_adv, kind = adverbial if adverbial else ("", "", "")
    if kind == "often":
        en = [en_subj, en_adv, en_verb, en_obj]
    else:
        en = [en_subj, en_verb, en_obj, en_adv]
    time = de_adv if kind in ("time", "often") else ""
    place = de_adv if kind == "place" else ""
    if subordinate:
        de = [de_subj, time, de_obj, place, de_verb]
    else:
        de = [de_subj, de_verb, time, de_obj, place]
    return " ".join(w for w in en if w), " ".join(w for w in de if w)


def _capitalise(text: str) -> str:
    return text[:1].upper() + text[1:]


def _sentence(draw: _Draw) -> tuple[str, str]:
    clauses = draw.weighted(_CLAUSE_WEIGHTS) + 1
    en, de = _clause(draw, subordinate=False)
    after_subordinate = False
    for _ in range(clauses - 1):
        conj_en, conj_de, subordinate, comma = draw.pick(_CONJUNCTIONS)
        next_en, next_de = _clause(draw, subordinate)
        # A German subordinate clause is closed by a comma, whatever follows it.
        comma = "," if after_subordinate else comma
        en = f"{en} {conj_en} {next_en}"
        de = f"{de}{comma} {conj_de} {next_de}"
        after_subordinate = subordinate
    return _capitalise(en) + ".", _capitalise(de) + "."


def generate_pairs(
    sizes: dict[str, int] | None = None, seed: int = _SEED
) -> dict[str, list[tuple[str, str]]]:
    """Generates the corpus: distinct (English, German) pairs per split.

    Args:
      sizes: pairs per split, in generation order; None means `SPLIT_SIZES`.
      seed: generator seed (the default corpus uses the module's fixed seed).

    Returns:
      {split: [(english, german), ...]}; no English sentence occurs twice in the corpus, so no
      evaluation source is seen in training.
    """
    sizes = dict(SPLIT_SIZES if sizes is None else sizes)
    generated = _generate(tuple(sizes.items()), seed)
    return {split: list(pairs) for split, pairs in generated}


# Generating the default corpus takes ~1 s; a process that opens it twice pays once.
@functools.lru_cache(maxsize=2)
def _generate(sizes: tuple[tuple[str, int], ...], seed: int) -> tuple:
    draw = _Draw(seed)
    seen: set[str] = set()
    out = []
    for split, size in sizes:
        pairs: list[tuple[str, str]] = []
        while len(pairs) < size:
            en, de = _sentence(draw)
            if en not in seen:
                seen.add(en)
                pairs.append((en, de))
        out.append((split, tuple(pairs)))
    return tuple(out)
