"""tfds: labelled builders (GLUE's shape) as classification data: read prepared through
array_record, unlabelled test rows, refuse unprepared GLUE configs with the command."""

import pytest
import tensorflow_datasets as tfds

from posenc.data import DataNotFoundError
from posenc.data.labelled import encode_labels, get_labelled_source, label_classes
from posenc.data.labelled_tfds import GLUE_TEXTS

TRAIN = [("He left.", "He went away.", 1), ("A cat.", "A dog.", 0)]
TEST = [("Rain.", "Snow.", -1)]


class PosencTestPairs(tfds.core.GeneratorBasedBuilder):
    """A labelled pair data set shaped like glue/mrpc (sentence1, sentence2, ClassLabel)."""

    VERSION = tfds.core.Version("0.1.0")

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
        return None  # See posenc.data.textdir_builder: avoids importlib_resources.

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {
                    "sentence1": tfds.features.Text(),
                    "sentence2": tfds.features.Text(),
                    "label": tfds.features.ClassLabel(names=["not_equivalent", "equivalent"]),
                }
            ),
        )

    def _split_generators(self, dl_manager):
        return {
            "train": self._generate_examples(TRAIN),
            "validation": self._generate_examples(TRAIN[:1]),
            "test": self._generate_examples(TEST),
        }

    def _generate_examples(self, rows):
        for i, (a, b, label) in enumerate(rows):
            yield i, {"sentence1": a, "sentence2": b, "label": label}


def test_prepared_pairs_read_with_the_builders_class_order(tmp_path, no_network):
    builder = PosencTestPairs(data_dir=str(tmp_path))
    builder.download_and_prepare(file_format="array_record")
    source = get_labelled_source("tfds:posenc_test_pairs", tmp_path)
    assert source.pair and source.splits == ("train", "validation", "test")
    train = source.examples("train")
    assert sorted((e.text, e.text_b, e.label) for e in train) == sorted(
        (a, b, ["not_equivalent", "equivalent"][y]) for a, b, y in TRAIN
    )
    classes = label_classes(source, train)
    assert classes == ("not_equivalent", "equivalent"), "ClassLabel order, not sorted"
    assert encode_labels(source.examples("test"), classes, "test").tolist() == [-1]
    assert source.info()["examples"] == {"train": 2, "validation": 1, "test": 1}


def test_an_unprepared_glue_config_names_the_command(tmp_path, no_network):
    assert GLUE_TEXTS["mrpc"] == ("sentence1", "sentence2")
    with pytest.raises(DataNotFoundError) as err:
        get_labelled_source("tfds:glue/mrpc", tmp_path)
    message = str(err.value)
    assert f"is not prepared under {tmp_path}" in message
    assert f"tfds build glue/mrpc --data_dir={tmp_path} --file_format=array_record" in message
