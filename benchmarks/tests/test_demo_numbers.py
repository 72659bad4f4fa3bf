"""The demo's numbers on the pages are the committed results', and those are the code's.

The README and docs/results.md show the demo's numbers only inside generated blocks, which
must equal what ``benchmarks/demo_seeds.py`` renders from ``demo-seeds.json``; the reduced
demo of tests/test_demo.py checks that the code still gives the recorded numbers
(``benchmarks/demo_guard.py``).
"""

from __future__ import annotations

import json
import re

import pytest

from benchmarks import demo_guard, demo_seeds


def _data() -> dict:
    return json.loads(demo_guard.SEEDS.read_text())


@pytest.mark.parametrize("name", sorted(demo_seeds.DOC_BLOCKS))
def test_pages_show_the_committed_demo_numbers(name):
    page = demo_guard.REPO / demo_seeds.DOC_BLOCKS[name]
    shown = demo_seeds.block(page.read_text(), name)
    assert shown is not None, f"{page}: the demo-numbers:{name} block is gone"
    assert shown == demo_seeds.render_blocks(_data())[name], (
        f"{page}: the demo numbers differ from benchmarks/results/demo-seeds.json; run "
        "`python -m benchmarks.demo_seeds --runs ...` (docs/results.md, \"The demo\")")


def test_no_demo_number_outside_the_generated_blocks():
    """The README's demo section states no accuracy or CI of its own."""
    readme = (demo_guard.REPO / "README.md").read_text()
    section = readme.split("## What the demo shows")[1].split("## Your ADNI download")[0]
    outside = re.sub(r"<!-- demo-numbers:(\w+) -->.*?<!-- /demo-numbers:\1 -->", "", section,
                     flags=re.S)
    assert not re.findall(r"\b0\.\d{2,3}\b|[+-]0\.\d+ \[", outside)


def test_blocks_are_rewritten_in_place(tmp_path):
    page = tmp_path / "README.md"
    page.write_text("a\n<!-- demo-numbers:readme -->\nold\n<!-- /demo-numbers:readme -->\nb\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text(
        "<!-- demo-numbers:table -->\n<!-- /demo-numbers:table -->\n")
    written = demo_seeds.update_docs(_data(), repo=tmp_path)
    assert len(written) == 2
    text = page.read_text()
    assert text.startswith("a\n<!-- demo-numbers:readme -->\nMeasured over seeds")
    assert text.endswith("<!-- /demo-numbers:readme -->\nb\n") and "old" not in text
    assert demo_seeds.update_docs(_data(), repo=tmp_path) == []   # nothing left to change


def test_the_guard_vouches_for_the_committed_demo_tables():
    guard = json.loads(demo_guard.GUARD.read_text())
    assert guard["demo_seeds_commit"] == demo_guard.seeds_commit(), (
        "benchmarks/results/demo-seeds.json was regenerated without recording the guard "
        "again: run `python -m benchmarks.demo_guard --record`")
    assert guard["logit_atol"] == demo_guard.LOGIT_ATOL
    assert guard["repeat_max_logit_difference"] < demo_guard.LOGIT_ATOL / 10
