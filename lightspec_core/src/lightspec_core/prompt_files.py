"""Prompts from the command line: ``--prompt`` values and prompts files (JSONL with a
"prompt" or Spec-Bench "turns" field, or plain text, one prompt per line), read as strict
UTF-8 with one clear error line naming the file, line and byte."""

from __future__ import annotations

import json

from .errors import InvalidValueError


def read_prompts(prompt: tuple[str, ...], prompts_file: str | None) -> list[str]:
    """Prompts from ``--prompt`` (repeatable) and/or a file: JSONL with a "prompt" (or
    Spec-Bench "turns") field per line, or plain text with one prompt per line.

    The file must be UTF-8 (a leading byte-order mark is dropped); lines end at "\\n"
    (a "\\r" before it is dropped).  Bad bytes, bad JSON and ``--prompt`` text that is not
    UTF-8 (on Linux, undecodable argv bytes arrive as surrogate escapes) raise
    ``InvalidValueError`` naming the file and line, or the prompt."""
    out = []
    for p in prompt:
        check_utf8_argument("--prompt", p)
        out.append(p)
    if prompts_file:
        lines = _read_utf8_lines(prompts_file)
        if prompts_file.endswith((".jsonl", ".json")):
            for i, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InvalidValueError(f"{prompts_file}:{i}: not valid JSON ({exc.msg} at column {exc.colno})") from None
                if isinstance(rec, dict) and isinstance(rec.get("prompt"), str):
                    out.append(rec["prompt"])
                elif isinstance(rec, dict) and isinstance(rec.get("turns"), list) and rec["turns"] \
                        and isinstance(rec["turns"][0], str):
                    out.append(rec["turns"][0])
                else:
                    raise InvalidValueError(f"{prompts_file}:{i}: expected an object with a string 'prompt' "
                                            "(or a list of strings 'turns')")
        else:
            out.extend(line for line in lines if line.strip())
    if not out:
        raise InvalidValueError("no prompt given: use --prompt TEXT or --prompts-file FILE")
    return out


def check_utf8_argument(option: str, value: str) -> None:
    """Refuse command-line text that was not UTF-8: Python hands undecodable argv bytes
    over as surrogate escapes (U+DC80..U+DCFF), which no tokenizer can encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(value[exc.start])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"lone surrogate U+{code:04X}"
        raise InvalidValueError(f"{option} {value!r} is not valid UTF-8 text ({what} at character {exc.start + 1}): "
                                "pass UTF-8 text (check the terminal's encoding)") from None


def _read_utf8_lines(path: str) -> list[str]:
    """The lines of a UTF-8 text file (BOM dropped, "\\r\\n" and "\\n" endings)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise InvalidValueError(f"cannot read prompts file {path!r}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line_start = raw.rfind(b"\n", 0, exc.start) + 1
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InvalidValueError(f"{path}:{line}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at byte "
                                f"{exc.start - line_start + 1} of the line): save the file as UTF-8") from None
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
