"""README's promises name the tests that prove them: those tests must exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_test_named_in_the_readme_exists() -> None:
    text = (REPO / "README.md").read_text()
    named: list[tuple[str, str]] = []
    for m in re.finditer(r"`(test_\w+\.py)::test_\w+`(?:, `::test_\w+`)*", text):
        named += [(m.group(1), n) for n in re.findall(r"::(test_\w+)", m.group(0))]
    assert len(named) >= 15
    missing = [f"{f}::{n}" for f, n in named if not re.search(rf"^def {n}\(", (REPO / "tests" / f).read_text(), re.M)]
    assert missing == []
