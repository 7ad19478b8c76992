"""The retrieval tasks: passkey (Landmark Attention) and RULER's needle-in-a-haystack family.

Each task is data (:class:`Task`); :func:`draw` turns a task and a random generator into the
parts of one trial (:class:`Draw`): the text before the context, the needles, the text after it
and the expected answers. Where the filler goes and how long the prompt is, in the model's own
tokens, is :mod:`posenc.retrieval.prompt`'s business.

**passkey** (Mohtashami & Jaggi 2023, Landmark Attention, reused by Position Interpolation and
YaRN): five lines joined by newlines: the task description, filler, the key sentence
``"The pass key is {k}. Remember it. {k} is the pass key."`` with ``k`` uniform in 1..50000, more
filler, and ``"What is the pass key? The pass key is"``. The filler is the sentence group
``"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."``
repeated with single spaces; like the original, the filler after the key starts again at the
beginning of the repeated text. Scored as the original scores it: the first run of digits in
the output must equal the key.

**RULER** (Hsieh et al. 2024, its ``synthetic.yaml`` and ``constants.py``): a needle is
``"One of the special magic {values} for {key} is: {value}."``; the prompt is RULER's template
with its answer prefix (the form RULER gives base models)::

    Some special magic {values} are hidden within the following text. Make sure to memorize it.
    I will quiz you about the {values} afterwards.\\n{context}\\nWhat are all the special magic
    {values} for {query} mentioned in the provided text? The special magic {values} for {query}
    mentioned in the provided text are

made singular ("A special magic number is hidden ... What is the special magic number for
... is") when one value is asked for, exactly as RULER rewrites it. Haystacks: ``noise`` (the
passkey filler sentence group, one per line), ``essay`` (a text source; RULER's is Paul
Graham's essays, ours any posenc text source), ``needle`` (other needles with other keys, one
per line: RULER's "multikey" distractors). Keys are adjective-noun words, 7-digit numbers or
UUIDs; values 7-digit numbers or UUIDs. Scored with RULER's ``string_match_all``: the share of
expected values found (case-insensitive substring) in the output.

**vt** (RULER's variable tracking, one chain of four hops): ``VAR ABCDE = 12345`` and then
``VAR FGHIJ = VAR ABCDE`` ... one statement per line of the noise haystack, in order, the
template ``"Memorize and track the chain(s) of variable assignment hidden in the following
text.\n\n{context}\nQuestion: Find all variables that are assigned the value {query} in the
text above."`` with its answer prefix; every name of the chain is expected (``string_match_all``).
RULER prepends an in-context example; we do not.

**cwe** (RULER's common words extraction): a numbered list ``"1. w 2. w 3. w ..."`` of
words drawn from a pool, ten of them (the common words) repeated 6 times each and every other
one once (30 and 3 times from length 4096 on, as RULER switches at that ``max_seq_length``), in
a random order, under RULER's template ``"Below is a numbered list of words. In these words,
some appear more often than others. Memorize the ones that appear most often.\n{context}\n
Question: What are the 10 most common words in the above list?"`` and its answer prefix; the
ten common words are expected (``string_match_all``). As RULER, the list takes as many words as
fit the length.

**fwe** (RULER's frequent words extraction): a text of coded words (2000 random six-letter
lowercase strings, the most frequent replaced by ``"..."``, noise) where the word of rank ``k``
appears ``floor(n k^-2 / zeta(2))`` times (a Zipf law, RULER's ``alpha = 2``), shuffled and
joined by spaces, under RULER's template ``"Read the following coded text and track the
frequency of each coded word. Find the three most frequently appeared coded words.
{context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are
the three most frequently appeared words in the above coded text?"`` and its answer prefix; the
words of ranks 2-4 are expected (``string_match_all``). As RULER, ``n`` is the largest that
fits the length, and at least :data:`FWE_MIN_WORDS`, below which the fourth most frequent
coded word can tie the fifth (the answer would not be unique).

**qa_1**, **qa_2** (RULER's QA over SQuAD and HotpotQA): a question asked of documents, the
question's own and distractors; their data and documents are :mod:`posenc.retrieval.qa`'s, the
prompt's exact length :mod:`posenc.retrieval.prompt`'s; scored with ``string_match_part``.

cwe and fwe have no needle: depth leaves their prompt unchanged (:attr:`Task.has_depth`).

Departures, all deliberate: keys are drawn from our own word lists (RULER uses wonderwords'
adjective and noun lists); filler is cut at a token rather than at a whole sentence, so the
prompt has exactly the requested length in the model's tokens; the needle being asked about
is placed at the requested depth and the other needles at depths drawn from the trial's seed
(RULER draws every needle's depth); cwe's words are hyphenated adjective-noun and noun-noun
pairs of our lists (RULER's are single words of wonderwords' lists), none a substring of another
so that RULER's substring match cannot credit a wrong word, and without RULER's in-context
example; cwe's and fwe's lists stop at the largest count that fits, and the prompt is completed
to exactly the requested length with space tokens after the list (fewer than one more list
entry's tokens; RULER's prompts fall short of its length instead).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable

import numpy as np

from posenc.retrieval import qa as _qa

# -- Landmark Attention's passkey prompt (llama/run_test.py of epfml/landmark-attention) ------
PASSKEY_DESCRIPTION = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "them. I will quiz you about the important information there."
)
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_LINE = "The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = "What is the pass key? The pass key is"
PASSKEY_MAX = 50000  # keys are uniform in 1 .. 50000

# -- RULER's niah task (scripts/data/synthetic/constants.py and niah.py) -----------------------
NEEDLE = "One of the special magic {type_v} for {key} is: {value}."
NIAH_TEMPLATE = (
    "Some special magic {type_v} are hidden within the following text. Make sure to memorize "
    "it. I will quiz you about the {type_v} afterwards.\n{context}\nWhat are all the special "
    "magic {type_v} for {query} mentioned in the provided text?"
)
NIAH_ANSWER_PREFIX = " The special magic {type_v} for {query} mentioned in the provided text are"

# -- RULER's variable tracking (variable_tracking.py; constants.py's template and prefix) -------
VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
    "{context}\nQuestion: Find all variables that are assigned the value {query} in the text "
    "above."
)
VT_ANSWER_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
    "variables are assigned the value {query}, they are: "
)

# -- RULER's common and frequent words extraction (common_words_extraction.py,
# freq_words_extraction.py; constants.py's templates and answer prefixes) -------------------
CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most "
    "common words in the above list?"
)
CWE_ANSWER_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
CWE_COMMON = 10  # RULER's num_cw
# (repeats of a common word, of an uncommon one): RULER's (6, 1) below max_seq_length 4096,
# its freq_cw and freq_ucw (30, 3) from there on.
CWE_REPEATS = {"short": (6, 1), "long": (30, 3)}
CWE_LONG = 4096
FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three "
    "most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. "
    "Please ignore the dots '....'. What are the three most frequently appeared words in the "
    "above coded text?"
)
FWE_ANSWER_PREFIX = (
    " Answer: According to the coded text above, the three most frequently appeared words are:"
)
# RULER's vocab_size (its first default; the later one, max_seq_length // 50, draws texts of the
# same law: counts vanish past rank sqrt(n / zeta(2)), fewer words than either), coded_wordlen
# and alpha.
FWE_VOCAB, FWE_WORD_LEN, FWE_ALPHA = 2000, 6, 2.0
FWE_ZETA = np.pi**2 / 6  # zeta(2), the Zipf law's normaliser at alpha = 2
# The fewest words n for which every n' >= n puts rank 4 strictly above rank 5:
# floor(x / 16) > floor(x / 25) whenever x (1/16 - 1/25) >= 1, x = n / zeta(2).
FWE_MIN_WORDS = int(np.ceil(FWE_ZETA / (1 / 16 - 1 / 25)))

HAYSTACKS = ("passkey", "noise", "essay", "needle", "words", "coded", "documents")
KINDS = ("words", "numbers", "uuids")
METRICS = ("first_integer", "all", "part")

# Our own adjective and noun lists for word keys (RULER draws adjective-noun pairs).
_ADJECTIVES = (
    "abundant acidic agile ancient anxious bitter blushing brave brief bright calm cheerful "
    "clever cold crisp curious damp dazzling eager elegant faint fierce fluffy fragile gentle "
    "gleaming golden grumpy hollow humble icy jolly lively lucky mellow misty noisy odd "
    "polite proud quiet rapid rusty shy silent sleepy smooth sour steady sturdy swift tame "
    "tender thirsty tiny vivid wary wicked witty young zealous"
).split()
_NOUNS = (
    "anchor apple badger banjo basket beacon blanket bottle breeze bucket cabin candle canyon "
    "carpet castle cedar cherry cliff cloud comet compass cookie crayon desert dolphin dragon "
    "engine falcon feather forest fossil garden glacier harbor helmet island jacket kettle "
    "lantern lemon lizard magnet meadow mirror monkey needle orchard otter pebble pepper "
    "piano pillow planet pumpkin rabbit ribbon river saddle shadow spider tiger tunnel violin "
    "walrus whistle window"
).split()
WORDS = tuple(sorted({f"{a}-{n}" for a in _ADJECTIVES for n in _NOUNS}))
# cwe's pool: adjective-noun and noun-noun pairs, leaving out the adjectives that end another
# one ("agile" in "fragile"), so no word of the pool is a substring of another.
_CWE_FIRST = [w for w in _ADJECTIVES if not any(v != w and v.endswith(w) for v in _ADJECTIVES)]
CWE_WORDS = tuple(sorted({f"{a}-{n}" for a in _CWE_FIRST + _NOUNS for n in _NOUNS if a != n}))


@dataclasses.dataclass(frozen=True)
class Task:
    """One retrieval task.

    Attributes:
      name: the task's name (RULER's where it has one).
      haystack: ``"passkey"`` (Landmark's filler: the noise sentences joined by spaces, restarted
        after the key), ``"noise"`` (RULER's: the same sentences, one per line), ``"essay"`` (a
        text source), ``"needle"`` (distractor needles, one per line), or the list that is
        the whole context of cwe (``"words"``) and fwe (``"coded"``).
      key_type, value_type: ``"words"``, ``"numbers"`` or ``"uuids"`` (unused by passkey).
      num_keys: needles with distinct keys (RULER's ``num_needle_k``).
      num_values: values per key (``num_needle_v``).
      num_queries: keys asked about (``num_needle_q``).
      tokens_to_generate: the greedy continuation's length in the model's tokens (Landmark: 10;
        RULER's niah: 128, cwe: 120, fwe: 50); raised to the answer's own length plus 2
        where that is longer.
      metric: ``"first_integer"`` (Landmark), ``"all"`` (RULER's ``string_match_all``) or
        ``"part"`` (``string_match_part``).
      hops: variable tracking's assignments after the first (RULER's ``num_hops``; 0: a needle
        task).
      dataset: the QA tasks' data set (``"squad"``, ``"hotpotqa"``; :mod:`posenc.retrieval.qa`),
        whose documents are the context (``haystack="documents"``); empty for the others.
    """

    name: str
    haystack: str
    key_type: str = "words"
    value_type: str = "numbers"
    num_keys: int = 1
    num_values: int = 1
    num_queries: int = 1
    tokens_to_generate: int = 128
    metric: str = "all"
    hops: int = 0
    dataset: str = ""

    @property
    def needs_text(self) -> bool:
        """Whether the haystack is read from a text source."""
        return self.haystack == "essay"

    @property
    def has_depth(self) -> bool:
        """Whether a needle goes at a depth (cwe's and fwe's prompts ignore it)."""
        return self.haystack not in ("words", "coded")


def _niah(name, haystack, key="words", value="numbers", k=1, v=1, q=1) -> Task:
    return Task(name, haystack, key, value, max(k, q), v, q)


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task("passkey", "passkey", tokens_to_generate=10, metric="first_integer"),
        _niah("niah_single_1", "noise"),
        _niah("niah_single_2", "essay"),
        _niah("niah_single_3", "essay", value="uuids"),
        _niah("niah_multikey_1", "essay", k=4),
        _niah("niah_multikey_2", "needle"),
        _niah("niah_multikey_3", "needle", key="uuids", value="uuids"),
        _niah("niah_multivalue", "essay", v=4),
        _niah("niah_multiquery", "essay", q=4),
        Task("vt", "noise", tokens_to_generate=50, hops=4),
        Task("cwe", "words", tokens_to_generate=120),
        Task("fwe", "coded", tokens_to_generate=50),
        Task("qa_1", "documents", tokens_to_generate=32, metric="part", dataset="squad"),
        Task("qa_2", "documents", tokens_to_generate=32, metric="part", dataset="hotpotqa"),
    )
}
NAMES: tuple[str, ...] = tuple(TASKS)


def get(name: str) -> Task:
    """The task called ``name``; a one-line ``ValueError`` listing the names otherwise."""
    if name not in TASKS:
        raise ValueError(f"unknown retrieval task {name!r}; allowed: {', '.join(NAMES)}")
    return TASKS[name]


@dataclasses.dataclass(frozen=True)
class Draw:
    """The text parts of one trial, before any filler.

    Attributes:
      head: the text before the context (its trailing newline included).
      needles: the needle sentences, in the order they are inserted.
      answer_needle: the index in ``needles`` of the needle placed at the requested depth (an
        answer's needle); the others go at ``other_depths``.
      other_depths: depths in [0, 1] of the other needles (same order as ``needles`` without
        ``answer_needle``).
      tail: the text after the context (its leading newline included), ending where the answer
        should follow.
      answers: the strings the output must contain (all of them, RULER; the key, passkey).
      joiner: what separates filler and needles (``"\\n"`` for line haystacks, ``" "`` for text).
      keys: the needles' keys (distractors never reuse one).
      ordered: the needles keep their order in the context (a chain of assignments): the
        answer needle is the first, at the depth, and ``other_depths`` are fractions of the
        context after it.
      items: cwe and fwe (no needles, no filler): ``n -> context``, the list built of ``n``
        drawn items (cwe: uncommon words beside the common ones; fwe: RULER's ``num_words``);
        :func:`posenc.retrieval.prompt.build` takes the largest ``n`` that fits.
      min_items, max_items: the range of ``n`` (``max_items`` None: no bound).
      documents: the QA tasks (no needles, no filler): ``(n, depth) -> texts``, the ``n``
        documents of the context in order, the answering one at ``depth`` (``min_items`` of
        them are the question's own, ``max_items`` all there are).
      spare: the QA tasks: ``(n, k) -> texts``, the ``k`` distractors that follow the ``n``
        documents' (the prompt ends its context with a part of them).
    """

    head: str
    needles: tuple[str, ...]
    answer_needle: int
    other_depths: tuple[float, ...]
    tail: str
    answers: tuple[str, ...]
    joiner: str
    keys: tuple[str, ...] = ()
    ordered: bool = False
    items: Callable[[int], str] | None = None
    min_items: int = 0
    max_items: int | None = None
    documents: Callable[[int, float], list[str]] | None = None
    spare: Callable[[int, int], list[str]] | None = None


# The longest value of each kind (bounds on a prompt's fixed part).
LONGEST = {
    "words": max(WORDS, key=len),
    "numbers": "9999999",
    "uuids": "ffffffff-ffff-4fff-bfff-ffffffffffff",
    "passkey": str(PASSKEY_MAX),
}


def random_value(kind: str, rng: np.random.Generator | None) -> str:
    """A key or value of ``kind``: an adjective-noun word, a 7-digit number (RULER's) or a
    version-4 UUID; with ``rng=None`` the longest of its kind (:data:`LONGEST`)."""
    if rng is None:
        return LONGEST[kind]
    if kind == "words":
        return WORDS[int(rng.integers(len(WORDS)))]
    if kind == "numbers":
        return str(int(rng.integers(10**6, 10**7)))
    if kind == "uuids":
        return str(uuid.UUID(int=int.from_bytes(rng.bytes(16), "big"), version=4))
    raise ValueError(f"needle kind must be one of {', '.join(KINDS)}, got {kind!r}")


def draw(
    task: Task,
    rng: np.random.Generator | None,
    length: int | None = None,
    *,
    qa: _qa.QAData | None = None,
    trial: int = 0,
) -> Draw:
    """The parts of one trial of ``task`` drawn from ``rng`` (module docstring); with
    ``rng=None`` every key and value is the longest of its kind, the first keys are queried and
    the other needles sit at depth 0 (a bound on the fixed part of the task's prompts).
    ``length`` (the prompt's tokens) sets cwe's repeats (RULER's switch at 4096; None: the
    short setting). The QA tasks read ``qa`` (their data set) and ask its question ``trial``.
    """
    if task.dataset:
        return _question(task, qa, rng, trial)
    if task.haystack == "words":
        return _common_words(rng, length)
    if task.haystack == "coded":
        return _frequent_words(rng)
    if task.name == "passkey":
        key = (
            random_value("passkey", None)
            if rng is None
            else str(int(rng.integers(1, PASSKEY_MAX + 1)))
        )
        return Draw(
            head=PASSKEY_DESCRIPTION + "\n",
            needles=("\n" + PASSKEY_LINE.format(key=key) + "\n",),
            answer_needle=0,
            other_depths=(),
            tail="\n" + PASSKEY_QUESTION,
            answers=(key,),
            joiner="\n",
        )
    if task.hops:
        return _variable_tracking(task, rng)
    keys: list[str] = []
    while len(keys) < task.num_keys:  # distinct keys, so a query names one needle's key
        key = random_value(task.key_type, rng)
        if key not in keys or rng is None:
            keys.append(key)
    values = [[random_value(task.value_type, rng) for _ in range(task.num_values)] for _ in keys]
    if rng is None:
        queried = list(range(task.num_queries))
    else:
        queried = sorted(int(i) for i in rng.choice(len(keys), task.num_queries, replace=False))
    joiner = " " if task.haystack == "essay" else "\n"
    needles, first_answer = [], None
    for i, key in enumerate(keys):
        for value in values[i]:
            if i in queried and first_answer is None:
                first_answer = len(needles)
            needles.append(NEEDLE.format(type_v=task.value_type, key=key, value=value))
    needles = [joiner + n + joiner for n in needles]
    count = len(needles) - 1
    others = (0.0,) * count if rng is None else tuple(float(x) for x in rng.uniform(0, 1, count))
    query_keys = [keys[i] for i in queried]
    query = (
        query_keys[0]
        if len(query_keys) == 1
        else ", ".join(query_keys[:-1]) + ", and " + query_keys[-1]
    )
    template, type_v = NIAH_TEMPLATE + NIAH_ANSWER_PREFIX, task.value_type
    if task.num_queries * task.num_values == 1:  # RULER's singular rewrite
        template = template.replace("Some", "A").replace("are all", "is").replace("are", "is")
        type_v = type_v[:-1]
    head, tail = template.split("{context}")
    return Draw(
        head=head.format(type_v=type_v),
        needles=tuple(needles),
        answer_needle=first_answer,
        other_depths=others,
        tail=tail.format(type_v=type_v, query=query),
        answers=tuple(v for i in queried for v in values[i]),
        joiner=joiner,
        keys=tuple(keys),
    )


def _variable_tracking(task: Task, rng: np.random.Generator | None) -> Draw:
    """RULER's variable tracking without its in-context example: one chain ``VAR A = 12345``,
    ``VAR B = VAR A``, ... of ``hops + 1`` distinct five-letter names, one statement per line of
    a noise haystack, in order; the answer is every name in the chain."""
    names: list[str] = []
    while len(names) < task.hops + 1:
        if rng is None:
            name = "WWWWW"
        else:
            name = "".join(chr(65 + int(i)) for i in rng.integers(0, 26, 5))
        if name not in names or rng is None:
            names.append(name)
    value = "99999" if rng is None else str(int(rng.integers(10000, 100000)))
    chain = [f"VAR {names[0]} = {value}"]
    chain += [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(task.hops)]
    count = len(chain) - 1
    others = (0.0,) * count if rng is None else tuple(float(x) for x in rng.uniform(0, 1, count))
    head, tail = (VT_TEMPLATE + VT_ANSWER_PREFIX).split("{context}")
    return Draw(
        head=head,
        needles=tuple("\n" + c + "\n" for c in chain),
        answer_needle=0,
        other_depths=others,
        tail=tail.format(query=value, num_v=len(names)),
        answers=tuple(names),
        joiner="\n",
        keys=tuple(names),
        ordered=True,
    )


def _common_words(rng: np.random.Generator | None, length: int | None) -> Draw:
    """RULER's cwe: ten common words and the rest of a shuffled pool as uncommon ones; the list
    of ``n`` uncommon words holds each common word ``common`` times and each uncommon one
    ``uncommon`` times (:data:`CWE_REPEATS`), in an order drawn once per trial and ``n``."""
    common, uncommon = CWE_REPEATS["long" if (length or 0) >= CWE_LONG else "short"]
    if rng is None:
        words, seed = sorted(CWE_WORDS, key=len, reverse=True), 0
    else:
        words, seed = [CWE_WORDS[i] for i in rng.permutation(len(CWE_WORDS))], _seed(rng)
    top, rest = words[:CWE_COMMON], words[CWE_COMMON:]

    def items(n: int) -> str:
        listed = np.array(top * common + rest[:n] * uncommon)
        listed = listed[np.random.default_rng(seed + n).permutation(len(listed))]
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed))

    head, tail = (CWE_TEMPLATE + CWE_ANSWER_PREFIX).split("{context}")
    return Draw(head, (), 0, (), tail, tuple(top), "\n", items=items, max_items=len(rest))


def _frequent_words(rng: np.random.Generator | None) -> Draw:
    """RULER's fwe: a vocabulary of distinct random coded words, the first replaced by
    ``"..."``; ``n`` words give rank ``k`` ``floor(n k^-2 / zeta(2))`` copies, shuffled."""
    if rng is None:
        vocab, seed = ["z" * FWE_WORD_LEN] * FWE_VOCAB, 0
    else:
        drawn: set[str] = set()
        while len(drawn) < FWE_VOCAB:  # RULER draws again until the words are distinct
            more = FWE_VOCAB - len(drawn)
            text = (rng.integers(0, 26, (more, FWE_WORD_LEN)) + 97).astype(np.uint8).tobytes()
            drawn.update(
                text[i : i + FWE_WORD_LEN].decode() for i in range(0, len(text), FWE_WORD_LEN)
            )
        vocab = [str(w) for w in rng.permutation(sorted(drawn))]
        seed = _seed(rng)
    vocab[0] = "..."
    ranks = np.arange(1, FWE_VOCAB + 1, dtype=np.float64)

    def items(n: int) -> str:
        counts = (n * ranks**-FWE_ALPHA / FWE_ZETA).astype(np.int64)
        listed = np.repeat(np.array(vocab), counts)
        return " ".join(listed[np.random.default_rng(seed + n).permutation(len(listed))])

    head, tail = FWE_TEMPLATE.split("{context}")
    return Draw(
        head,
        (),
        0,
        (),
        tail + FWE_ANSWER_PREFIX,
        tuple(vocab[1:4]),
        " ",
        items=items,
        min_items=FWE_MIN_WORDS,
    )


def _question(
    task: Task, data: _qa.QAData | None, rng: np.random.Generator | None, trial: int
) -> Draw:
    """RULER's qa: question ``trial`` of ``data`` (:mod:`posenc.retrieval.qa`)."""
    if data is None:
        raise ValueError(f"{task.name} needs its {task.dataset} data (--qa-data)")
    if not 0 <= trial < len(data.questions):
        raise ValueError(
            f"{task.name}: trial {trial} asks question {trial}, but {data.name} holds "
            f"{len(data.questions)} answerable questions; use --trials <= {len(data.questions)}"
        )
    question = data.questions[trial]
    drawn = _qa.arrangement(data, question, rng or np.random.default_rng(0))
    head, tail = (_qa.QA_TEMPLATE + _qa.QA_ANSWER_PREFIX).split("{context}")
    g = len(question.gold)

    def spare(n: int, k: int) -> list[str]:
        return [data.documents[i] for i in drawn[0][n - g : n - g + k]]

    return Draw(
        head,
        (),
        0,
        (),
        tail.format(query=question.query),
        question.answers,
        _qa.DOCUMENT_JOINER,
        min_items=g,
        max_items=len(data.documents),
        documents=lambda n, depth: _qa.documents(data, question, drawn, n, depth),
        spare=spare,
    )


def _seed(rng: np.random.Generator) -> int:
    """A seed for the list orders of one trial (one order per list size)."""
    return int(rng.integers(2**31))


def distractor(task: Task, rng: np.random.Generator, exclude: tuple[str, ...] = ()) -> str:
    """One line of a ``needle`` haystack: a needle with a fresh key (none of ``exclude``, the
    trial's own keys, so the question has one answer) and value (RULER's)."""
    key = random_value(task.key_type, rng)
    while key in exclude:
        key = random_value(task.key_type, rng)
    value = random_value(task.value_type, rng)
    return NEEDLE.format(type_v=task.value_type, key=key, value=value)
