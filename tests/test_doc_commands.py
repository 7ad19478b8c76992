"""Every ``posenc`` command in the README's and docs/ pages' shell blocks runs as written.

Each page's ``bash`` blocks run in order, in bash, in a fresh folder with ``configs/`` beside
them, so loops, globs and ``$HOME`` mean what they mean to a reader. Only three things differ from
a reader's machine, each stated below:

- ``posenc`` is a wrapper that appends flags shrinking the work (:data:`SHRINK`: two training
  steps, a tiny model, few evaluation tokens and trials). A flag given last wins, so a shrunk
  command still parses and validates every flag and ``--config.*`` override the page wrote.
- Paths that stand for the reader's own files (``/models/...``, ``$HOME/my_texts``) and data sets
  a reader prepares with TFDS (``tfds:pg19``) are replaced by small local equivalents
  (:data:`STAND_INS`).
- The runs a page's commands work on without creating them (``runs/rope`` on the retrieval page)
  are trained first, tiny (:data:`PREREQUISITES`).

A page whose command fails fails its test with the command's own error.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from _train_helpers import REPO, build_pystdlib

pytestmark = pytest.mark.slow

_GOLDEN = REPO / "tests" / "hf" / "golden"

# Appended to every command of a verb: the least that makes it run in seconds on a CPU.
_TINY_MODEL = (
    "--config.model.num_layers=1 --config.model.model_dim=32 --config.model.num_heads=2 "
    "--config.model.mlp_dim=64"
)
_TRAIN = (
    "--config.train.steps=2 --config.train.log_every=1 --config.train.checkpoint_every=2 "
    "--config.train.progress=False --config.eval.max_tokens=2048"
)
SHRINK: dict[str, str] = {
    "train": _TRAIN,
    # Two points of each sweep (every point is still validated before the first starts).
    "sweep": f"{_TRAIN} --only encoding.name=alibi,rope --only seed=0",
    "eval": "--max-tokens 4096",
    # Retrieval and attention analysis at long lengths take minutes on a CPU even when tiny.
    "retrieval": "--trials 1 --lengths 512 --depths 0.5",
    "analyze": "--tokens 2048 --lengths 64,256",
}

# What a page's placeholders stand for here: (text on the page, replacement).
STAND_INS: dict[str, list[tuple[str, str]]] = {
    "docs/pretrained.md": [
        ("/models/pythia-160m-yarn", "exported/pythia-160m-yarn"),
        ("/models/pythia-160m", str(_GOLDEN / "gpt_neox")),
        ("--data tfds:pg19", "--data pystdlib"),
        # One window of 8192 tokens a step, not the imported config's batch of them.
        ("--config.train.steps=400", "--config.train.steps=400 --config.train.batch_size=1"),
    ],
    # A tiny BERT with a WordPiece tokenizer (:func:`_tiny_bert`), 32 positions; GLUE's MRPC
    # as a folder of TSV files of sentence pairs (:func:`_pairs_task`).
    "docs/classification.md": [
        ("/models/bert-base-uncased", "{tmp}/models/bert"),
        ("--config.data.source=tfds:glue/mrpc", "--config.data.source=tsv:{tmp}/mrpc"),
        (
            "--config.train.inherit_model=True",
            "--config.train.inherit_model=True --config.train.seq_len=32",
        ),
    ],
    # Few sentences and length buckets: the tiny config's 200 beam-searched sentences and
    # buckets 1.1x apart compile and decode for minutes.
    "docs/translation.md": [
        (
            "--config configs/translation.py:tiny",
            "--config configs/translation.py:tiny "
            "--config.eval.max_sentences=8 --config.data.bucket_step=2 --config.eval.bucket_step=2",
        ),
    ],
    # configs/base.py is the full-size model: shrunk as everything else.
    "docs/devices.md": [
        ("--config configs/base.py ", f"--config configs/base.py {_TINY_MODEL} "),
    ],
}

# Pages whose `posenc train` is not followed by its own `posenc eval`: the training command
# evaluates there. Elsewhere training skips the evaluation that the page's next command repeats.
TRAIN_EVALUATES = {"docs/tasks.md"}

# Runs a page works on but does not create: (work directory, `posenc` arguments).
PREREQUISITES: dict[str, list[tuple[str, str]]] = {
    "docs/evaluation.md": [
        ("runs/alibi", "train --config configs/base.py:tiny --config.encoding.name=alibi"),
        ("runs/rope", "train --config configs/base.py:tiny --config.encoding.name=rope"),
    ],
    "docs/retrieval.md": [
        ("runs/rope", "train --config configs/base.py:tiny --config.encoding.name=rope"),
        # The page's imported Llama: a RoPE run (the golden tiny Llama's 96-piece tokenizer
        # cannot spell a pass key's digits).
        (
            "runs/llama",
            "train --config configs/base.py:tiny --config.encoding.name=rope --config.seed=1",
        ),
    ],
}

# Blocks whose commands are not `posenc` commands: the install-and-run lines CI itself runs.
_NOT_POSENC = re.compile(r"^\s*(pip|python|pytest)\b", re.M)

PAGES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]


def shell_blocks(page: str) -> list[str]:
    """The ``bash`` code blocks of ``page`` that run ``posenc`` (and nothing to install)."""
    text = (REPO / page).read_text()
    blocks = re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)
    return [b for b in blocks if "posenc " in b and not _NOT_POSENC.search(b)]


def _script(page: str, tmp: Path) -> str:
    """The page's blocks as one script; a trailing ``...`` (an elision a reader fills) dropped."""
    script = "\n".join(shell_blocks(page))
    script = re.sub(r"\s\.\.\.$", "", script, flags=re.M)
    for text, replacement in STAND_INS.get(page, []):
        assert text in script, f"{page} no longer holds {text!r}: update STAND_INS"
        script = script.replace(text, replacement.format(tmp=tmp))
    return script


