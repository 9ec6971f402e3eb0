"""``none``: plain autoregressive decoding through the same engine (the baseline)."""


class PlainDecoding:
    """Drafts nothing: every step is one target forward and one token per row."""

    name = "none"
