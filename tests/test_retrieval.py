"""posenc.retrieval: prompts against independent transcriptions of Landmark's passkey prompt and
RULER's niah template, exact lengths and needle positions in the model's tokens, the scorers on
hand-built cases, an oracle that copies the needle from the prompt (100 %) and silent or wrong
models (0 %), determinism, and one-line refusals."""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest

from posenc import retrieval as R
from posenc.data import ByteTokenizer
from posenc.retrieval import prompt as P
from posenc.retrieval import tasks as T

# -- independent transcriptions (typed from the sources, not produced by posenc) --------------
# epfml/landmark-attention, llama/run_test.py, generate_prompt():
LANDMARK_DESCRIPTION = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "them. I will quiz you about the important information there."
)
LANDMARK_GARBAGE = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
)
LANDMARK_QUESTION = "What is the pass key? The pass key is"
# NVIDIA/RULER, scripts/data/synthetic/constants.py ('niah' template + answer_prefix) and
# niah.py (the needle; the singular rewrite when num_needle_q * num_needle_v == 1).
RULER_PLURAL = (
    "Some special magic {v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {v} afterwards.\n{context}\nWhat are all the special magic {v} "
    "for {query} mentioned in the provided text? The special magic {v} for {query} mentioned in "
    "the provided text are"
)
RULER_SINGULAR = (
    "A special magic {v} is hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {v} afterwards.\n{context}\nWhat is the special magic {v} "
    "for {query} mentioned in the provided text? The special magic {v} for {query} mentioned in "
    "the provided text is"
)
RULER_NEEDLE = "One of the special magic {v} for {key} is: {value}."
# variable_tracking.py (the chain) and constants.py (template + answer_prefix).
RULER_VT = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
    "{context}\nQuestion: Find all variables that are assigned the value {query} in the text "
    "above. Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
    "variables are assigned the value {query}, they are: "
)
# common_words_extraction.py / freq_words_extraction.py and their constants.py entries
# (template + answer_prefix); cwe's list is "1. w1 2. w2 ...", fwe's text the words joined by
# spaces, the most frequent coded word "..." (noise) and the next three the answer.
RULER_CWE = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common "
    "words in the above list? Answer: The top 10 words that appear most often in the list are:"
)
RULER_FWE = (
    "Read the following coded text and track the frequency of each coded word. Find the three "
    "most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. "
    "Please ignore the dots '....'. What are the three most frequently appeared words in the "
    "above coded text? Answer: According to the coded text above, the three most frequently "
    "appeared words are:"
)

BYTES = ByteTokenizer()
QA = [n for n in T.NAMES if T.get(n).dataset]  # their data: tests/test_retrieval_qa.py
SYNTHETIC = [n for n in T.NAMES if n not in QA]
ESSAY = "Alpha beta gamma. Delta epsilon zeta eta theta. Iota kappa lambda mu.\n" * 400


def _essay():
    stream = np.frombuffer(ESSAY.encode(), np.uint8).astype(np.uint16)
    return "test essay", stream


class PairTokenizer:
    """Two bytes per token (a lone last byte is its own id): lengths in these tokens differ
    from byte counts, as a real subword tokenizer's do."""

    sep_id = 70000

    def encode(self, text: str) -> np.ndarray:
        b = text.encode()
        ids = [b[i] * 256 + b[i + 1] for i in range(0, len(b) - 1, 2)]
        return np.asarray(ids + ([65536 + b[-1]] if len(b) % 2 else []), np.int64)

    def decode(self, ids) -> str:
        out = bytearray()
        for i in np.asarray(ids).tolist():
            out += bytes([i - 65536]) if i >= 65536 else bytes([i // 256, i % 256])
        return out.decode("utf-8", errors="replace")


class BPETokenizer:
    """A byte-level BPE trained here with the ``tokenizers`` library (the library Hugging Face
    tokenizer.json files are read with): merges span the pieces' text, so a piece's tokens
    differ from the tokens of the same text inside a longer one."""

    def __init__(self):
        tokenizers = pytest.importorskip("tokenizers")
        from tokenizers import decoders, models, pre_tokenizers, trainers

        tok = tokenizers.Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<eos>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        text = [T.NOISE, T.PASSKEY_DESCRIPTION, T.NIAH_TEMPLATE, T.NEEDLE, ESSAY[:300]]
        tok.train_from_iterator(text, trainer)
        self.tok, self.sep_id = tok, tok.token_to_id("<eos>")

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text, add_special_tokens=False).ids, np.int64)

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in np.asarray(ids)], skip_special_tokens=False)


