"""RULER's qa_1 (SQuAD) and qa_2 (HotpotQA) in posenc.retrieval, on small data the tests write:
the prompt against an independent transcription of RULER's template and document format, RULER's
reading of SQuAD and HotpotQA, filling to the exact length with the gold documents whole and
distractors from other questions (the same article's first), the oracle at 100 % and a silent
model at 0 %, SQuAD read from a prepared TFDS data set (array_record), and one-line refusals."""

from __future__ import annotations

import json
import re

import _train_helpers as helpers
import numpy as np
import pytest

from posenc import retrieval as R
from posenc.data import ByteTokenizer
from posenc.retrieval import prompt as P
from posenc.retrieval import qa as Q
from posenc.retrieval import tasks as T
from posenc.workdir import RunDir

# NVIDIA/RULER, scripts/data/synthetic/constants.py ('qa' template + answer_prefix) and qa.py
# (DOCUMENT_PROMPT, the documents joined by '\n\n'), typed from the sources.
RULER_QA = (
    "Answer the question based on the given documents. Only give me the answer and do not "
    "output any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the "
    "question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nQuestion: {query} Answer:"
)
RULER_DOCUMENT = "Document {i}:\n{document}"

BYTES = ByteTokenizer()


class PairTokenizer:
    """Two bytes per token (a lone last byte is its own id): lengths differ from bytes."""

    sep_id = 70000

    def encode(self, text):
        b = text.encode()
        ids = [b[i] * 256 + b[i + 1] for i in range(0, len(b) - 1, 2)]
        return np.asarray(ids + ([65536 + b[-1]] if len(b) % 2 else []), np.int64)

    def decode(self, ids):
        out = bytearray()
        for i in np.asarray(ids).tolist():
            out += bytes([i - 65536]) if i >= 65536 else bytes([i // 256, i % 256])
        return out.decode("utf-8", errors="replace")


def _paragraph(a, p):
    return f"Article {a}, part {p}: the {a}{p} lamp is colour-{a}{p}. " * 2


def _squad_json(path, articles=5, paragraphs=3):
    """SQuAD v2.0's own nested shape; one impossible question per article (RULER skips it)."""
    data = {"version": "v2.0", "data": []}
    for a in range(articles):
        paras = []
        for p in range(paragraphs):
            qas = [
                {
                    "id": f"{a}{p}",
                    "question": f"Which colour is the {a}{p} lamp?",
                    "answers": [{"text": f"colour-{a}{p}", "answer_start": 0}] * 2,
                    "is_impossible": False,
                }
            ]
            if p == 0:
                qas.append(
                    {"id": f"x{a}", "question": "Unanswerable?", "answers": [],
                     "plausible_answers": [], "is_impossible": True}
                )  # fmt: skip
            paras.append({"context": _paragraph(a, p), "qas": qas})
        data["data"].append({"title": f"Title {a}", "paragraphs": paras})
    path.write_text(json.dumps(data))
    return str(path)


def _hotpot_json(path, questions=10):
    """HotpotQA's distractor shape: each question with four titled paragraphs of sentences."""
    rows = []
    for q in range(questions):
        context = [[f"Page {q}-{k}", [f"Page {q}-{k} opens. ", f"It names item-{q}{k}."]]
                   for k in range(4)]  # fmt: skip
        rows.append(
            {
                "_id": str(q),
                "question": f"Which item does page {q}-2 name?",
                "answer": f"item-{q}2",
                "supporting_facts": [[f"Page {q}-2", 1], [f"Page {q}-0", 0]],
                "context": context,
            }
        )
    path.write_text(json.dumps(rows))
    return str(path)


@pytest.fixture
def data(tmp_path):
    return Q.loader(
        {"squad": _squad_json(tmp_path / "squad.json"),
         "hotpotqa": _hotpot_json(tmp_path / "hotpot.json")}
    )  # fmt: skip


def _build(name, data, length, depth, trial=0, tokenizer=BYTES, seed=0):
    task = T.get(name)
    rng = R.trial_rng(name, length, seed, trial)
    draw = T.draw(task, rng, length, qa=data(task.dataset), trial=trial)
    hay = P.Haystack(tokenizer, qa=data)
    return draw, P.build(task, draw, length, depth, hay, np.random.default_rng(0))


def _documents(text, known):
    """The whole documents of a decoded prompt, by RULER's format, and what follows them (the
    cut document: a start of ``"\\n\\nDocument {n+1}:\\n{text}"``)."""
    context = text.split("The following are given documents.\n\n", 1)[1]
    context = context.rsplit("\n\nAnswer the question based on", 1)[0]
    whole, at = [], 0
    while True:
        head = ("" if not whole else "\n\n") + f"Document {len(whole) + 1}:\n"
        if not context.startswith(head, at):
            break
        found = [d for d in known if context.startswith(d, at + len(head))]
        if not found:
            break
        whole.append(max(found, key=len))
        at += len(head) + len(whole[-1])
    return whole, context[at:]


def test_rulers_reading_of_squad_and_hotpotqa(data):
    squad = data("squad")
    paragraphs = sorted({_paragraph(a, p) for a in range(5) for p in range(3)})
    assert squad.documents == tuple(paragraphs)
    assert len(squad.questions) == 15  # the impossible ones left out
    q = squad.questions[4]  # article 1, paragraph 1
    assert q.query == "Which colour is the 11 lamp?" and q.answers == ("colour-11",) * 2
    assert [squad.documents[i] for i in q.gold] == [_paragraph(1, 1)]
    assert sorted(squad.documents[i] for i in q.related) == [_paragraph(1, 0), _paragraph(1, 2)]
    hotpot = data("hotpotqa")
    q = hotpot.questions[3]
    assert q.answers == ("item-32",)
    own = [f"Page 3-{k}\nPage 3-{k} opens. It names item-3{k}." for k in range(4)]
    assert [hotpot.documents[i] for i in q.gold] == [own[2], own[0], own[1], own[3]]


@pytest.mark.parametrize("name", ["qa_1", "qa_2"])
def test_prompt_is_rulers_template_with_its_documents(name, data):
    qa = data(T.get(name).dataset)
    for trial, (length, depth) in enumerate(((600, 0.0), (900, 1.0))):
        draw, prompt = _build(name, data, length, depth, trial)
        text = BYTES.decode(prompt.ids)
        whole, cut = _documents(text, qa.documents)
        context = "\n\n".join(
            RULER_DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(whole)
        )
        assert text == RULER_QA.format(context=context + cut, query=qa.questions[trial].query)
        gold = [qa.documents[i] for i in qa.questions[trial].gold]
        assert whole[0 if depth == 0 else -1] == gold[0]  # the answering document at the depth
        assert set(gold) <= set(whole) and len(whole) > len(gold)


@pytest.mark.parametrize("kind", ["bytes", "pairs", "bpe"])
@pytest.mark.parametrize("name", ["qa_1", "qa_2"])
def test_exact_length_gold_whole_at_depth_distractors_from_other_questions(name, data, kind):
    # BPE: merges span pieces, so a piece's tokens differ from the same text's in a longer one.
    from test_retrieval import BPETokenizer

    tokenizer = {"bytes": BYTES, "pairs": PairTokenizer()}.get(kind) or BPETokenizer()
    qa = data(T.get(name).dataset)
    scale = 2 if kind == "pairs" else 1  # about the same text in each (the BPE merges little)
    cases = ((700, 0.0), (911, 0.5), (1207, 1.0), (1300, 0.3))
    for trial, (length, depth) in enumerate((n // scale, d) for n, d in cases):
        draw, prompt = _build(name, data, length, depth, trial, tokenizer)
        assert prompt.ids.shape == (length,) and prompt.ids.dtype == np.int32
        text = tokenizer.decode(prompt.ids)
        question = qa.questions[trial]
        assert text.endswith(f"\n\nQuestion: {question.query} Answer:")
        whole, cut = _documents(text, qa.documents)
        # What follows the whole documents: the next one's header and text, cut at a token.
        header = f"\n\nDocument {len(whole) + 1}:\n"
        if len(cut) > len(header):
            assert cut.startswith(header)
            assert any(d.startswith(cut[len(header) :]) for d in qa.documents)
            # The most whole documents that fit: that one whole would not.
            full = min((d for d in qa.documents if d.startswith(cut[len(header) :])), key=len)
            more = text.replace(cut, header + full, 1)
            assert kind == "bpe" or len(tokenizer.encode(more)) > length  # pieces: joint BPE
        else:
            assert header.startswith(cut)
        gold = [qa.documents[i] for i in question.gold]
        assert all(whole.count(g) == 1 for g in gold)
        distractors = [d for d in whole if d not in gold]
        assert len(distractors) == len(set(distractors)) and distractors
        assert all(qa.documents.index(d) not in question.gold for d in distractors)
        # The answering document follows round(depth * distractors) distractors.
        before = [d for d in whole[: whole.index(gold[0])] if d not in gold]
        assert len(before) == round(depth * len(distractors))
        # The most whole documents that fit: one more (the cut one whole) would not.
        if name == "qa_1":  # the same article's paragraphs are the first distractors
            related = {qa.documents[i] for i in question.related}
            assert set(distractors) >= related or set(distractors) <= related


@pytest.mark.parametrize("name", ["qa_1", "qa_2"])
def test_the_longest_length_is_every_document_whole(name, data):
    with pytest.raises(ValueError, match=r"use lengths <= (\d+) ") as e:
        _build(name, data, 9000, 0.5)
    longest = int(re.search(r"lengths <= (\d+) ", str(e.value)).group(1))
    qa = data(T.get(name).dataset)
    for length in (longest - 1, longest):  # the last document cut by a byte, then whole
        _, prompt = _build(name, data, length, 0.5)
        whole, cut = _documents(BYTES.decode(prompt.ids), qa.documents)
        assert len(prompt.ids) == length
        assert len(whole) == len(set(whole)) == len(qa.documents) - (length < longest)
    with pytest.raises(ValueError, match="too long"):
        _build(name, data, longest + 1, 0.5)


def _oracle(tokenizer, answers):
    """Answers each question from a table of its own (question -> answer), as a model that
    read the right document would."""

    def generate(prompts, num_new):
        out = []
        for row in prompts:
            query = re.search(r"Question: (.+?) Answer:$", tokenizer.decode(row)).group(1)
            ids = list(tokenizer.encode(" " + answers[query]))[:num_new]
            out.append(ids + [tokenizer.sep_id] * (num_new - len(ids)))
        return np.asarray(out)

    return generate


def test_oracle_scores_100_and_a_silent_model_0(data):
    answers = {q.query: q.answers[0] for d in ("squad", "hotpotqa") for q in data(d).questions}

    def run(generate, tokenizer=BYTES):
        return R.evaluate_retrieval(
            generate, tokenizer, ["qa_1", "qa_2"], [600, 900], [0.0, 0.5, 1.0], trials=3,
            haystack=P.Haystack(tokenizer, qa=data), stop_id=tokenizer.sep_id,
        )  # fmt: skip

    good = run(_oracle(BYTES, answers))
    assert all(c["score"] == 100.0 for t in good["tasks"].values() for c in t["cells"])
    assert good["tasks"]["qa_1"]["metric"] == "part" and good["effective_length"] == 900
    silent = run(lambda prompts, n: np.full((len(prompts), n), BYTES.sep_id))
    assert all(c["score"] == 0.0 for t in silent["tasks"].values() for c in t["cells"])


def test_refusals_are_one_line(tmp_path, data):
    def refused(match, fn, *args, **kw):
        with pytest.raises((ValueError, FileNotFoundError), match=match) as e:
            fn(*args, **kw)
        assert "\n" not in str(e.value), str(e.value)

    gen = _oracle(BYTES, {})
    hay = P.Haystack(BYTES, qa=data)
    ev = R.evaluate_retrieval
    refused("use --trials <= 15", ev, gen, BYTES, ["qa_1"], [600], trials=16, haystack=hay)
    refused("use lengths >= ", ev, gen, BYTES, ["qa_1"], [300], trials=1, haystack=hay)
    refused("too long for qa_2.*use lengths <= ", ev, gen, BYTES, ["qa_2"], [9000], trials=1,
            haystack=hay)  # fmt: skip
    refused("qa_1 needs its squad data", ev, gen, BYTES, ["qa_1"], [600], trials=1)
    refused("no such file", Q.loader({"squad": str(tmp_path / "none.json")}), "squad")
    (tmp_path / "bad.json").write_text('[{"question": "q"}]')
    bad = Q.loader({"hotpotqa": str(tmp_path / "bad.json")})
    refused("is not a list of .question, answer", bad, "hotpotqa")
    refused("allowed data sets: squad, hotpotqa", Q.loader, {"nq": "x.json"})


def test_hotpotqa_without_data_names_the_file_to_give():
    with pytest.raises(ValueError, match="TFDS has no HotpotQA") as e:
        Q.loader({})("hotpotqa")
    assert "\n" not in str(e.value)


def test_a_flat_json_of_tfds_fields_reads_as_squads_own(tmp_path, data):
    nested = json.loads((tmp_path / "squad.json").read_text())
    flat = [
        {"title": a["title"], "context": p["context"], "question": qa["question"],
         "answers": {"text": [x["text"] for x in qa["answers"]]},
         "is_impossible": qa["is_impossible"]}
        for a in nested["data"] for p in a["paragraphs"] for qa in p["qas"]
    ]  # fmt: skip
    (tmp_path / "flat.json").write_text(json.dumps(flat))
    flat_data = Q.loader({"squad": str(tmp_path / "flat.json")})("squad")
    assert flat_data.documents == data("squad").documents
    assert flat_data.questions == data("squad").questions


def test_an_unprepared_tfds_squad_names_the_command(tmp_path, no_network):
    with pytest.raises(ValueError, match="To prepare it with `tfds build squad/v2.0") as e:
        Q.loader({}, data_dir=str(tmp_path))("squad")
    assert "\n" not in str(e.value) and "is not prepared" in str(e.value)


def test_squad_from_a_prepared_tfds_data_set(tmp_path, data, no_network):
    import tensorflow_datasets as tfds

    nested = json.loads((tmp_path / "squad.json").read_text())
    rows = [
        (a["title"], p["context"], qa["question"], [x["text"] for x in qa["answers"]],
         qa["is_impossible"])
        for a in nested["data"] for p in a["paragraphs"] for qa in p["qas"]
    ]  # fmt: skip

    class PosencTestSquad(tfds.core.GeneratorBasedBuilder):
        """SQuAD v2.0's features (tensorflow_datasets/datasets/squad), our rows."""

        VERSION = tfds.core.Version("0.1.0")

        @tfds.core.utils.classproperty
        @classmethod
        def code_path(cls):
            return None

        def _info(self):
            span = {"text": tfds.features.Text(), "answer_start": np.int32}
            features = {
                "id": np.str_,
                "title": tfds.features.Text(),
                "context": tfds.features.Text(),
                "question": tfds.features.Text(),
                "is_impossible": np.bool_,
                "answers": tfds.features.Sequence(span),
                "plausible_answers": tfds.features.Sequence(span),
            }
            return tfds.core.DatasetInfo(
                builder=self, features=tfds.features.FeaturesDict(features)
            )

        def _split_generators(self, dl_manager):
            return {"validation": self._generate_examples()}

        def _generate_examples(self):
            for i, (title, context, question, answers, impossible) in enumerate(rows):
                yield i, {
                    "id": str(i), "title": title, "context": context, "question": question,
                    "is_impossible": impossible,
                    "answers": {"text": answers, "answer_start": [0] * len(answers)},
                    "plausible_answers": {"text": [], "answer_start": []},
                }  # fmt: skip

    PosencTestSquad(data_dir=str(tmp_path)).download_and_prepare(file_format="array_record")
    read = Q.loader({"squad": "tfds:posenc_test_squad"}, data_dir=str(tmp_path))("squad")
    assert read.documents == data("squad").documents
    # TFDS keeps no record order: the same questions, as a set.
    assert sorted(read.questions, key=repr) == sorted(data("squad").questions, key=repr)


def test_cli_refuses_missing_qa_data_before_the_checkpoint(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    run.record_config(helpers.tiny_config(tmp_path / "data"))
    code, _, err = helpers.run_cli(
        "retrieval", "--workdir", str(tmp_path / "run"), "--tasks", "qa_2", "--lengths", "600"
    )
    line = helpers.one_line_error(err, "retrieval")
    assert code == 2 and "hotpot_dev_distractor_v1.json" in line, err
    code, _, err = helpers.run_cli(
        "retrieval", "--workdir", str(tmp_path / "run"), "--tasks", "qa_1", "--lengths", "600",
        "--qa-data", f"squad={tmp_path / 'none.json'}",
    )  # fmt: skip
    line = helpers.one_line_error(err, "retrieval")
    assert code == 2 and "no such file" in line, err


@pytest.mark.slow
def test_retrieval_cli_scores_qa_on_a_trained_run(tmp_path):
    data_dir = tmp_path / "data"
    helpers.build_pystdlib(data_dir)
    workdir = tmp_path / "run"
    code, _, err = helpers.run_cli(
        "train", "--config", helpers.TINY_SPEC, "--workdir", str(workdir), "--no-eval",
        *helpers.tiny_flags(data_dir), "--config.encoding.name=rope",
    )  # fmt: skip
    assert code == 0, err
    squad, hotpot = _squad_json(tmp_path / "s.json"), _hotpot_json(tmp_path / "h.json")
    code, out, err = helpers.run_cli(
        "retrieval", "--workdir", str(workdir), "--tasks", "qa_1,qa_2", "--lengths", "700,900",
        "--depths", "0,1", "--trials", "2", "--qa-data", f"squad={squad},hotpotqa={hotpot}",
    )  # fmt: skip
    assert code == 0, err
    (name,) = RunDir(workdir).retrieval_files()
    record = json.loads((workdir / name).read_text())
    assert record["qa_data"] == {"squad": squad, "hotpotqa": hotpot}
    assert record["tasks"]["qa_1"]["metric"] == "part"
    trials = [json.loads(x) for x in (workdir / record["files"]["trials"]).read_text().splitlines()]
    assert len(trials) == 2 * 2 * 2 * 2
    questions = {q.query for d in ("squad", "hotpotqa") for q in Q.loader(
        {"squad": squad, "hotpotqa": hotpot})(d).questions}  # fmt: skip
    for t in trials:  # byte-level: a prompt's tokens are its UTF-8 bytes
        assert len(t["prompt"].encode()) == t["length"] == t["prompt_tokens"]
        assert re.search(r"Question: (.+) Answer:$", t["prompt"]).group(1) in questions
