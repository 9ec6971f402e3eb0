"""Checks of ``MTPPipeline``'s arguments (torch-free): each refuses a bad value with one
``InvalidTypeError`` (wrong type) or ``InvalidValueError`` (wrong value) that names the
value and what is allowed."""

from __future__ import annotations

import numbers
from collections.abc import Mapping

from .errors import InvalidTypeError, InvalidValueError


def short(value, width: int = 40) -> str:
    """``repr(value)``, cut to ``width`` characters for error messages."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_strategy_argument(strategy, strategy_names: list[str]) -> None:
    """Refuse a ``strategy`` that is neither a non-empty string (a registered name, with
    options or not, or a YAML file path), a mapping ``{"type": name, **options}``, nor a
    strategy object (one with ``lightspec_propose``, or the plain ``none`` strategy, which
    drafts nothing)."""
    from .strategies.plain import PlainDecoding

    names = ", ".join(strategy_names)
    if isinstance(strategy, str):
        if not strategy:
            raise InvalidValueError(f"strategy='' is invalid: use a registered strategy name ({names}) or a YAML file path")
        return
    if isinstance(strategy, Mapping) or hasattr(strategy, "lightspec_propose") or isinstance(strategy, PlainDecoding):
        return
    raise InvalidTypeError(f"strategy={short(strategy)} ({type(strategy).__name__}) is invalid: use a registered "
                           f"strategy name ({names}), a YAML file path, a mapping {{'type': name, **options}}, "
                           "or a strategy object with lightspec_propose")


def prompt_list(prompts) -> list:
    """``prompts`` (anything but a ``str``: a list, tuple or other iterable of prompts) as
    a list; refuses ``None``, numbers, bytes and mappings (a tokenizer's output)."""
    if isinstance(prompts, Mapping):
        raise InvalidTypeError(f"prompts is a {type(prompts).__name__} (a mapping): pass a list of prompts, "
                               "e.g. a tokenizer output's 'input_ids'")
    if prompts is None or isinstance(prompts, (bytes, bytearray)) or not hasattr(prompts, "__iter__"):
        raise InvalidTypeError(f"prompts={short(prompts)} ({type(prompts).__name__}) is invalid: use a str, "
                               "a list of str or a list of token-id lists")
    return list(prompts)


def token_id_list(index: int, prompt) -> list[int]:
    """Prompt ``index`` given as token ids (a list or tuple of ints) as a list of ``int``;
    anything else but a ``str`` (which the caller tokenizes) is refused."""
    if not isinstance(prompt, (list, tuple)):
        hint = ""
        if isinstance(prompt, (bytes, bytearray)):
            hint = " (decode the bytes first)"
        elif _is_int(prompt):
            hint = " (put the token ids of one prompt in a list: [[1, 2, 3]])"
        raise InvalidTypeError(f"prompt {index} is {short(prompt)} ({type(prompt).__name__}): use a str or a list "
                               f"of int token ids{hint}")
    for j, t in enumerate(prompt):
        if not _is_int(t):
            raise InvalidTypeError(f"prompt {index} has {short(t)} ({type(t).__name__}) at position {j}: "
                                   "token ids must be ints")
    return [int(t) for t in prompt]


def check_prompt_ids(index: int, ids: list[int], vocab: int, context: int | None, source: str = "has") -> None:
    """Refuse prompt ``index``'s ids when empty, when one lies outside ``[0, vocab)`` or
    when there are more than ``context`` of them (``None``: no limit known).  ``source``
    words where the ids came from ("has", or "tokenizes to" for text)."""
    if not ids:
        raise InvalidValueError(f"prompt {index} is empty after tokenization: give at least one token")
    bad = next((j for j, t in enumerate(ids) if not 0 <= t < vocab), None)
    if bad is not None:
        raise InvalidValueError(f"prompt {index} {source} token id {ids[bad]} at position {bad}, outside this "
                                f"model's vocabulary: allowed ids are [0, {vocab})")
    if context is not None and len(ids) > context:
        raise InvalidValueError(f"prompt {index} has {len(ids)} tokens; this model's context is {context}: "
                                f"allowed are 1..{context} prompt tokens")


def check_max_new_tokens(max_new_tokens, context: int | None) -> int:
    """``max_new_tokens`` as an ``int`` in 1..``context`` (any integer >= 1 when the
    context length is unknown)."""
    allowed = f"an integer in 1..{context} (this model's context length)" if context is not None else "an integer >= 1"
    if not _is_int(max_new_tokens):
        raise InvalidTypeError(f"max_new_tokens={short(max_new_tokens)} ({type(max_new_tokens).__name__}) is "
                               f"invalid: use {allowed}")
    if max_new_tokens < 1 or (context is not None and max_new_tokens > context):
        raise InvalidValueError(f"max_new_tokens={max_new_tokens!r} is invalid: use {allowed}")
    return int(max_new_tokens)


def stop_list(stop) -> list[str]:
    """``stop`` (``None``, a str or a list/tuple of str) as a list of non-empty strings:
    an empty one would match every text, ending each row after one token."""
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, (list, tuple)):
        raise InvalidTypeError(f"stop={short(stop)} ({type(stop).__name__}) is invalid: use a non-empty string "
                               "or a list of them")
    for i, s in enumerate(items):
        where = "stop" if isinstance(stop, str) else f"stop[{i}]"
        if not isinstance(s, str):
            raise InvalidTypeError(f"{where}={short(s)} ({type(s).__name__}) is invalid: stop strings are "
                                   "non-empty strings")
        if not s:
            raise InvalidValueError(f"{where}='' is invalid: an empty stop string would stop every row at once; "
                                    "use a non-empty string")
    return list(items)


def check_flag(name: str, value) -> bool:
    """``value`` when it is a ``bool``, else ``InvalidTypeError``."""
    if not isinstance(value, bool):
        raise InvalidTypeError(f"{name}={short(value)} ({type(value).__name__}) is invalid: use True or False")
    return value


def eos_id_set(eos_token_id, vocab: int) -> set[int]:
    """``eos_token_id`` (an int or a list/tuple/set of ints in ``[0, vocab)``; empty:
    no id ends a row) as a set of ``int``."""
    allowed = f"use a token id in [0, {vocab}) or a list of them"
    items = [eos_token_id] if _is_int(eos_token_id) else eos_token_id
    if not isinstance(items, (list, tuple, set, frozenset)):
        raise InvalidTypeError(f"eos_token_id={short(eos_token_id)} ({type(eos_token_id).__name__}) is invalid: "
                               f"{allowed}")
    for t in items:
        if not _is_int(t):
            raise InvalidTypeError(f"eos_token_id {short(t)} ({type(t).__name__}) is invalid: {allowed}")
        if not 0 <= t < vocab:
            raise InvalidValueError(f"eos_token_id {t} is outside this model's vocabulary: allowed ids are [0, {vocab})")
    return {int(t) for t in items}