def _build(name, length, depth, *, tokenizer=BYTES, seed=0, trial=0, **kw):
    task = T.get(name)
    draw = T.draw(task, R.trial_rng(name, length, seed, trial), length)
    hay = P.Haystack(tokenizer, _essay)
    return task, draw, P.build(task, draw, length, depth, hay, np.random.default_rng(7), **kw)


@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_passkey_prompt_is_landmarks(depth):
    _, draw, prompt = _build("passkey", 700, depth)
    key = draw.answers[0]
    filler = prompt.filler
    before = round(depth * filler)
    garbage_inf = " ".join([LANDMARK_GARBAGE] * 2000)
    information_line = f"The pass key is {key}. Remember it. {key} is the pass key."
    expected = "\n".join(
        [
            LANDMARK_DESCRIPTION,
            garbage_inf[:before],
            information_line,
            garbage_inf[: filler - before],  # Landmark's suffix restarts the filler
            LANDMARK_QUESTION,
        ]
    )
    assert BYTES.decode(prompt.ids) == expected
    assert len(prompt.ids) == 700
    # The key line starts after the description, its newline, the filler before it and a newline.
    assert prompt.answer_start == len(LANDMARK_DESCRIPTION) + 1 + before
    assert 1 <= int(key) <= 50000


def test_ruler_singular_and_plural_templates():
    task, draw, prompt = _build("niah_single_1", 900, 0.5)
    text = BYTES.decode(prompt.ids)
    (value,) = draw.answers
    key = re.search(r"for (\S+) is: " + value, text).group(1)
    head, tail = RULER_SINGULAR.format(v="number", context="\x00", query=key).split("\x00")
    assert text.startswith(head) and text.endswith(tail)
    assert RULER_NEEDLE.format(v="numbers", key=key, value=value) in text
    assert re.fullmatch(r"\d{7}", value)
    # RULER's noise haystack is the garbage sentence group one per line.
    assert f"\n{LANDMARK_GARBAGE}\n{LANDMARK_GARBAGE}\n" in text

    _, draw, prompt = _build("niah_multiquery", 1400, 0.2)
    text = BYTES.decode(prompt.ids)
    query = re.search(r"numbers for (.+) mentioned in the provided text\?", text).group(1)
    keys = re.split(r", and |, ", query)
    assert len(keys) == 4 and query == ", ".join(keys[:3]) + ", and " + keys[3]
    head, tail = RULER_PLURAL.format(v="numbers", context="\x00", query=query).split("\x00")
    assert text.startswith(head) and text.endswith(tail)
    for key, value in zip(keys, draw.answers, strict=True):
        assert RULER_NEEDLE.format(v="numbers", key=key, value=value) in text

    _, draw, prompt = _build("niah_multivalue", 1400, 0.9)
    text = BYTES.decode(prompt.ids)
    assert len(draw.answers) == 4 and "Some special magic numbers are hidden" in text
    key = re.search(r"numbers for (\S+) mentioned", text).group(1)
    for value in draw.answers:
        assert RULER_NEEDLE.format(v="numbers", key=key, value=value) in text

    _, draw, prompt = _build("niah_single_3", 900, 0.0)
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
                        draw.answers[0])  # fmt: skip
    assert "A special magic uuid is hidden" in BYTES.decode(prompt.ids)


@pytest.mark.parametrize("depth", [0.0, 0.6, 1.0])
def test_variable_tracking_is_rulers_chain_in_order(depth):
    _, draw, prompt = _build("vt", 1200, depth)
    text = BYTES.decode(prompt.ids)
    first = re.search(r"\nVAR ([A-Z]{5}) = (\d{5})\n", text)
    names, value = [first.group(1)], first.group(2)
    for _ in range(4):  # each hop names the previous variable, later in the text
        hop = re.search(rf"\nVAR ([A-Z]{{5}}) = VAR {names[-1]} \n", text)
        assert hop.start() > text.index(f"VAR {names[-1]} =")
        names.append(hop.group(1))
    assert list(draw.answers) == names and len(set(names)) == 5
    head, tail = RULER_VT.format(context="\x00", query=value, num_v=5).split("\x00")
    assert text.startswith(head) and text.endswith(tail)
    assert prompt.answer_start - len(head) == round(depth * prompt.filler)


