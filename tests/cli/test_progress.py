"""The CLI's one progress bar (`nphcli.cli.progress`), and the library's side of it: a long job
calls progress(total) once, then progress(None, label) after each unit of work."""

from __future__ import annotations

import io

import pytest
import torch

from nphcli.cli import progress as progress_module
from nphcli.cli.progress import ProgressBar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(bar: ProgressBar, total: int) -> None:
    with bar as progress:
        progress(total)
        for i in range(total):
            progress(None, f"step {i}")


def test_bar_draws_count_and_label_on_a_terminal(monkeypatch):
    stderr = _Terminal()
    monkeypatch.setattr("sys.stderr", stderr)
    monkeypatch.setattr(progress_module, "quiet", lambda: False)
    _run(ProgressBar("mil"), 3)
    drawn = stderr.getvalue()
    assert "mil step 2" in drawn and "3/3" in drawn


@pytest.mark.parametrize("terminal, quiet", [(False, False), (True, True)])
def test_bar_is_silent_off_a_terminal_and_with_quiet(monkeypatch, terminal, quiet):
    stderr = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    monkeypatch.setattr(progress_module, "quiet", lambda: quiet)
    _run(ProgressBar("sweep"), 3)
    assert stderr.getvalue() == ""


@pytest.mark.slow  # trains (the optimiser's first use imports torch._dynamo: seconds)
def test_mil_reports_every_epoch_to_the_progress_callable(tmp_path, monkeypatch):
    from nphcli.experiments import mil

    gen = torch.Generator().manual_seed(0)
    pools = (torch.rand(60, 20, generator=gen), torch.arange(60) % 10)
    pools += (torch.rand(30, 20, generator=gen), torch.arange(30) % 10)
    monkeypatch.setattr(mil, "load_pools", lambda root=None: (*pools, "synthetic"))
    config = mil.MILConfig(
        bag_sizes=(3,), train_bags=12, test_bags=6, epochs=2, runs=1, batch_size=5,
        embed_dim=8, heads=2, head_dim=4, variants=("dense", "sparse"),
    )  # fmt: skip
    calls = []
    mil.run_experiment(config, tmp_path / "mil.jsonl", progress=lambda *a: calls.append(a))
    assert calls == [(4,), *[(None, "dense M=3 run 0")] * 2, *[(None, "sparse M=3 run 0")] * 2]
