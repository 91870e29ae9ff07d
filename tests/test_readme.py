"""The README's quickstart must run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_quickstart_runs(capsys) -> None:
    blocks = _python_blocks()
    assert blocks, "the README has no python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "expected version 0, actual version 2" in out
    assert "['front-wheel', 'car']" in out
    assert "('0/3', 1, 'node-a'), ('1/1', 0, None), ('2/3', 1, None)" in out
    assert "[('front-wheel',), ('car',)]" in out
    assert "{'ok': 7, 'failed': 0}" in out
    assert "{'n': 8}" in out
    assert 'data["items"][1]: key 1 is not a string (JSON would store it as "1"' in out
    assert "[(1, 'order-1'), (1, 'order-2'), (2, 'order-2')]" in out  # versions side by side
    assert "el_orders [('order-1', 100), ('order-2', 50)]" in out
    assert "el_orders__v2 [('order-1', 120), ('order-2', 60)]" in out