def _split(template, text):
    """The context of ``text`` built on RULER's ``template`` (an independent transcription)."""
    head, tail = template.split("{context}")
    assert text.startswith(head) and text.endswith(tail), text[:200]
    return text[len(head) : len(text) - len(tail)]


@pytest.mark.parametrize("length,repeats", [(1500, (6, 1)), (3000, (6, 1)), (6000, (30, 3))])
def test_common_words_are_rulers_numbered_list(length, repeats):
    task, draw, prompt = _build("cwe", length, 0.5)
    assert len(prompt.ids) == length
    context = _split(RULER_CWE, BYTES.decode(prompt.ids))
    listed, pad = context.rstrip(" "), len(context) - len(context.rstrip(" "))
    entries = re.split(r" (?=\d+\. )", listed)
    numbers = [int(e.split(". ")[0]) for e in entries]
    assert numbers == list(range(1, len(entries) + 1))  # "1. w 2. w ...", RULER's numbering
    counts = collections.Counter(e.split(". ", 1)[1] for e in entries)
    top = [w for w, c in counts.items() if c == repeats[0]]
    assert sorted(top) == sorted(draw.answers) and len(top) == 10
    assert set(counts.values()) == set(repeats) and len(counts) > 12
    # As many words as fit: one more uncommon word would not.
    longest = max(len(w) for w in T.CWE_WORDS)
    assert pad < repeats[1] * (len(f" {len(entries) + 1}. ") + longest)
    # cwe ignores the depth: the same trial at another depth is the same prompt.
    np.testing.assert_array_equal(_build("cwe", length, 0.0)[2].ids, prompt.ids)


def test_cwe_pool_has_no_word_inside_another():
    pool = T.CWE_WORDS
    assert len(pool) > 8000 and len(set(pool)) == len(pool)
    joined = "\n".join(pool)  # a word found more often than once sits inside another one
    assert all(joined.count(w) == 1 for w in pool[::7])


@pytest.mark.parametrize("length", [1500, 4000])
def test_frequent_words_follow_rulers_zipf_law(length):
    task, draw, prompt = _build("fwe", length, 0.5)
    assert len(prompt.ids) == length
    words = _split(RULER_FWE, BYTES.decode(prompt.ids)).split()
    counts = collections.Counter(words)
    ranked = sorted(counts.values(), reverse=True)
    assert counts.most_common(1)[0][0] == "..."
    coded = [w for w, _ in counts.most_common() if w != "..."]
    assert all(re.fullmatch("[a-z]{6}", w) for w in coded)
    assert sorted(coded[:3]) == sorted(draw.answers) and counts[coded[2]] > counts[coded[3]]
    # Rank k appears floor(n k^-2 / zeta(2)) times for RULER's num_words n (alpha 2).
    zeta2 = 1.6449340668482264
    fits = [
        n
        for n in range(1, 4 * length)
        if [int(n * k**-2.0 / zeta2) for k in range(1, len(ranked) + 2)] == ranked + [0]
    ]
    assert fits, ranked[:6]


@pytest.fixture(scope="module")
def bpe():
    return BPETokenizer()


@pytest.mark.parametrize("kind", ["bytes", "pairs", "bpe"])
@pytest.mark.parametrize("name", [n for n in T.NAMES if T.get(n).has_depth and n not in QA])
def test_exact_length_and_depth_in_the_models_tokens(name, kind, bpe):
    tokenizer = {"bytes": BYTES, "pairs": PairTokenizer(), "bpe": bpe}[kind]
    for length, depth in ((900, 0.0), (1333, 0.37), (2000, 1.0)):
        task, draw, prompt = _build(name, length, depth, tokenizer=tokenizer)
        assert prompt.ids.shape == (length,) and prompt.ids.dtype == np.int32
        assert prompt.filler + prompt.fixed == length
        needles = [tokenizer.encode(n) for n in draw.needles]
        for start, ids in zip(prompt.needle_starts, needles, strict=True):
            np.testing.assert_array_equal(prompt.ids[start : start + len(ids)], ids)
        head = len(tokenizer.encode(draw.head))
        # Filler tokens before the answer needle: round(depth * F), counting other needles out.
        before = prompt.answer_start - head
        before -= sum(
            len(n) for s, n in zip(prompt.needle_starts, needles, strict=True)
            if s < prompt.answer_start
        )  # fmt: skip
        assert before == round(depth * prompt.filler)
        np.testing.assert_array_equal(prompt.ids[-len(tokenizer.encode(draw.tail)) :],
                                      tokenizer.encode(draw.tail))  # fmt: skip


