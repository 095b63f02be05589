"""Regenerate the pictures and result tables the docs show, each from the command printed beside it.

    python docs/regenerate.py                 # every item (tens of minutes on 2 cores)
    python docs/regenerate.py --only NAME     # one item (repeatable); --list names them
    python docs/regenerate.py --check         # check the records only; runs nothing

An item is the shell commands a docs page prints (verbatim, `nph` being this checkout's CLI), run
by bash in a scratch folder, and what they leave there: pictures, copied under docs/, and tables,
rendered from the files and written into the page between `<!-- regenerated NAME {...} -->` and
`<!-- /regenerated NAME -->`. Each picture item leaves a record beside its pictures
(docs/img/NAME.json) and each table one in its opening marker: the commands and the nph version
that made it. `--check` (and tests/docs/test_docs_regenerated.py) checks that every picture the docs
show has a record, that every record's commands are the item's and appear in its page's text,
and that its nph version is the package's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
IMG = DOCS / "img"

# Pictures the docs show that this script does not make, and who does.
SKIPPED = {
    "img/timeseries-epoch.png": "owned by `nph paper timeseries` (docs/reproduction-timeseries.md)",
    "results/paper_mil_quick/mil_benchmark.png": "owned by `nph paper mil` (paper-tables.md)",
    "results/paper_mil_reduced/mil_benchmark.png": "owned by `nph paper mil` (paper-tables.md)",
    "results/paper-timeseries/mts-result.png": "owned by `nph paper timeseries`",
    "img/mil-quick.png": "MIL training (`nph mil`, minutes per preset), owned with `nph paper mil`",
    "img/mil-long.png": "MIL training (`nph mil`, about an hour), owned with `nph paper mil`",
    "img/text-recall.png": "a measurement: benchmarks/text_recall.py (embedding model, timings)",
}
# Pages whose commands and numbers are another owner's (nph paper ...): not scanned here.
SKIPPED_PAGES = ("paper-tables.md", "reproduction-timeseries.md")


@dataclass(frozen=True)
class Table:
    """A table of `page`, rendered by `render` from the item's scratch folder."""

    name: str
    render: Callable[[Path], str]


@dataclass(frozen=True)
class Item:
    name: str
    page: str  # under docs/: the page that prints the commands
    commands: tuple[str, ...]  # exactly as the page prints them (a `\` continuation as one line)
    pictures: dict[str, str] = field(default_factory=dict)  # scratch path -> path under docs/
    tables: tuple[Table, ...] = ()
    skip: str = ""  # why a full run leaves it out (it runs only when named with --only)


# ---------------------------------------------------------------- table renderers


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _num(value: float) -> str:
    return f"{value:g}"


def _beta_table(file: str) -> Callable[[Path], str]:
    """Mean success / mean SSE over the trials, a line per model and condition, a column per β."""

    def render(scratch: Path) -> str:
        cells: dict[tuple, list[dict]] = defaultdict(list)
        for row in _rows(scratch / file):
            if row["mask"] and row["noise"]:
                continue  # the grid's mask x noise corner: not a condition of the table
            cells[(row["model"], row["mask"], row["noise"], row["beta"])].append(row)
        betas = sorted({key[3] for key in cells})
        models = list(dict.fromkeys(key[0] for key in cells))
        head = " | ".join(f"**{_num(b)}**" if b == 0.3 else _num(b) for b in betas)
        lines = [f"| model, condition | β = {head} |", "| --- |" + " --- |" * len(betas)]
        for mask, noise, condition in (
            (0, 0, "clean"),
            (0.5, 0, "`--mask 0.5`"),
            (0, 0.5, "`--noise 0.5`"),
        ):
            for model in models:
                runs = [cells[(model, mask, noise, b)] for b in betas]
                values = " | ".join(
                    f"{statistics.mean(r['success_mean'] for r in rs):.2f} / "
                    f"{statistics.mean(r['sse_mean'] for r in rs):.1f}"
                    for rs in runs
                )
                lines.append(f"| {model}, {condition} | {values} |")
        return "\n".join(lines)

    return render


ENERGY_MODELS = (
    ("dense", "dense"),
    ("sparse", "sparse"),
    ("entmax", "entmax α = 1.5"),
    ("topk", "topk k = 0.2"),
)


