"""``zoo/scripts/make_copy_data.py``: copy documents come only from files that are not
held out, keep the whole function, and rename whole words only."""
from __future__ import annotations

import random
import re

from zoo_scripts import load_script

FUNC = '''
def scale(values, factor, offset=0):
    """Scale values."""
    out = []
    for v in values:
        out.append(v * factor + offset)
    factor_name = "factor"
    return out, factor_name, factor
'''


def test_held_out_files_are_excluded(tmp_path):
    mod = load_script("make_copy_data")
    (tmp_path / "os.py").write_text("x = 1\n")
    (tmp_path / "keep.py").write_text(FUNC)
    (tmp_path / "held.py").write_text(FUNC)
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "t.py").write_text(FUNC)
    names = [rel for rel, _ in mod.training_code_files(tmp_path, {"cpython-lib/held.py"})]
    assert names == ["cpython-lib/keep.py", "cpython-lib/os.py"]


def test_copy_documents_repeat_the_function_with_whole_word_renames():
    mod = load_script("make_copy_data")
    docs = mod.copy_documents([("cpython-lib/keep.py", FUNC)] * 40, random.Random(0))
    assert len(docs) == 40
    renamed = 0
    for d in docs:
        original, rest = d.split("\n\n# ", 1)
        assert original == "# Original:\n" + FUNC.strip("\n")
        head, body = rest.split("\n", 1)
        m = re.match(r"The same function with `(\w+)` renamed to `(\w+)`:", head)
        if m is None:
            assert head in ("The same function, unchanged:", "A copy of the function above:")
            assert body == FUNC.strip("\n") + "\n"
            continue
        renamed += 1
        old, new = m.groups()
        assert old in ("values", "factor", "offset") and new != old
        assert body == re.sub(rf"\b{old}\b", new, FUNC.strip("\n")) + "\n"
    assert renamed >= 25  # most documents rename (85%)


MODULE = "\n".join(f"value_{i} = compute(value_{i - 1}, scale) if scale else None" for i in range(1, 60))


def test_window_documents_copy_a_window_with_a_whole_word_rename_or_unchanged():
    mod = load_script("make_copy_data")
    docs = mod.window_documents([("cpython-lib/keep.py", MODULE)], random.Random(0), 60)
    assert len(docs) == 60
    renamed = 0
    for d in docs:
        original, rest = d.split("\n\n# ", 1)
        code = original.removeprefix("# Original:\n")
        assert code in MODULE and 6 <= code.count("\n") + 1 <= 30  # a whole-line window
        head, body = rest.split("\n", 1)
        m = re.match(r"The same code with `(\w+)` renamed to `(\w+)`:", head)
        if m is None:
            assert head in ("The same code, unchanged:", "A copy of the code above:")
            assert body == code + "\n"
            continue
        renamed += 1
        old, new = m.groups()
        assert len(re.findall(rf"\b{old}\b", code)) >= 2 and new != old
        assert body == re.sub(rf"\b{old}\b", new, code) + "\n"
    assert 30 <= renamed < 60  # about 70% rename


def test_window_documents_skip_files_too_short_for_a_window():
    mod = load_script("make_copy_data")
    assert mod.window_documents([("cpython-lib/short.py", "x = 1\ny = 2\n")], random.Random(0), 5) == []