@pytest.mark.parametrize("kind", ["bytes", "pairs", "bpe"])
@pytest.mark.parametrize("name", ["cwe", "fwe"])
def test_word_lists_fill_the_exact_length_in_the_models_tokens(name, kind, bpe):
    tokenizer = {"bytes": BYTES, "pairs": PairTokenizer(), "bpe": bpe}[kind]
    for length in (1400, 2001):
        task, draw, prompt = _build(name, length, 0.5, tokenizer=tokenizer, suffix=(7,))
        assert prompt.ids.shape == (length,) and prompt.ids[-1] == 7
        head, tail = tokenizer.encode(draw.head), tokenizer.encode(draw.tail)
        np.testing.assert_array_equal(prompt.ids[: len(head)], head)
        np.testing.assert_array_equal(prompt.ids[-len(tail) - 1 : -1], tail)
        context = tokenizer.decode(prompt.ids[len(head) : -len(tail) - 1])
        assert all(context.count(a) >= 2 for a in draw.answers)
        assert len(tokenizer.encode(context.rstrip(" "))) > 0.9 * prompt.filler  # little padding


def test_prefix_and_suffix_count_in_the_length():
    _, draw, prompt = _build("passkey", 500, 0.5, prefix=(1,), suffix=(256,))
    assert len(prompt.ids) == 500 and prompt.ids[0] == 1 and prompt.ids[-1] == 256
    assert prompt.answer_start == 1 + len(LANDMARK_DESCRIPTION) + 1 + round(0.5 * prompt.filler)


def test_distractors_never_reuse_the_needles_key(monkeypatch):
    # Three words: without the exclusion a third of the distractors would share the key.
    monkeypatch.setattr(T, "WORDS", ("red-fox", "blue-owl", "green-cat"))
    for trial in range(5):
        _, draw, prompt = _build("niah_multikey_2", 1500, 0.5, trial=trial)
        text = BYTES.decode(prompt.ids)
        (key,) = draw.keys
        assert text.count(f" for {key} is: ") == 1
        assert text.count("One of the special magic numbers for") > 15


def test_scorers_on_hand_built_cases():
    s = R.score_output
    assert s("first_integer", " 12345. Remember it.", ["12345"]) == 1.0
    assert s("first_integer", "The key is 12345", ["12345"]) == 1.0
    assert s("first_integer", " 123456", ["12345"]) == 0.0  # the whole first number counts
    assert s("first_integer", " 2 then 12345", ["12345"]) == 0.0
    assert s("first_integer", "", ["12345"]) == 0.0
    assert s("all", "The numbers are 111 and 333.", ["111", "222", "333", "444"]) == 0.5
    assert s("all", "ABC-def", ["abc-DEF"]) == 1.0  # case-insensitive, as RULER
    assert s("all", "", ["1"]) == 0.0
    assert s("part", "only 333", ["111", "333"]) == 1.0
    assert s("part", "none", ["111", "333"]) == 0.0
    with pytest.raises(ValueError, match="metric"):
        s("exact", "x", ["x"])


def test_effective_length_is_rulers():
    eff = R.effective_length
    assert eff({1024: 90.0, 2048: 86.0, 4096: 80.0, 8192: 95.0}) == 2048  # stays above
    assert eff({1024: 85.6, 2048: 99.0}) is None  # RULER: exceeds the threshold
    assert eff({4096: 99.0, 1024: 99.0}) == 4096
    assert eff({1024: 50.0}, threshold=40) == 1024