def _energy_table(scratch: Path) -> str:
    lines = [
        "| model | E(x_0) | E(x_20) | largest rise | ‖T(x) − x‖ at step 19, max |",
        "| --- | --- | --- | --- | --- |",
    ]
    for model, label in ENERGY_MODELS:
        trace = json.loads((scratch / f"trace-{model}.json").read_text())["trace"]
        rises = [s["energy_rise_max"] for s in trace if s["energy_rise_max"] is not None]
        rise = max(0.0, *rises)
        last = next(s for s in trace if s["step"] == 19)["residual_max"]
        lines.append(
            f"| {label} | {_minus(trace[0]['energy_mean'])} | {_minus(trace[-1]['energy_mean'])} | "
            f"{_small(rise)} | {_small(last)} |"
        )
    return "\n".join(lines)


def _minus(value: float) -> str:
    return f"{value:.2f}".replace("-", "−")


def _small(value: float) -> str:
    return "0" if value == 0 else f"{value:.1e}"


FIXED_POINT_MODELS = (("topk", "top-20 %"), ("window", "window 5"), ("random", "random 50 %"))


def _fixed_point_table(scratch: Path) -> str:
    lines = [
        "| model | reach a fixed point | energy never rises | nearest its target "
        "| error ≤ dense's |",
        "| --- | --- | --- | --- | --- |",
    ]
    dense = None
    for model, label in FIXED_POINT_MODELS:
        fp = json.loads((scratch / f"fp-{model}.json").read_text())["fixed_point"]
        n = fp["queries"]
        lines.append(
            f"| {label} | {fp['converged']} / {n} | {fp['energy_monotone']} / {n} | "
            f"{fp['at_target']} | {fp['error_le_dense']} / {n} |"
        )
        dense = fp
    assert dense is not None
    n = dense["queries"]
    lines.append(
        f"| dense | {dense['dense_converged']} / {n} | {dense['dense_energy_monotone']} / {n} | "
        f"{dense['dense_at_target']} | – |"
    )
    return "\n".join(lines)


