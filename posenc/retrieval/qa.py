"""RULER's question answering tasks: ``qa_1`` (SQuAD) and ``qa_2`` (HotpotQA).

RULER (Hsieh et al. 2024, ``scripts/data/synthetic/qa.py``) asks a question of a set of
documents, each written ``"Document {i}:\\n{text}"`` (``i`` from 1) and joined by blank lines,
under its template and answer prefix::

    Answer the question based on the given documents. Only give me the answer and do not output
    any other words.\\n\\nThe following are given documents.\\n\\n{context}\\n\\nAnswer the
    question based on the given documents. Only give me the answer and do not output any other
    words.\\n\\nQuestion: {query} Answer:

The documents are the question's own (its "gold" documents) and distractors, as many as fit the
length. RULER's documents and questions, transcribed here:

- **SQuAD** (RULER reads the v2.0 dev set): the documents are the distinct paragraphs, sorted;
  a question is every answerable one (``is_impossible`` false), its gold document its paragraph,
  its answers every annotated answer text; distractors are first the other paragraphs of the
  same article (title), then any other paragraph.
- **HotpotQA** (RULER reads the distractor-setting dev set): a document is a paragraph's title, a
  newline and its sentences joined as they are; the question's gold documents are all the
  paragraphs of its context (its two supporting ones and the eight distractors HotpotQA gives);
  distractors are any other paragraph.

Scored with RULER's ``string_match_part``: 1 when any answer is in the output.

Where posenc chooses (RULER's choices are environment-specific or not a design): trial ``t``
asks question ``t`` of the data's order, as RULER's sample ``t`` does (``--trials`` more than
the questions is refused; TFDS stores its records shuffled, so ``tfds:squad/v2.0`` asks other
questions than RULER's json, in an order fixed by the prepared data); the gold document that
answers (SQuAD's paragraph; HotpotQA's first supporting paragraph when the data names them, else
its first paragraph) goes at the requested depth among the documents and the question's other
documents at depths drawn from the trial's seed (RULER shuffles every document with one fixed
seed); the distractors are drawn per trial and shuffled per document count. The prompt holds the
most whole documents that fit, as RULER's search over the document count finds, and then the
next distractor document cut at a token so that the prompt is exactly the requested length
(RULER's prompts fall short instead).

Data (nothing downloads): RULER's own files (SQuAD's ``dev-v2.0.json``, HotpotQA's
``hotpot_dev_distractor_v1.json``), a JSON list of records with TFDS ``squad``'s fields
(``title``, ``context``, ``question``, ``answers`` as a list of strings or ``{"text": ...}``,
``is_impossible`` optional) or HotpotQA's (``question``, ``answer``, ``context`` as
``[[title, [sentences]], ...]``, ``supporting_facts`` optional), or for SQuAD a prepared TFDS
data set (``tfds:squad/v2.0``, its validation split, read from array_record).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

QA_TEMPLATE = (
    "Answer the question based on the given documents. Only give me the answer and do not "
    "output any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the "
    "question based on the given documents. Only give me the answer and do not output any "
    "other words.\n\nQuestion: {query}"
)
QA_ANSWER_PREFIX = " Answer:"
DOCUMENT = "Document {i}:\n{document}"
DOCUMENT_JOINER = "\n\n"
DATASETS = ("squad", "hotpotqa")
# Where each data set is read from by default (None: no default, the user names a file).
DEFAULT_SOURCES: dict[str, str | None] = {"squad": "tfds:squad/v2.0", "hotpotqa": None}
_PREPARE = {
    "squad": "prepare it with `tfds build squad/v2.0 --data_dir=<data dir> "
    "--file_format=array_record`, or give RULER's dev-v2.0.json with --qa-data squad=<file>",
    "hotpotqa": "TFDS has no HotpotQA distractor set; give RULER's hotpot_dev_distractor_v1.json "
    "(or a JSON list of records with question, answer, context) with --qa-data hotpotqa=<file>",
}


@dataclasses.dataclass(frozen=True)
class Question:
    """One question: its text, answers, gold documents (the answering one first) and the
    documents drawn first as distractors (SQuAD: the same article's other paragraphs)."""

    query: str
    answers: tuple[str, ...]
    gold: tuple[int, ...]
    related: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class QAData:
    """A QA data set as RULER reads it: the distinct documents (sorted) and the questions."""

    name: str
    documents: tuple[str, ...]
    questions: tuple[Question, ...]


def _answer_texts(answers: Any) -> list[str]:
    """``answers`` as texts: a list of strings or of ``{"text": ...}``, or TFDS's
    ``{"text": [...]}``."""
    if isinstance(answers, Mapping):
        return [_text(a) for a in answers.get("text", [])]
    return [_text(a["text"] if isinstance(a, Mapping) else a) for a in answers]


def _text(value: Any) -> str:
    if isinstance(value, np.ndarray):
        value = value.item() if value.ndim == 0 else value.tolist()
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def squad_from_records(name: str, records: Iterable[Mapping[str, Any]]) -> QAData:
    """RULER's ``read_squad`` over flat records (TFDS ``squad``'s fields: ``title``,
    ``context``, ``question``, ``answers``, ``is_impossible``), the questions in the records'
    order (a JSON file's is RULER's; a TFDS data set's is its stored, shuffled one)."""
    rows = [
        (_text(r["title"]), _text(r["context"]), _text(r["question"]), _answer_texts(r["answers"]),
         bool(r.get("is_impossible", False)))
        for r in records
    ]  # fmt: skip
    documents = tuple(sorted({context for _, context, *_ in rows}))
    index = {d: i for i, d in enumerate(documents)}
    by_title: dict[str, list[int]] = {}
    for title, context, *_ in rows:
        if index[context] not in by_title.setdefault(title, []):
            by_title[title].append(index[context])
    questions = tuple(
        Question(
            question,
            tuple(answers),
            (index[context],),
            tuple(sorted(i for i in by_title[title] if i != index[context])),
        )
        for title, context, question, answers, impossible in rows
        if not impossible and answers
    )
    return QAData(name, documents, questions)


def _squad_rows(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """SQuAD's own nested json (``data`` -> articles -> ``paragraphs`` -> ``qas``) as flat rows."""
    return [
        {
            "title": article.get("title", str(a)),
            "context": p["context"],
            "question": qa["question"],
            "answers": qa["answers"],
            "is_impossible": qa.get("is_impossible", False),
        }
        for a, article in enumerate(data["data"])
        for p in article["paragraphs"]
        for qa in p["qas"]
    ]


def hotpot_from_records(name: str, records: Iterable[Mapping[str, Any]]) -> QAData:
    """RULER's ``read_hotpotqa``: a document is ``"{title}\\n{''.join(sentences)}"``; every
    paragraph of a question's context is its gold, the first supporting one first."""
    records = list(records)
    text = [[f"{t}\n{''.join(s)}" for t, s in r["context"]] for r in records]
    documents = tuple(sorted({d for docs in text for d in docs}))
    index = {d: i for i, d in enumerate(documents)}
    questions = []
    for r, docs in zip(records, text, strict=True):
        supporting = [f[0] for f in r.get("supporting_facts", [])]
        titles = [t for t, _ in r["context"]]
        first = titles.index(supporting[0]) if supporting and supporting[0] in titles else 0
        order = [first] + [i for i in range(len(docs)) if i != first]
        gold = tuple(dict.fromkeys(index[docs[i]] for i in order))
        questions.append(Question(r["question"], (str(r["answer"]),), gold))
    return QAData(name, documents, tuple(questions))


def read_json(dataset: str, path: str) -> QAData:
    """A data set from a JSON file (module docstring); one-line errors for a missing file or
    one of the wrong shape."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--qa-data {dataset}={path}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if dataset == "squad":
            rows = _squad_rows(data) if isinstance(data, Mapping) else data
            parsed = squad_from_records(path, rows)
        else:
            parsed = hotpot_from_records(path, data)
    except (ValueError, KeyError, TypeError, IndexError) as e:
        fields = (
            "SQuAD's json (data/paragraphs/qas) or a list of {title, context, question, answers}"
            if dataset == "squad"
            else "a list of {question, answer, context: [[title, [sentences]], ...]}"
        )
        raise ValueError(
            f"--qa-data {dataset}={path} is not {fields} ({type(e).__name__}: {e})"
        ) from None
    if not parsed.questions:
        raise ValueError(f"--qa-data {dataset}={path} holds no answerable question")
    return parsed


def read_tfds(dataset: str, spec: str, data_dir: str | None) -> QAData:
    """SQuAD from a prepared TFDS data set's validation split (array_record, no TensorFlow)."""
    from posenc.data.base import resolve_data_dir
    from posenc.data.tfds_source import (
        canonical_splits,
        import_tfds,
        iter_records,
        prepare_command,
        require_array_record,
        tfds_builder,
    )

    if dataset != "squad":
        raise ValueError(f"--qa-data {dataset}={spec}: {_PREPARE[dataset]}")
    name = spec.removeprefix("tfds:")
    root = resolve_data_dir(data_dir)
    builder = tfds_builder(name, root)
    require_array_record(builder, spec, name, root, prepare_command(name, root))
    missing = {"title", "context", "question", "answers"} - set(builder.info.features.keys())
    if missing:
        raise ValueError(f"--qa-data squad={spec} has no feature(s) {', '.join(sorted(missing))}")
    split = canonical_splits(builder.info).get("validation")
    if split is None:
        raise ValueError(f"--qa-data squad={spec} has no validation split")
    source = import_tfds().data_source(name, split=split, data_dir=str(root), download=False)
    return squad_from_records(spec, iter_records(source))


def loader(
    sources: Mapping[str, str] | None = None, data_dir: str | None = None
) -> Callable[[str], QAData]:
    """``dataset -> QAData``, each read once on first use from ``sources[dataset]`` (a JSON file
    or ``tfds:<name>``; default :data:`DEFAULT_SOURCES`)."""
    given = dict(sources or {})
    unknown = sorted(set(given) - set(DATASETS))
    if unknown:
        raise ValueError(
            f"--qa-data names {', '.join(unknown)}; allowed data sets: {', '.join(DATASETS)}"
        )
    cache: dict[str, QAData] = {}

    def load(dataset: str) -> QAData:
        if dataset not in cache:
            spec = given.get(dataset, DEFAULT_SOURCES[dataset])
            if spec is None:
                raise ValueError(f"{dataset} data is not given: {_PREPARE[dataset]}")
            if spec.startswith("tfds:"):
                from posenc.data.base import DataNotFoundError

                try:
                    cache[dataset] = read_tfds(dataset, spec, data_dir)
                except DataNotFoundError as e:  # its first line, then what to run
                    first = str(e).splitlines()[0].split(" Prepare it")[0]
                    first = first.replace(f"data.source={spec!r}", f"--qa-data {dataset}={spec}")
                    raise ValueError(f"{first} To {_PREPARE[dataset]}") from None
            else:
                cache[dataset] = read_json(dataset, spec)
        return cache[dataset]

    return load


def arrangement(
    data: QAData, question: Question, rng: np.random.Generator
) -> tuple[np.ndarray, tuple[float, ...], int]:
    """One trial's draws: the distractors in the order they are taken (the question's related
    documents first, shuffled, then the rest, shuffled), the depths of the gold documents after
    the first, and a seed for the per-count order of the distractors."""
    gold = set(question.gold)
    related = [i for i in question.related if i not in gold]
    rest = np.setdiff1d(np.arange(len(data.documents)), list(gold | set(related)))
    order = np.concatenate([rng.permutation(np.asarray(related, np.int64)), rng.permutation(rest)])
    others = tuple(float(x) for x in rng.uniform(0, 1, len(question.gold) - 1))
    return order.astype(np.int64), others, int(rng.integers(2**31))


def documents(
    data: QAData,
    question: Question,
    drawn: tuple[np.ndarray, tuple[float, ...], int],
    n: int,
    depth: float,
) -> list[str]:
    """The ``n`` documents of a prompt in order: ``n - g`` distractors (shuffled for this
    ``n``), the answering gold document after ``round(depth * (n - g))`` of them, the others
    after ``round(d * (n - g))`` for their drawn ``d``."""
    order, others, seed = drawn
    g = len(question.gold)
    chosen = order[: n - g]
    chosen = chosen[np.random.default_rng(seed + n).permutation(len(chosen))]
    points = [round(d * (n - g)) for d in (depth, *others)]
    out: list[str] = []
    place = sorted(range(g), key=lambda i: (points[i], i))
    cursor = 0
    for i in place:
        out += [data.documents[j] for j in chosen[cursor : points[i]]]
        out.append(data.documents[question.gold[i]])
        cursor = points[i]
    out += [data.documents[j] for j in chosen[cursor:]]
    return out


def context(texts: list[str], first: int = 1) -> str:
    """RULER's context: ``"Document {i}:\\n{text}"`` from ``i = first``, joined by blank lines."""
    return DOCUMENT_JOINER.join(
        DOCUMENT.format(i=i + first, document=d) for i, d in enumerate(texts)
    )
