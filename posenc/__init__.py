"""posenc: positional encodings for transformers, compared."""

__version__ = "0.1.0"