def _oracle(tokenizer):
    """Copies the answer out of the prompt text with regular expressions of its own."""

    def generate(prompts, num_new):
        out = []
        for row in prompts:
            text = tokenizer.decode(row)
            if text.startswith("Below is a numbered list of words."):  # cwe: count the list
                listed = re.findall(r"\d+\. (\S+)", text.split("\n")[1])
                top = collections.Counter(listed).most_common(10)
                out.append(_answer(tokenizer, " " + ", ".join(w for w, _ in top) + ".", num_new))
                continue
            if text.startswith("Read the following coded text"):  # fwe: count, skip the noise
                coded = text.split("coded words. ", 1)[1].split("\nQuestion:")[0].split()
                top = collections.Counter(w for w in coded if w != "...").most_common(3)
                out.append(_answer(tokenizer, " " + ", ".join(w for w, _ in top) + ".", num_new))
                continue
            key = re.search(r"The pass key is (\d+)\. Remember it\.", text)
            chain = re.search(r"assigned the value (\d+) in the text above", text)
            if key:
                answer = " " + key.group(1) + "."
            elif chain:  # follow the assignments from the value
                names = [re.search(rf"VAR (\w+) = {chain.group(1)}\n", text).group(1)]
                while hop := re.search(rf"VAR (\w+) = VAR {names[-1]} ", text):
                    names.append(hop.group(1))
                answer = " " + " ".join(names)
            else:
                query = re.findall(r"magic \w+ for (.+) mentioned in the provided text\?", text)[0]
                values = [
                    v
                    for k in re.split(r", and |, ", query)
                    for v in re.findall(rf"magic \w+ for {re.escape(k)} is: (\S+)\.", text)
                ]
                answer = " " + ", ".join(values) + "."
            out.append(_answer(tokenizer, answer, num_new))
        return np.asarray(out)

    return generate


def _answer(tokenizer, answer, num_new):
    ids = list(tokenizer.encode(answer))[:num_new]
    return ids + [tokenizer.sep_id] * (num_new - len(ids))


@pytest.mark.parametrize("kind", ["bytes", "pairs", "bpe"])
def test_oracle_scores_100_silent_and_wrong_models_0(kind, bpe):
    tokenizer = {"bytes": BYTES, "pairs": PairTokenizer(), "bpe": bpe}[kind]
    lengths = [1400] if kind == "bpe" else [1400, 2100]  # BPE is the slow tokenizer

    def run(generate):
        return R.evaluate_retrieval(
            generate,
            tokenizer,
            SYNTHETIC,
            lengths,
            [0.0, 0.5, 1.0],
            trials=3,
            haystack=P.Haystack(tokenizer, _essay),
            stop_id=tokenizer.sep_id,
        )

    good = run(_oracle(tokenizer))
    assert all(c["score"] == 100.0 for t in good["tasks"].values() for c in t["cells"])
    assert [r["score"] for r in good["by_length"]] == [100.0] * len(lengths)
    assert good["effective_length"] == lengths[-1]
    silent = run(lambda prompts, n: np.full((len(prompts), n), tokenizer.sep_id))
    assert all(c["score"] == 0.0 for t in silent["tasks"].values() for c in t["cells"])
    assert silent["effective_length"] is None

    def wrong(prompts, n):  # a fixed number: never a key or value
        ids = list(tokenizer.encode(" 99999999999."))[:n]
        return np.asarray([ids + [tokenizer.sep_id] * (n - len(ids))] * len(prompts))

    assert all(c["score"] == 0.0 for t in run(wrong)["tasks"].values() for c in t["cells"])


def test_trials_are_deterministic_and_recorded():
    lines = []
    record = R.evaluate_retrieval(
        _oracle(BYTES),
        BYTES,
        ["passkey", "niah_multikey_3"],
        [700],
        [0.25, 0.75],
        trials=2,
        seed=3,
        stop_id=BYTES.sep_id,
        on_trial=lines.append,
    )
    assert len(lines) == 2 * 2 * 2
    first = lines[0]
    assert {"task", "length", "depth", "prompt", "answer", "output", "correct"} <= set(first)
    assert len(BYTES.encode(first["prompt"])) == 700 and first["correct"] is True
    # The same trial has the same key at every depth; another seed draws another one.
    by = {(x["task"], x["trial"], x["depth"]): x["answer"] for x in lines}
    assert by["passkey", 0, 0.25] == by["passkey", 0, 0.75]
    again = R.evaluate_retrieval(
        _oracle(BYTES), BYTES, ["passkey"], [700], [0.25], trials=2, seed=3, stop_id=256
    )
    assert again["tasks"]["passkey"]["cells"] == record["tasks"]["passkey"]["cells"][:1]
    other = []
    R.evaluate_retrieval(
        _oracle(BYTES), BYTES, ["passkey"], [700], [0.25], trials=2, seed=4, on_trial=other.append
    )
    assert [x["answer"] for x in other] != [x["answer"] for x in lines[:2]]
    assert record["seed"] == 3 and record["lengths"] == [700] and record["trials"] == 2


