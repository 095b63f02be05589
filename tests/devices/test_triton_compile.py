"""Every Triton kernel compiled for a Hopper GPU (sm_90) on any machine that has Triton's CUDA
backend, GPU or not. Triton's CPU interpreter runs the kernels' arithmetic but not the compiler's
rules: a loop-carried variable that changes shape, say, passes the interpreter and fails to
compile on a GPU (it did once, and the fused selection fell back to eager there). The compiler
runs in a child process, since this test process has the interpreter switched on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the kernels need Triton (installed with CUDA torch)")
pytestmark = pytest.mark.slow  # a child process compiling 16 kernels: about 10 s

# (k, G, padded groups, warps), as `select_merge` launches them: up to 8,192 groups a slice.
K_CASES = [(1, 128, 8192, 4), (10, 128, 512, 4), (10, 128, 8192, 4), (64, 64, 8192, 8)]


def _signature(names: str, constants: dict) -> dict:
    """*name: float32 pointer, &name: float64 pointer, #name: int64 pointer, @name: int32 pointer,
    %name: float32, !name: int64, name: int32 (pointers get the kernels' `_ptr` suffix); then the
    constexprs."""
    kinds = {"*": "*fp32", "&": "*fp64", "#": "*i64", "@": "*i32", "%": "fp32", "!": "i64"}
    signature = {}
    for name in names.split():
        kind = kinds.get(name[0], "i32")
        signature[name.lstrip("*&#@%!") + ("_ptr" if kind.startswith("*") else "")] = kind
    return {**signature, **{name: "constexpr" for name in constants}}


def compile_all() -> dict:
    """{case: 'ok' or the compiler's error}, for each kernel and a few constexpr choices."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from nphcli.engine import triton_entmax as entmax
    from nphcli.engine import triton_kernels as kernels
    from nphcli.engine import triton_selection as selection

    cases = []
    for complete, single in ((True, True), (False, False)):
        constants = {"COMPLETE": complete, "SINGLE": single, "BLOCK": 4096, "LEAD": 16.0}
        names = "*scores *weights *running_max *new_max *shift *sums columns %scale"
        cases.append(
            (f"step {complete} {single}", kernels._softmax_step_kernel, names, constants, 4)
        )
    for same in (True, False):
        constants = {"SAME": same, "TILE": 16, "BLOCK_D": 1024, "BLOCK_V": 1024}
        names = "*queries *keys *values *max *norm *total num_memories dim value_dim "
        names += "rows_per_program %scale"
        cases.append((f"decode {same}", kernels._decode_kernel, names, constants, 8))
    for k, group, groups, warps in K_CASES:
        constants = {"G": group, "CHUNK": selection.MAXIMA_GROUPS}
        names = "*scores row_stride width %scale @maxima groups"
        cases.append((f"maxima {group}", selection._group_maxima_kernel, names, constants, 4))
        k_pad = triton.next_power_of_2(k)
        constants = {"K": k, "K_PAD": k_pad, "G": group, "N_PAD": groups, "RUN": 32}
        names = "*scores row_stride width %scale @maxima groups *kept_scores #kept_index kept "
        for start in ("start", "!start"):  # Triton passes a start ≥ 2³¹ as int64
            case = f"select {k} {groups} {start}"
            names_start = names + f"*out_scores #out_index {start}"
            cases.append((case, selection._select_kernel, names_start, constants, warps))
    for power in (1, 2):
        for pointer in ("*", "&"):
            names = f"{pointer}z row_stride width sample_stride %lowest %mass %tolerance "
            names += f"{pointer}sums {pointer}counts"
            case = f"entmax {power} {pointer}"
            cases.append((case, entmax._weigh_kernel, names, {"POWER": power}, 4))
    for pointer in ("*", "&"):
        names = f"{pointer}z row_stride width %eps %tolerance {pointer}sums {pointer}counts"
        cases.append((f"newton {pointer}", entmax._newton_kernel, names, {}, 4))
    results = {}
    for name, kernel, names, constants, warps in cases:
        source = ASTSource(kernel, _signature(names, constants), constexprs=constants)
        try:
            triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
            results[name] = "ok"
        except Exception as error:  # noqa: BLE001  (reported by the test)
            results[name] = f"{type(error).__name__}: {error}"[-400:]
    return results


@pytest.fixture(scope="module")
def compiled() -> dict:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600
    )
    if "cannot compile here" in done.stdout:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "case",
    ["step True True", "step False False", "decode True", "decode False"]
    + sorted({f"maxima {group}" for _, group, _, _ in K_CASES})
    + [f"select {k} {n} {s}" for k, _, n, _ in K_CASES for s in ("start", "!start")]
    + [f"entmax {power} {pointer}" for power in (1, 2) for pointer in ("*", "&")]
    + ["newton *", "newton &"],
)
def test_the_kernel_compiles_for_hopper(compiled, case):
    assert compiled[case] == "ok", compiled[case]


if __name__ == "__main__":
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError as error:
        print(f"cannot compile here: {error}")
        sys.exit(0)
    print(json.dumps(compile_all()))
