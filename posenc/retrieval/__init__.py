"""Long-context retrieval: passkey (Landmark Attention) and RULER's tasks (needles, variable
tracking, word extraction, question answering).

    posenc retrieval --workdir runs/rope --tasks passkey,niah_single_1 --lengths 256,1024

- :mod:`posenc.retrieval.tasks`: the tasks as data and the draw of one trial's texts.
- :mod:`posenc.retrieval.qa`: RULER's QA tasks' data (SQuAD, HotpotQA) and documents.
- :mod:`posenc.retrieval.prompt`: prompts of an exact length in the model's tokens, needles at
  exact depths.
- :mod:`posenc.retrieval.score`: Landmark's and RULER's scoring; RULER's effective length.
- :mod:`posenc.retrieval.run`: accuracy by task, length and depth, for a model or a run.
- :mod:`posenc.retrieval.output`: the table and the plots.
"""

from posenc.retrieval.prompt import Haystack, Prompt, build, check_depth
from posenc.retrieval.run import (
    DEFAULT_DEPTHS,
    DEFAULT_TRIALS,
    evaluate_retrieval,
    model_generator,
    trial_rng,
)
from posenc.retrieval.score import RULER_THRESHOLD, effective_length, score_output
from posenc.retrieval.tasks import NAMES, TASKS, Task, draw

__all__ = [
    "DEFAULT_DEPTHS",
    "DEFAULT_TRIALS",
    "NAMES",
    "RULER_THRESHOLD",
    "TASKS",
    "Haystack",
    "Prompt",
    "Task",
    "build",
    "check_depth",
    "draw",
    "effective_length",
    "evaluate_retrieval",
    "model_generator",
    "score_output",
    "trial_rng",
]
