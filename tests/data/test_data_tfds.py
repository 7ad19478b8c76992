"""tfds: sources: reading prepared data sets, split aliases, and never downloading."""

import numpy as np
import pytest
import tensorflow_datasets as tfds

from posenc.data import ByteTokenizer, DataNotFoundError, get_source, prepare

TRAIN = [f"training book {i}: ✓ héllo\n" * (i + 1) for i in range(7)]
DEV = ["dev book A\n", "dev book B ünïcode\n"]


class PosencTestCorpus(tfds.core.GeneratorBasedBuilder):
    """A registered TFDS data set with a non-"text" field and a "dev" split, like real ones."""

    VERSION = tfds.core.Version("0.1.0")

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
        return None  # See posenc.data.textdir_builder: avoids importlib_resources.

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict({"body": tfds.features.Text(), "idx": np.int32}),
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(TRAIN), "dev": self._generate_examples(DEV)}

    def _generate_examples(self, texts):
        for i, text in enumerate(texts):
            yield i, {"body": text, "idx": i}


def test_prepare_then_read_with_split_alias_and_text_field(tmp_path, no_network):
    src = prepare("tfds:posenc_test_corpus", tmp_path)
    assert src.text_field == "body", "the only Text feature is picked when there is no 'text'"
    assert src.splits == ("train", "validation")
    assert src.tfds_splits["validation"] == "dev"
    for split, texts in (("train", TRAIN), ("validation", DEV)):
        ds = src.data_source(split)
        # Record order is TFDS's (shuffled by key hash); the stream follows it.
        records = [ds[i] for i in range(len(ds))]
        assert sorted(r["body"].decode() for r in records) == sorted(texts)
        stream = src.split_stream(split)
        assert isinstance(stream, np.memmap), "large corpora are memory-mapped"
        expected = ByteTokenizer().encode_documents(r["body"].decode() for r in records)
        np.testing.assert_array_equal(stream, expected)
    with pytest.raises(ValueError, match=r"no 'test' split.*\['dev', 'train'\]"):
        src.split_stream("test")
    info = src.info()
    assert info["splits"]["validation"] == {
        "tfds_split": "dev",
        "examples": 2,
        "tokens": sum(len(t.encode()) + 1 for t in DEV),
        "stream_sha256": info["splits"]["validation"]["stream_sha256"],
    }
    reopened = get_source("tfds:posenc_test_corpus", tmp_path, text_field="body")
    np.testing.assert_array_equal(reopened.split_stream("train"), src.split_stream("train"))
    with pytest.raises(ValueError, match=r"data.text_field='nope'.*\['body', 'idx'\]"):
        get_source("tfds:posenc_test_corpus", tmp_path, text_field="nope")


@pytest.mark.parametrize("name", ["lm1b", "pg19", "wiki40b/en"])
def test_unprepared_data_set_names_the_prepare_command(tmp_path, no_network, name):
    with pytest.raises(DataNotFoundError) as err:
        get_source(f"tfds:{name}", tmp_path)
    message = str(err.value)
    assert f"posenc data prepare tfds:{name} --data_dir {tmp_path}" in message
    assert f"tfds build {name} --data_dir={tmp_path} --file_format=array_record" in message
    assert "not prepared" in message
    assert isinstance(err.value, FileNotFoundError)


def test_unknown_and_namespaced_names(tmp_path, no_network):
    with pytest.raises(DataNotFoundError, match="knows no data set 'no_such_corpus_xyz'"):
        get_source("tfds:no_such_corpus_xyz", tmp_path)
    with pytest.raises(ValueError, match="namespaced"):
        get_source("tfds:huggingface:wikitext", tmp_path)


def test_tfrecord_preparation_is_reported_as_unreadable(tmp_path, no_network):
    src = prepare("tfds:posenc_test_corpus", tmp_path)
    assert (tmp_path / "posenc" / "tfds" / "posenc_test_corpus" / "0.1.0" / "dev.body.npy").exists()
    # Pretend the data set had been prepared with TFDS's default format (needs TensorFlow).
    info_path = next((tmp_path / "posenc_test_corpus").rglob("dataset_info.json"))
    info_path.write_text(info_path.read_text().replace('"array_record"', '"tfrecord"'))
    with pytest.raises(DataNotFoundError, match="tfrecord.*array_record"):
        get_source("tfds:posenc_test_corpus", tmp_path)
    assert src.splits == ("train", "validation")
