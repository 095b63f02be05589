"""`nph doctor`: the versions nph runs on and whether they fit together (see nphcli.app.doctor)."""

from __future__ import annotations

import typer

from nphcli.cli.app import app
from nphcli.cli.options import JsonOutput
from nphcli.cli.render import print_json, print_table


@app.command("doctor")
def doctor_command(as_json: JsonOutput = False) -> None:
    """Check the installation: Python, torch, torchvision (and that it matches torch), CUDA
    devices, faiss, matplotlib, torch's threads and the bundled sample data. Exit status 1 when
    something nph needs is broken."""
    from nphcli.app.doctor import diagnose

    report = diagnose()
    if as_json:
        print_json(report)
    else:
        rows = [[name, _status(check), _detail(name, check)] for name, check in report.items()]
        print_table("nph doctor", ["check", "status", "details"], rows)
    if not all(check["ok"] for check in report.values()):
        raise typer.Exit(1)


def _status(check: dict) -> str:
    """PROBLEM: nph or a part of it cannot run; NOTE: it runs, with something worth changing."""
    if not check["ok"]:
        return "PROBLEM"
    return "NOTE" if check.get("note") else "ok"


def _detail(name: str, check: dict) -> str:
    """One line per check: what was found, and the error and hint when there is one."""
    if name == "cuda":
        found = ", ".join(check["devices"]) or "no CUDA device"
    elif name == "sample_data":
        found = check.get("path") or ""
    elif name == "torch" and check.get("version"):
        found = f"{check['version']} (CUDA build {check['cuda_build']}, {check['threads']} threads)"
    else:
        found = check.get("version") or "not installed"
    if name == "python":
        found += f" ({check['executable']})"
    extra = [check[key] for key in ("error", "hint") if check.get(key) and check["ok"] is False]
    return "; ".join([found, *extra, *([check["note"]] if check.get("note") else [])])