def _one_line(excinfo, *words):
    message = str(excinfo.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_refusals_are_one_line():
    gen = _oracle(BYTES)
    with pytest.raises(ValueError) as e:
        R.evaluate_retrieval(gen, BYTES, ["passkey", "needle_v2"], [900])
    _one_line(e, "needle_v2", "niah_single_1")
    for depth in (1.5, -0.1, float("nan"), "half"):
        with pytest.raises(ValueError) as e:
            R.evaluate_retrieval(gen, BYTES, ["passkey"], [900], [depth])
        _one_line(e, "depth", "[0, 1]")
    with pytest.raises(ValueError) as e:
        R.evaluate_retrieval(gen, BYTES, ["passkey"], [100])
    _one_line(e, "length 100", "passkey", "use lengths >=")
    small = P.Haystack(BYTES, lambda: ("tiny text", np.frombuffer(b"a b c. " * 30, np.uint8)))
    with pytest.raises(ValueError) as e:
        R.evaluate_retrieval(gen, BYTES, ["niah_single_2"], [2000], haystack=small)
    _one_line(e, "tiny text", "2000", "--haystack")

    for name in ("cwe", "fwe"):  # the question and the shortest list do not fit
        with pytest.raises(ValueError) as e:
            R.evaluate_retrieval(gen, BYTES, [name], [600])
        _one_line(e, "length 600", name, "use lengths >=")
    with pytest.raises(ValueError) as e:  # a pool too small for the length
        with pytest.MonkeyPatch.context() as m:
            m.setattr(T, "CWE_WORDS", tuple(f"w{i:02d}" for i in range(14)))
            R.evaluate_retrieval(gen, BYTES, ["cwe"], [3000])
    _one_line(e, "length 3000", "too long for cwe", "use lengths <=")

    class NoDigits(PairTokenizer):  # digits become "?"
        def encode(self, text):
            return super().encode(re.sub(r"\d", "?", text))

    with pytest.raises(ValueError) as e:
        R.evaluate_retrieval(gen, NoDigits(), ["passkey"], [900])
    _one_line(e, "cannot encode the needle", "The pass key is")


@pytest.mark.parametrize("name", ["passkey", "niah_single_1", "niah_multikey_2", "vt"])
def test_synthetic_examples_hold_the_prompt_and_its_answer(name):
    from posenc.data import synthetic

    shortest = synthetic.tasks.get_task(name).min_length
    for length in (shortest, shortest + 37):
        for index in range(4):
            inp, tgt = synthetic.example(name, length, 0, index)
            assert len(inp) + 1 == length  # the separator before the target completes it
            assert tgt.startswith(" ") and tgt.endswith(".")
            # The answer read out of the prompt by its sentence, independently of the draw.
            if name == "passkey":
                found = re.search(r"The pass key is (\d+)\. Remember", inp).group(1)
            elif name == "vt":
                value = re.search(r"assigned the value (\d+) in", inp).group(1)
                names = [re.search(rf"VAR (\w+) = {value}\n", inp).group(1)]
                while hop := re.search(rf"VAR (\w+) = VAR {names[-1]} ", inp):
                    names.append(hop.group(1))
                found = ", ".join(names)
            else:
                key = re.search(r"number for (\S+) mentioned", inp).group(1)
                found = re.search(rf"for {key} is: (\d+)\.", inp).group(1)
            assert tgt == f" {found}."
    assert synthetic.example(name, shortest, 3, 1) == synthetic.example(name, shortest, 3, 1)
    assert synthetic.example(name, shortest, 3, 1) != synthetic.example(name, shortest, 4, 1)
    with pytest.raises(ValueError, match=f"lengths >= {shortest}"):
        synthetic.example(name, shortest - 1, 0, 0)
    batch = synthetic.train_batch(name, 4, shortest + 20, 0, 0)
    # The loss covers the prompt too (a language model's), up to the end of the target.
    lengths = batch["prompt_len"] + batch["target_len"]
    assert all(batch["weights"][r, : lengths[r] - 1].all() for r in range(4))
    assert all(not batch["weights"][r, lengths[r] - 1 :].any() for r in range(4))
