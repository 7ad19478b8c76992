"""parallel: sources: a folder of line-aligned files, the embedded default, and their refusals."""

import json
import os
import re
import subprocess
import sys

import pytest

from posenc.data import DataNotFoundError, get_parallel_source
from posenc.data.grammar_pairs import _NOUNS, _VERBS, SPLIT_SIZES
from posenc.data.parallel import pairs_sha256


def write(folder, name, lines, newline="\n", bom=False):
    text = newline.join(lines) + newline
    (folder / name).write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))


@pytest.fixture
def corpus(tmp_path):
    write(tmp_path, "train.en", ["Hello.", "", "Two words", "line\u2028with a Unicode line break"])
    write(tmp_path, "train.es", ["Hola.", "vacío", "Dos palabras", "línea\u2028con salto"])
    write(tmp_path, "dev.en", ["Good night.", ""], newline="\r\n", bom=True)
    write(tmp_path, "dev.es", ["Buenas noches.", ""])
    write(tmp_path, "train.fr", ["Bonjour.", "vide", "Deux mots", "ligne"])
    return tmp_path


def test_folder_pairs_in_file_order_with_the_empty_line_policy(corpus):
    src = get_parallel_source(f"parallel:{corpus}", src_lang="en", tgt_lang="es")
    assert src.splits == ("train", "validation")
    # The empty English line 2 is dropped from train; U+2028 does not end a line.
    assert src.pairs("train") == [
        ("Hello.", "Hola."),
        ("Two words", "Dos palabras"),
        ("line\u2028with a Unicode line break", "línea\u2028con salto"),
    ]
    # Validation keeps its empty line (hypotheses stay aligned); CRLF and a BOM are not text.
    assert src.pairs("validation") == [("Good night.", "Buenas noches."), ("", "")]
    assert src.sources("validation") == ["Good night.", ""]
    info = src.info()
    json.dumps(info)
    assert info["splits"]["train"] == {
        "files": ["train.en", "train.es"],
        "pairs": 3,
        "dropped_empty": 1,
    }
    assert info["splits"]["validation"]["files"] == ["dev.en", "dev.es"]
    assert info["content_sha256"] == pairs_sha256(
        [("train", src.pairs("train")), ("validation", src.pairs("validation"))]
    )
    reverse = get_parallel_source(f"parallel:{corpus}", src_lang="es", tgt_lang="en")
    assert reverse.pairs("train")[0] == ("Hola.", "Hello.")
    with pytest.raises(ValueError, match=r"has no 'test' split \(looked for \['test.en'\]"):
        src.pairs("test")


def test_folder_refusals_are_one_line(corpus):
    spec = f"parallel:{corpus}"
    with pytest.raises(ValueError) as err:
        get_parallel_source(spec, src_lang="en", tgt_lang="de")
    assert "language pairs there (either direction): en-es, en-fr, es-fr" in str(err.value)
    assert "data.src_lang='en', data.tgt_lang='de'" in str(err.value)
    with pytest.raises(ValueError, match="language pairs there"):
        get_parallel_source(spec)  # the languages must be given
    # fr has train but no dev file: the validation split names the missing file.
    with pytest.raises(ValueError, match=r"needs dev.en and dev.fr, but dev.fr is missing"):
        get_parallel_source(spec, src_lang="en", tgt_lang="fr")
    write(corpus, "dev.es", ["Buenas noches."])
    with pytest.raises(ValueError) as err:
        get_parallel_source(spec, src_lang="en", tgt_lang="es")
    assert "dev.en has 2 lines but dev.es has 1" in str(err.value)
    write(corpus, "dev.es", ["Buenas noches.", ""])
    write(corpus, "valid.en", ["x"])
    with pytest.raises(
        ValueError, match=r"both \['valid', 'dev'\] files name the validation split"
    ):
        get_parallel_source(spec, src_lang="en", tgt_lang="es")
    (corpus / "valid.en").unlink()
    (corpus / "train.es").write_bytes(b"Hola\n\xff\xfe\n")
    with pytest.raises(ValueError, match=r"train.es is not UTF-8 text \(line 2"):
        get_parallel_source(spec, src_lang="en", tgt_lang="es")
    assert "\n" not in str(err.value), "refusals are one line"
    with pytest.raises(DataNotFoundError, match="is not a folder"):
        get_parallel_source(f"parallel:{corpus / 'nope'}", src_lang="en", tgt_lang="es")
    with pytest.raises(ValueError, match="allowed forms: parallel:default, parallel:<dir>"):
        get_parallel_source("textdir:/x")


def test_default_corpus_sizes_directions_and_identity():
    src = get_parallel_source("parallel:default")
    assert (src.src_lang, src.tgt_lang) == ("en", "de")
    assert {s: len(src.pairs(s)) for s in src.splits} == SPLIT_SIZES
    english = [e for s in src.splits for e, _ in src.pairs(s)]
    assert len(set(english)) == len(english), "no evaluation source is a training source"
    reverse = get_parallel_source("parallel:default", src_lang="de", tgt_lang="en")
    assert reverse.pairs("test")[:5] == [(d, e) for e, d in src.pairs("test")[:5]]
    assert reverse.info()["content_sha256"] == src.info()["content_sha256"]
    with pytest.raises(ValueError, match="language pairs there .*: de-en"):
        get_parallel_source("parallel:default", src_lang="en", tgt_lang="fr")


def test_default_corpus_is_the_same_in_another_process():
    """The corpus depends on nothing a process varies (hash seed, set order)."""
    here = get_parallel_source("parallel:default").info()["content_sha256"]
    code = (
        "from posenc.data import get_parallel_source;"
        "print(get_parallel_source('parallel:default').info()['content_sha256'])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == here


def test_default_corpus_german_grammar():
    """Checks grammar rules on the generated German, independently of how it was generated."""
    pairs = get_parallel_source("parallel:default").pairs("train")
    masculine = {n.de for n in _NOUNS if n.gender == "m"}
    feminine = {n.de for n in _NOUNS if n.gender == "f"}
    finite = {form for v in _VERBS for form in v.de}
    checked = 0
    for en, de in pairs[:3000]:
        assert de[0].isupper() and de.endswith(".") and en[0].isupper() and en.endswith(".")
        words = re.findall(r"[\wäöüÄÖÜß]+|[,.]", de)
        for i, word in enumerate(words):
            if word in ("einen", "meinen", "deinen", "diesen"):  # accusative masculine singular
                noun = next(w for w in words[i + 1 :] if w[0].isupper())
                assert noun in masculine, (word, noun, de)
                checked += 1
            if word in ("eine", "meine") and words[i + 1][0].isupper():
                # eine + noun: feminine singular; meine + noun: feminine or plural
                assert word == "meine" or words[i + 1] in feminine, de
            if word in ("weil", "während"):  # subordinate clause: the verb comes last
                end = next(j for j in range(i + 1, len(words)) if words[j] in (",", "."))
                assert words[end - 1] in finite, (words[end - 1], de)
                checked += 1
    assert checked > 1000
