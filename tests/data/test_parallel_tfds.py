"""tfds: translation builders as parallel sources: read prepared, refuse unprepared."""

import json

import pytest
import tensorflow_datasets as tfds

from posenc.data import DataNotFoundError, get_parallel_source, prepare_parallel

TRAIN = [("Guten Morgen.", "Good morning."), ("", "empty source"), ("Ein Hund.", "A dog.")]
VALID = [("Danke ✓", "Thanks ✓"), ("", "")]


class PosencTestTranslate(tfds.core.GeneratorBasedBuilder):
    """A TFDS translation data set shaped like wmt14_translate/de-en (Translation feature)."""

    VERSION = tfds.core.Version("0.1.0")

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
        return None  # See posenc.data.textdir_builder: avoids importlib_resources.

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.Translation(languages=["de", "en"]),
            supervised_keys=("de", "en"),
        )

    def _split_generators(self, dl_manager):
        return {
            "train": self._generate_examples(TRAIN),
            "validation": self._generate_examples(VALID),
        }

    def _generate_examples(self, pairs):
        for i, (de, en) in enumerate(pairs):
            yield i, {"de": de, "en": en}


def test_prepare_then_read_pairs_in_record_order(tmp_path, no_network):
    src = prepare_parallel("tfds:posenc_test_translate", tmp_path)
    assert (src.src_lang, src.tgt_lang) == ("de", "en"), "the builder's supervised keys"
    assert src.splits == ("train", "validation")
    ds = tfds.data_source(
        "posenc_test_translate", split="validation", data_dir=str(tmp_path), download=False
    )
    records = [(ds[i]["de"].decode(), ds[i]["en"].decode()) for i in range(len(ds))]
    assert src.pairs("validation") == records
    assert sorted(records) == sorted(VALID), "validation keeps its empty pair"
    assert sorted(src.pairs("train")) == sorted(p for p in TRAIN if p[0]), "empty source dropped"
    info = src.info()
    json.dumps(info)
    assert info["languages"] == ["de", "en"]
    assert info["splits"]["train"]["examples"] == 3
    assert info["splits"]["train"]["pairs"] == 2
    assert info["splits"]["train"]["dropped_empty"] == 1
    reverse = get_parallel_source(
        "tfds:posenc_test_translate", tmp_path, src_lang="en", tgt_lang="de"
    )
    assert reverse.pairs("validation") == [(e, d) for d, e in records]
    with pytest.raises(ValueError, match=r"languages: \['de', 'en'\]"):
        get_parallel_source("tfds:posenc_test_translate", tmp_path, src_lang="fr", tgt_lang="en")
    with pytest.raises(ValueError, match=r"no 'test' split.*\['train', 'validation'\]"):
        src.pairs("test")


@pytest.mark.parametrize("name", ["wmt14_translate/de-en", "ted_hrlr_translate/pt_to_en"])
def test_unprepared_builder_names_the_command(tmp_path, no_network, name):
    with pytest.raises(DataNotFoundError) as err:
        get_parallel_source(f"tfds:{name}", tmp_path)
    message = str(err.value)
    assert f"is not prepared under {tmp_path}" in message
    assert f"tfds build {name} --data_dir={tmp_path} --file_format=array_record" in message


class PosencTestMonolingual(tfds.core.GeneratorBasedBuilder):
    """A text data set (no Translation feature)."""

    VERSION = tfds.core.Version("0.1.0")

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
        return None

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()})
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        yield 0, {"text": "one document"}


def test_text_data_set_is_not_a_translation_source(tmp_path, no_network):
    tfds.builder("posenc_test_monolingual", data_dir=str(tmp_path)).download_and_prepare(
        file_format="array_record"
    )
    with pytest.raises(ValueError, match=r"is not a translation data set .*\['text'\]"):
        get_parallel_source("tfds:posenc_test_monolingual", tmp_path)


def test_posenc_data_prepare_routes_a_translation_builder_to_pairs(tmp_path, no_network, capsys):
    """`posenc data prepare tfds:<translation builder>` prepares pairs (not a text stream) and
    prints the languages and pairs per split; `posenc data info --src-lang` reverses them."""
    from posenc.cli import main

    spec = "tfds:posenc_test_translate"
    assert main(["data", "prepare", spec, "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    out = out[out.index(f"{spec}: de -> en") :]  # after TFDS's own progress lines
    # TRAIN has one pair with an empty source (dropped); validation keeps every line.
    expected = [f"{spec}: de -> en", "  train: 2 pairs (1 empty dropped)", "  validation: 2 pairs"]
    assert out[:3] == expected
    assert main(["data", "info", spec, "--data-dir", str(tmp_path), "--src-lang", "en"]) == 0
    assert capsys.readouterr().out.startswith(f"{spec}: en -> de")
