"""The docs' pictures and result tables come from the commands the pages print (docs/regenerate.py).

The fast tests read the records only: each picture has a sidecar and each table an opening marker
naming the commands and the nph version that made it; the commands must be the item's, printed
in its page, and the version the package's. The slow test reruns one small item.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("docs_regenerate", ROOT / "docs/regenerate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


regenerate = _load()


def test_every_picture_and_table_the_docs_show_is_current():
    assert regenerate.problems() == []


def test_every_item_leaves_a_record():
    for item in regenerate.ITEMS:
        assert item.pictures or item.tables, item.name


@pytest.fixture
def docs(tmp_path, monkeypatch):
    """A copy of the pages and pictures, for the checks to find faults in."""
    copy = tmp_path / "docs"
    copy.mkdir()
    for page in regenerate.DOCS.glob("*.md"):
        shutil.copy(page, copy / page.name)
    shutil.copytree(regenerate.IMG, copy / "img")
    monkeypatch.setattr(regenerate, "DOCS", copy)
    monkeypatch.setattr(regenerate, "IMG", copy / "img")
    assert regenerate.problems() == []
    return copy


def test_a_record_from_another_version_is_named(docs):
    path = docs / "img/phase-mnist.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "nph_version": "0.0.1"}))
    assert regenerate.problems() == ["phase-mnist: made by nph 0.0.1, not " + regenerate.version()]


def test_a_table_whose_command_changed_is_named(docs):
    page = docs / "models.md"
    recorded = '"commands": ["nph sweep --dataset mnist --normalize minmax'
    page.write_text(page.read_text().replace(recorded, recorded.replace("mnist", "mnist ")))
    assert regenerate.problems() == [
        "default-beta-minmax: recorded commands differ from the item's; regenerate"
    ]


def test_a_command_the_page_no_longer_prints_is_named(docs):
    page = docs / "retrieving.md"
    stated = "nph store mnist --n 100 --normalize centered"
    page.write_text(page.read_text().replace(stated, "nph store mnist --n 100"))
    assert regenerate.problems() == [
        "comparison-mnist: docs/retrieving.md does not print "
        "`nph store mnist --n 100 --normalize centered --force`"
    ]


def test_a_missing_table_and_a_picture_of_no_item_are_named(docs):
    page = docs / "reproduction.md"
    page.write_text(page.read_text().replace("<!-- /regenerated energies -->", ""))
    shutil.copy(docs / "img/phase-mnist.png", docs / "img/stray.png")
    assert regenerate.problems() == [
        "fixed-points: docs/reproduction.md has no table `energies`",
        "docs/img/stray.png is made by no item (and skipped by none)",
    ]


def test_a_command_in_a_comment_does_not_count(docs):
    page = docs / "plots.md"
    text = page.read_text()
    command = "nph sweep --preset phase --threads 1 --out phase.jsonl"
    page.write_text(text.replace(command, "nph sweep --preset phase") + f"\n<!-- {command} -->\n")
    assert regenerate.problems() == [f"phase-mnist: docs/plots.md does not print `{command}`"]


@pytest.mark.slow
def test_the_comparison_picture_is_what_its_command_draws(tmp_path):
    image = pytest.importorskip("matplotlib.image")
    item = next(i for i in regenerate.ITEMS if i.name == "comparison-mnist")
    (tmp_path / "scratch").mkdir()
    regenerate.run(item, tmp_path / "scratch", docs=tmp_path)
    drawn = image.imread(tmp_path / "img/comparison-mnist.png")
    shown = image.imread(regenerate.IMG / "comparison-mnist.png")
    assert drawn.shape == shown.shape and (drawn == shown).all()
    record = json.loads((tmp_path / "img/comparison-mnist.json").read_text())
    assert record["commands"] == list(item.commands)
