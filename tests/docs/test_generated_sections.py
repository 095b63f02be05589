"""`catalog.write_generated`, which `python -m nphcli.cli.reference --write` runs, rewrites the
snapshot and the section between the markers of every doc page, nothing else."""

from __future__ import annotations

import shutil

from nphcli.schema import catalog


def test_write_regenerates_every_stale_file_and_only_the_marked_section(tmp_path, monkeypatch):
    pages = []
    for source in catalog.DOC_FILES:
        page = tmp_path / source.name
        shutil.copy(source, page)
        text = page.read_text(encoding="utf-8")
        start = text.index(catalog.README_START) + len(catalog.README_START)
        page.write_text(text[:start] + "\n| stale |\n" + text[start:], encoding="utf-8")
        pages.append((page, text))
    checked_in = catalog.CATALOG_FILE.read_text(encoding="utf-8")
    snapshot = tmp_path / "model_catalog.json"
    snapshot.write_text("[]\n", encoding="utf-8")
    monkeypatch.setattr(catalog, "DOC_FILES", tuple(page for page, _ in pages))
    monkeypatch.setattr(catalog, "CATALOG_FILE", snapshot)

    every = [snapshot, *(page for page, _ in pages)]
    assert catalog.stale_files() == every
    assert catalog.write_generated() == every
    assert catalog.stale_files() == [] and catalog.write_generated() == []
    for page, original in pages:
        assert page.read_text(encoding="utf-8") == original  # the checked-in pages are current
    assert snapshot.read_text(encoding="utf-8") == checked_in
