"""The papers' comparisons that need more than one run: each module runs and tabulates one.

- :mod:`posenc.studies.rope_extension`: zero-shot RoPE scaling and short fine-tunes (PI, YaRN).
- :mod:`posenc.studies.pretrained_extrapolation`: released checkpoints past their length.
- :mod:`posenc.studies.drope`: DroPE (RoPE continued without positions) against YaRN.
"""
