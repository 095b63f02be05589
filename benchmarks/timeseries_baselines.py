"""Reference points for the time-series table: the test MSE and MAE of simple predictors on the
same split, scaler and windows as `nph paper timeseries` (nothing trained by gradient descent).

    python benchmarks/timeseries_baselines.py ETTh1.csv --horizons 96,192,336,720

- zero: the training mean (0 after scaling);
- last: the last input value, repeated over the horizon;
- input mean: the mean of the input window, repeated (a function of the set of input values);
- linear (ordered): least squares from the L inputs to the H targets (ridge 1e-3), fitted on
  the training windows;
- linear (sorted): the same on the sorted inputs, a function of the set of values only, as the
  paper's network without positions is for every model but Window.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.experiments.timeseries import prepare, read_series


def _errors(prediction: Tensor, target: Tensor) -> dict[str, float]:
    error = prediction - target
    return {"mse": float(error.square().mean()), "mae": float(error.abs().mean())}


def _ridge(x: Tensor, y: Tensor, strength: float = 1e-3):
    """Least squares y ≈ [x, 1] W with a small ridge; returns the fitted predictor."""

    def design(z: Tensor) -> Tensor:
        return torch.cat([z, torch.ones(z.shape[0], 1, dtype=z.dtype)], dim=1)  # (N, L + 1)

    a = design(x)
    weights = torch.linalg.solve(a.T @ a + strength * torch.eye(a.shape[1], dtype=a.dtype), a.T @ y)
    return lambda z: design(z) @ weights  # (N, H)


def baselines(path: str, horizon: int, split: str = "months") -> dict[str, dict[str, float]]:
    data = prepare(read_series(path), input_len=horizon, horizon=horizon, split=split)
    x_train, y_train = (t.double() for t in data.parts["train"])
    x, y = (t.double() for t in data.parts["test"])
    ordered = _ridge(x_train, y_train)
    sorted_ = _ridge(x_train.sort(dim=1).values, y_train)
    return {
        "zero": _errors(torch.zeros_like(y), y),
        "last": _errors(x[:, -1:].expand_as(y), y),
        "input mean": _errors(x.mean(dim=1, keepdim=True).expand_as(y), y),
        "linear (ordered)": _errors(ordered(x), y),
        "linear (sorted)": _errors(sorted_(x.sort(dim=1).values), y),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--horizons", default="96,192,336,720")
    parser.add_argument("--split", default="months")
    args = parser.parse_args()
    try:
        result = {
            h: baselines(args.data, h, args.split) for h in map(int, args.horizons.split(","))
        }
    except NphError as error:
        sys.stderr.write(f"Error: {error}\n")
        raise SystemExit(2) from None
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
