"""The attention paths and the terms they apply.

- :mod:`posenc.attention.core`: one attention function for every encoder; it applies the
  encoder's hooks and chooses the path (einsum, blocked, fused) from the hooks, the device and
  the lengths.
- :mod:`posenc.attention.blocked`: the blocked path (tiles of queries and keys, online softmax).
- :mod:`posenc.attention.terms`: what the paths add to ``q . k`` (masks, decays, distance tables).
- :mod:`posenc.attention.linear`: linear (kernelized) attention.

Below the layers (:mod:`posenc.layers`) and above the encoders (:mod:`posenc.encodings`).
"""