def _attractor_table(scratch: Path) -> str:
    data = json.loads((scratch / "docs/img/attractors-mnist-dense/attractors.json").read_text())
    lines = [
        "| β | success | at one pattern | metastable | global | median s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in data["settings"]:
        lines.append(
            f"| {_num(s['params']['beta'])} | {s['success']:.2f} | {s['at_pattern']:.2f} | "
            f"{s['at_metastable']:.2f} | {s['at_global']:.2f} | "
            f"{statistics.median(s['sizes']):g} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- the items

_BL = "docs/results/baselines"
BASELINE_PLOTS = (  # results file, options, picture: the pictures baselines.md shows
    ("mnist-mask", "--metric success --x size", "baselines-mnist-mask-success.png"),
    ("mnist-noise", "--metric success --x noise", "baselines-mnist-noise-success.png"),
    ("mnist-mask-beta", "--metric success --x beta", "baselines-mnist-mask-beta-success.png"),
    ("cifar10-mask", "--metric success --x size", "baselines-cifar10-mask-success.png"),
    ("capacity-pm1-d200", "--metric mse --x size --where flip=0", "capacity-pm1-d200-mse.png"),
    ("capacity-pm1-d500", "--metric mse --x size", "capacity-pm1-d500-mse.png"),
    ("pm1-flip", "--metric success --x size --facet flip", "baselines-pm1-flip-success.png"),
)
ITEMS = (
    Item(
        "comparison-mnist",
        "retrieving.md",
        (
            "nph store mnist --n 100 --normalize centered --force",
            "nph retrieve --model dense,sparse,topk --k 10 --mask 0.5 --queries 8 --beta 0.5 "
            "--save-grid cmp.png --force",
        ),
        {"cmp.png": "img/comparison-mnist.png"},
    ),
    Item(
        "attractors-mnist-dense",
        "baselines.md",
        (
            "nph store mnist --n 100 --normalize minmax --out mnist100.safetensors",
            "nph attractors --memory mnist100.safetensors --model dense --queries 50 --steps 20 "
            "--beta 0.01,0.05,0.1,0.5 --noise 0.3 --pictures docs/img/attractors-mnist-dense",
        ),
        {
            f"docs/img/attractors-mnist-dense/{name}": f"img/attractors-mnist-dense/{name}"
            for name in ("attractors.json", "sizes.png", "energy.png", "basins.png")
        },
        (Table("attractors-mnist-dense", _attractor_table),),
    ),
    Item(
        "phase-mnist",
        "plots.md",
        (
            "nph sweep --preset phase --threads 1 --out phase.jsonl",
            "nph plot phase.jsonl --x beta --y noise --out phase.png --size 900x600",
        ),
        {"phase.png": "img/phase-mnist.png"},
    ),
    Item(
        "baselines",
        "baselines.md",
        (
            "nph store random --distribution binary --dim 200 --n 2000 --normalize none --seed 0 "
            "--out pm1.safetensors",
            "nph store random --distribution binary --dim 500 --n 1000 --normalize none --seed 1 "
            "--out pm1-500.safetensors",
            "nph sweep --preset baselines --dataset mnist --trials 5 --threads 1 "
            f"--out {_BL}/mnist-mask.jsonl --plot docs/img/baselines-mnist-mask.png",
            "nph sweep --preset baselines --dataset mnist --sizes 100 --beta 0.01,0.1,1,10 "
            f"--trials 3 --threads 1 --out {_BL}/mnist-mask-beta.jsonl "
            "--plot docs/img/baselines-mnist-mask-beta.png",
            "nph sweep --preset baselines --dataset mnist --sizes 100 --mask 0 "
            "--noise 0.3162,0.6325,1.0,1.1832 --trials 5 --threads 1 "
            f"--out {_BL}/mnist-noise.jsonl --plot docs/img/baselines-mnist-noise.png",
            "nph sweep --preset baselines --dataset cifar10 --sizes 5,10,20 --trials 5 --threads 1 "
            f"--out {_BL}/cifar10-mask.jsonl --plot docs/img/baselines-cifar10-mask.png",
            "nph sweep --preset baselines --dataset pm1.safetensors --normalize none --mask 0 "
            "--mask-mode random --flip 0.1,0.2 --sizes 10,20,40 "
            "--model nearest,dense,sparse,hebbian,pseudoinverse --metric euclidean --steps 20 "
            f"--beta 0.1 --trials 5 --threads 1 --out {_BL}/pm1-flip.jsonl "
            "--plot docs/img/baselines-pm1-flip.png",
            "nph sweep --dataset pm1.safetensors --normalize none "
            "--sizes 10,16,20,24,28,32,36,40,50,60 --trials 5 --model hebbian,pseudoinverse "
            "--order async --steps 20 --noise 0 --flip 0,0.05 --threads 1 "
            f"--out {_BL}/capacity-pm1-d200.jsonl --plot docs/img/capacity-pm1-d200.png",
            "nph sweep --dataset pm1-500.safetensors --normalize none "
            "--sizes 40,50,60,70,80,90,100,120 --trials 3 --model hebbian --order sync --steps 30 "
            f"--noise 0 --threads 1 --out {_BL}/capacity-pm1-d500.jsonl "
            "--plot docs/img/capacity-pm1-d500.png",
            *(
                f"nph plot {_BL}/{name}.jsonl {options} --out docs/img/{picture}"
                for name, options, picture in BASELINE_PLOTS
            ),
        ),
        {
            **{
                f"docs/img/{name}": f"img/{name}"
                for stem in (
                    "baselines-mnist-mask",
                    "baselines-mnist-mask-beta",
                    "baselines-mnist-noise",
                    "baselines-cifar10-mask",
                    "baselines-pm1-flip",
                )
                for name in (f"{stem}.png", f"{stem}-success.png")
            },
            **{
                f"docs/img/{name}": f"img/{name}"
                for stem in ("capacity-pm1-d200", "capacity-pm1-d500")
                for name in (f"{stem}.png", f"{stem}-mse.png")
            },
            **{
                f"{_BL}/{name}.jsonl": f"results/baselines/{name}.jsonl"
                for name in (
                    "mnist-mask",
                    "mnist-mask-beta",
                    "mnist-noise",
                    "cifar10-mask",
                    "pm1-flip",
                    "capacity-pm1-d200",
                    "capacity-pm1-d500",
                )
            },
        },
    ),
    Item(
        "paper-mnist",
        "reproduction.md",
        (
            "nph sweep --preset paper-mask --dataset mnist --threads 1 --out mask.jsonl "
            "--plot mask.png",
            "nph sweep --preset paper-noise --dataset mnist --threads 1 --out noise.jsonl "
            "--plot noise.png",
            "nph plot noise.jsonl --x variance --out noise-variance.png",
            "nph plot mask.jsonl --metric success --out mask-success.png",
        ),
        {
            "mask.png": "img/mnist-mask-sse.png",
            "mask-success.png": "img/mnist-mask-success.png",
            "noise-variance.png": "img/mnist-noise-sse.png",
        },
    ),
    Item(
        "paper-cifar10",
        "reproduction.md",
        (
            "nph sweep --preset paper-mask --dataset cifar10 --sizes 5,10,20 --threads 1 "
            "--out cifar-mask.jsonl --plot cifar-mask.png",
            "nph sweep --preset paper-noise --dataset cifar10 --sizes 20 --threads 1 "
            "--out cifar-noise.jsonl",
            "nph plot cifar-noise.jsonl --x variance --out cifar-noise.png",
        ),
        {
            "cifar-mask.png": "img/cifar10-mask-sse.png",
            "cifar-noise.png": "img/cifar10-noise-sse.png",
        },
    ),
    Item(
        "fixed-points",
        "reproduction.md",
        (
            "nph store mnist --n 200 --seed 0 --normalize minmax --out m200.safetensors",
            *(
                f"nph retrieve --memory m200.safetensors --model {model} --beta 0.3 --mask 0.5 "
                f"--steps 20 --trace --json > trace-{model}.json"
                for model, _ in ENERGY_MODELS
            ),
            *(
                f"nph analyze m200.safetensors --beta 0.3 --model {model} {param} --mask 0.5 "
                f"--fixed-point 20 --json > fp-{model}.json"
                for model, param in (
                    ("topk", "--k 0.2"),
                    ("window", "--window 5"),
                    ("random", "--k 0.5"),
                )
            ),
        ),
        {},
        (Table("energies", _energy_table), Table("fixed-points", _fixed_point_table)),
    ),
    *(
        Item(
            f"default-beta-{normalize}",
            "models.md",
            (
                f"nph sweep --dataset mnist --normalize {normalize} --sizes 100 --trials 5 "
                "--model dense,topk,sparse,entmax --beta 0.1,0.2,0.3,0.5,1,2 --mask 0,0.5 "
                f"--noise 0,0.5 --threads 1 --out beta-{normalize}.jsonl",
            ),
            {},
            (Table(f"default-beta-{normalize}", _beta_table(f"beta-{normalize}.jsonl")),),
        )
        for normalize in ("minmax", "centered")
    ),
)


# ---------------------------------------------------------------- records and checks


def version() -> str:
    sys.path.insert(0, str(ROOT))
    from nphcli.version import __version__

    return __version__


def record_path(item: Item) -> Path:
    return IMG / f"{item.name}.json"


MARKER = re.compile(r"<!-- regenerated (\S+) (\{.*?\}) -->\n(.*?)\n<!-- /regenerated \1 -->", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)


def page_text(page: str) -> str:
    """The page as a reader sees its commands: comments dropped, `\\` continuations joined,
    every run of white space (a line break in prose too) one space."""
    text = COMMENT.sub("", (DOCS / page).read_text(encoding="utf-8"))
    return re.sub(r"\s+", " ", re.sub(r"\\\n", " ", text))


def printed(command: str, text: str) -> bool:
    return re.sub(r"\s+", " ", command) in text


def problems() -> list[str]:
    """What is out of date or missing: one line each (empty when the docs are current)."""
    found, have, ours = [], version(), set()
    for item in ITEMS:
        text = page_text(item.page)
        found += [
            f"{item.name}: docs/{item.page} does not print `{c}`"
            for c in item.commands
            if not printed(c, text)
        ]
        records = []
        ours.update(item.pictures.values())
        if item.skip:
            continue
        if item.pictures:
            path = record_path(item)
            if not path.exists():
                found.append(f"{item.name}: no record {path.relative_to(ROOT)}")
            else:
                records.append(json.loads(path.read_text()))
        page = (DOCS / item.page).read_text(encoding="utf-8")
        markers = {m.group(1): json.loads(m.group(2)) for m in MARKER.finditer(page)}
        for table in item.tables:
            if table.name not in markers:
                found.append(f"{item.name}: docs/{item.page} has no table `{table.name}`")
            else:
                records.append(markers[table.name])
        for record in records:
            if record.get("commands") != list(item.commands):
                found.append(f"{item.name}: recorded commands differ from the item's; regenerate")
            if record.get("nph_version") != have:
                found.append(f"{item.name}: made by nph {record.get('nph_version')}, not {have}")
    for page in sorted(DOCS.glob("*.md")):
        if page.name in SKIPPED_PAGES:
            continue
        for ref in re.findall(r"\]\(((?:img|results)/[^)\s]+\.png)\)", page.read_text()):
            if ref not in ours and ref not in SKIPPED:
                found.append(f"docs/{page.name} shows {ref}, which no item makes")
    for path in sorted(IMG.rglob("*.png")):
        ref = path.relative_to(DOCS).as_posix()
        if ref not in ours and ref not in SKIPPED:
            found.append(f"docs/{ref} is made by no item (and skipped by none)")
    return found


# ---------------------------------------------------------------- running


def run(item: Item, scratch: Path, docs: Path = DOCS) -> float:
    """Run the item's commands in `scratch`, copy its pictures and write its tables into `docs`
    (a copy of docs/ in the tests); seconds."""
    bin_dir = scratch / ".bin"
    bin_dir.mkdir()
    (bin_dir / "nph").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m nphcli "$@"\n')
    (bin_dir / "nph").chmod(0o755)
    for target in item.pictures:
        (scratch / target).parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    start = time.perf_counter()
    for command in item.commands:
        print(f"[{item.name}] $ {command}", file=sys.stderr, flush=True)
        subprocess.run(["bash", "-eo", "pipefail", "-c", command], cwd=scratch, env=env, check=True)
    seconds = time.perf_counter() - start
    record = {"commands": list(item.commands), "nph_version": version()}
    for source, target in item.pictures.items():
        (docs / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(scratch / source, docs / target)
    if item.pictures:
        sidecar = {"item": item.name, "page": f"docs/{item.page}", **record}
        sidecar |= {"outputs": sorted(item.pictures.values()), "seconds": round(seconds, 1)}
        (docs / record_path(item).relative_to(DOCS)).write_text(
            json.dumps(sidecar, indent=2, ensure_ascii=False) + "\n"
        )
    for table in item.tables:
        write_table(docs / item.page, table.name, record, table.render(scratch))
    return seconds


def write_table(path: Path, name: str, record: dict, table: str) -> None:
    text = path.read_text(encoding="utf-8")
    block = (
        f"<!-- regenerated {name} {json.dumps(record, ensure_ascii=False)} -->\n"
        f"{table}\n<!-- /regenerated {name} -->"
    )
    pattern = re.compile(
        rf"<!-- regenerated {re.escape(name)} .*?<!-- /regenerated {re.escape(name)} -->", re.S
    )
    if not pattern.search(text):
        raise SystemExit(f"{path} has no place for table {name}: add its two markers")
    path.write_text(pattern.sub(lambda _: block, text), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="one item (repeatable)")
    parser.add_argument("--check", action="store_true", help="check the records; run nothing")
    parser.add_argument("--list", action="store_true", help="name the items and what is skipped")
    args = parser.parse_args(argv)
    if args.list:
        for item in ITEMS:
            print(
                f"{item.name}\tdocs/{item.page}" + (f"\tskipped: {item.skip}" if item.skip else "")
            )
        for ref, why in SKIPPED.items():
            print(f"skipped: docs/{ref}\t{why}")
        return 0
    if args.check:
        found = problems()
        print("\n".join(found) or "every picture and table is current")
        return 1 if found else 0
    names = {item.name for item in ITEMS}
    unknown = sorted(set(args.only or ()) - names)
    if unknown:
        raise SystemExit(f"no item {', '.join(unknown)}; --list names them")
    start, failed = time.perf_counter(), []
    for item in ITEMS:
        if item.name not in (args.only or [i.name for i in ITEMS if not i.skip]):
            continue
        with tempfile.TemporaryDirectory(prefix=f"nph-docs-{item.name}-") as scratch:
            try:
                seconds = run(item, Path(scratch))
            except Exception:  # one item's failure keeps the others' results
                traceback.print_exc()
                failed.append(item.name)
                continue
        print(f"{item.name}: {seconds:.1f} s", flush=True)
    print(f"total: {time.perf_counter() - start:.1f} s", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