def _wrapper(folder: Path) -> Path:
    """A ``posenc`` executable that runs posenc from this checkout with :data:`SHRINK` appended."""
    cases = "\n".join(f"  {verb}) shrink={shlex.quote(flags)} ;;" for verb, flags in SHRINK.items())
    path = folder / "posenc"
    path.write_text(
        "#!/usr/bin/env bash\n"
        'shrink=""\n'
        f'case "$1" in\n{cases}\nesac\n'
        f'[ "$1" = train ] && shrink="$shrink $POSENC_DOC_TRAIN"\n'
        f'exec {shlex.quote(sys.executable)} -m posenc.cli "$@" $shrink\n'
    )
    path.chmod(0o755)
    return path


def _my_texts(home: Path) -> None:
    """The README's ``$HOME/my_texts``: a folder of text files (this checkout's own modules)."""
    texts = home / "my_texts"
    texts.mkdir(parents=True)
    for source in sorted((REPO / "posenc").rglob("*.py")):
        (texts / f"{source.parent.name}_{source.stem}.txt").write_text(source.read_text())


def _tiny_bert(folder: Path) -> None:
    """The golden tiny BERT (96 ids, 32 positions) with a WordPiece tokenizer of 95 pieces."""
    import shutil
    import string

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    shutil.copytree(_GOLDEN / "bert", folder)
    chars = string.ascii_lowercase + string.digits
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *".,;:()[]=_'\"-+*/<>"]
    pieces += ["##" + c for c in chars]
    tokenizer = Tokenizer(models.WordPiece({p: i for i, p in enumerate(pieces)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    special = {"cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]", "pad": "[PAD]", "unk": "[UNK]"}
    config = {f"{k}_token": v for k, v in special.items()} | {"do_lower_case": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def _pairs_task(folder: Path) -> None:
    """A sentence-pair task as MRPC's columns: is ``text_b`` ``text`` reversed?"""
    rng = random.Random(0)
    words = "the cat dog sat ran on a mat log big small red".split()
    folder.mkdir()
    for split, rows in (("train", 64), ("validation", 16)):
        lines = ["text\ttext_b\tlabel"]
        for _ in range(rows):
            a = rng.sample(words, 4)
            label = rng.randrange(2)
            b = a[::-1] if label else rng.sample(words, 4)
            lines.append(f"{' '.join(a)}\t{' '.join(b)}\t{label}")
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n")


def _readme_sweep(work: Path) -> None:
    from test_readme import readme_block

    (work / "my_sweep.py").write_text(readme_block("## Your question, end to end"))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return build_pystdlib(tmp_path_factory.mktemp("data"))


@pytest.mark.parametrize("page", [p for p in PAGES if shell_blocks(p)])
def test_the_page_commands_run_as_written(page, tmp_path, data_dir):
    work, home, bin_dir = tmp_path / "work", tmp_path / "home", tmp_path / "bin"
    for folder in (work, home, bin_dir):
        folder.mkdir()
    (work / "configs").symlink_to(REPO / "configs")
    _wrapper(bin_dir)
    _my_texts(home)
    _readme_sweep(work)
    (work / "sources.txt").write_text("A small house.\nThe cat sleeps.\n")
    if page == "docs/classification.md":
        _tiny_bert(tmp_path / "models" / "bert")
        _pairs_task(tmp_path / "mrpc")
    env = {
        **os.environ,
        "HOME": str(home),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "POSENC_DATA_DIR": str(data_dir),
        "PYTHONPATH": str(REPO),
        "POSENC_DOC_TRAIN": "" if page in TRAIN_EVALUATES else "--no-eval",
    }
    if page == "docs/devices.md":  # its meshes name 8 devices
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    prerequisites = "\n".join(
        f"posenc {args} --workdir {run}" for run, args in PREREQUISITES.get(page, [])
    )
    # Each command is echoed with the time it started, so a failure shows where it stopped.
    trace = "set -euo pipefail\nPS4='+ $SECONDS s: '\nset -x"
    script = f"{trace}\n{prerequisites}\n{_script(page, tmp_path)}\n"
    done = subprocess.run(
        ["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=900
    )
    trace = "\n".join(line for line in done.stderr.splitlines() if line.startswith("+ "))
    print(trace)
    assert done.returncode == 0, f"{page}: exit {done.returncode}\n{done.stderr[-3000:]}"
