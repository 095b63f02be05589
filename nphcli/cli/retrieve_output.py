"""What `nph retrieve` prints: the single run's tables, JSON or CSV, and the comparison of
several settings (JSON Lines, one CSV, or one table)."""

from __future__ import annotations

from nphcli.cli.render import format_value, print_csv, print_json, print_table


def print_report(report, output, steps_trace) -> None:
    """One setting: a JSON object, a CSV header and row (or per-query rows), or tables."""
    if output.json:
        result = report.to_json(per_query=output.per_query)
        if steps_trace is not None:
            result["trace"] = steps_trace
        print_json(result)
    elif output.csv:
        rows = report.per_query_rows() if output.per_query else [report.to_row()]
        print_csv(rows, header=not output.no_header)
    else:
        _print_tables(report, per_query=output.per_query)
        if report.recall is not None:
            _print_recall(report.recall)
        if steps_trace is not None:
            names = ["step", "energy_mean", "energy_rise_max", "residual_mean", "residual_max"]
            rows = [[item[name] for name in names] for item in steps_trace]
            print_table("Trace (float64)", names, rows)


def print_many(settings, reports, output) -> None:
    """Several settings: a JSON Lines stream, one CSV (header once), or a comparison table."""
    if output.json:
        for report in reports:
            print_json(report.to_json(per_query=output.per_query))
    elif output.csv:
        rows = []
        for i, report in enumerate(reports):
            if output.per_query:  # which setting each query row belongs to
                model = report.config["model"]
                rows.extend({"setting": i, "model": model, **r} for r in report.per_query_rows())
            else:
                rows.append(report.to_row())
        print_csv(rows, header=not output.no_header)
    else:
        _print_comparison(settings, reports)


def _print_comparison(settings, reports) -> None:
    """One row per setting: its model and parameters, then a column for every other setting
    option whose value differs between settings (`setting_values`), the metric means and the
    median retrieval time. Options every setting shares go to the title: mask and noise
    always, the others where not at their default. So a new setting option shows wherever it
    varies, with no edit here."""
    from nphcli.evaluation.settings import given_params, setting_values
    from nphcli.schema.fields import get_field
    from nphcli.schema.metrics import shown_in

    values = [setting_values(setting) for setting in settings]
    names = [name for name in values[0] if name != "model"]
    varying = [name for name in names if len({repr(v[name]) for v in values}) > 1]
    shown = ("mask", "noise")
    same = [
        (name, values[0][name])
        for name in names
        if name not in varying and (name in shown or values[0][name] != get_field(name).default)
    ]
    metrics = [m.name for m in shown_in("compare")]
    rows = []
    for setting, flat, report in zip(settings, values, reports, strict=True):
        means = [None if report.metrics[m] is None else report.metrics[m]["mean"] for m in metrics]
        timing = report.timing["retrieve_median_s"]
        differing = [flat[name] for name in varying]
        rows.append([setting.model, given_params(setting), *differing, *means, timing])
    first = reports[0].config
    title = (
        f"{len(reports)} settings: {first['memory']['file']} (M={first['memory']['M']}), "
        f"{first['queries']['Q']} queries, seed {first['seed']}"
    )
    stated = ("seed", "queries")  # in the title already
    title += "".join(f", {name} {format_value(v)}" for name, v in same if name not in stated)
    columns = ["model", "parameters", *varying, *metrics, "retrieve s"]
    print_table(title + "; metric means per query", columns, rows, width=120)


def _print_tables(report, *, per_query: bool) -> None:
    config = report.config
    memory, queries, corruption = config["memory"], config["queries"], config["corruption"]
    params = ", ".join(f"{key}={format_value(value)}" for key, value in config["params"].items())
    corrupted = _corruption_text(corruption)
    shape = f"M={memory['M']}, d={memory['d']}" + (
        f", d_v={memory['d_v']}" if memory["hetero"] else ""
    )
    run_rows = [
        ("model", f"{config['model']} ({params})"),
        ("memory", f"{memory['file'] or '(in memory)'} ({shape})"),
        ("queries", f"{queries['Q']} ({_query_text(queries)})"),
        ("corruption", corrupted),
        ("device", f"{config['device']}, {config['dtype']}, batch {config['batch_size']}"),
        ("seed", config["seed"]),
    ]
    print_table("Run", ["setting", "value"], run_rows)
    metric_rows = [
        (name, stats["mean"], stats["std"], stats["median"])
        for name, stats in report.metrics.items()
        if stats is not None
    ]
    print_table("Metrics (per query)", ["metric", "mean", "std", "median"], metric_rows)
    timing = report.timing
    timing_rows = [
        ("load", timing["load_s"], ""),
        ("corrupt", timing["corrupt_s"], ""),
        ("transfer", timing["transfer_s"], "host ↔ device copies"),
        ("warm-up", timing["warmup_s"], "first batch, not counted"),
        ("retrieve (median)", timing["retrieve_median_s"], f"of {config['repeat']} run(s)"),
        ("retrieve (min)", timing["retrieve_min_s"], ""),
        ("metrics", timing["metrics_s"], ""),
        ("total", timing["total_s"], ""),
        ("per query", timing["us_per_query"] / 1e6, f"{format_value(timing['us_per_query'])} µs"),
        ("throughput", "", f"{format_value(timing['queries_per_s'])} queries/s"),
    ]
    print_table("Timing (seconds)", ["phase", "s", "note"], timing_rows)
    if config.get("index"):
        _print_index(config["index"])
    if per_query:
        rows = report.per_query_rows()
        # piped: as wide as the columns need, never squeezed into rich's default 80
        print_table("Per query", list(rows[0]), [list(row.values()) for row in rows], width=1000)


def _corruption_text(corruption: dict) -> str:
    """The report's corruption record in words, in the order `corrupt` applies it; every
    corruption in the record that is set is named."""
    parts = []
    for name, value in corruption.items():
        if name in ("mask_mode", "fill", "noise_clip") or not value:
            continue
        if name == "mask":
            mode, fill = corruption["mask_mode"], format_value(corruption["fill"])
            parts.append(f"mask {format_value(value)} ({mode}, fill {fill})")
        elif name == "noise":
            clipped = ", clipped to [0, 1]" if corruption.get("noise_clip") else ""
            parts.append(f"Gaussian noise σ = {format_value(value)}{clipped}")
        else:
            parts.append(f"{name.replace('_', '-')} {format_value(value)}")
    return ", then ".join(parts) or "none"


def _print_index(index: dict) -> None:
    search = ", ".join(
        f"{name} {index[name]}" for name in ("nprobe", "ef", "candidates") if index[name]
    )
    rows = [
        ("index", f"{index['file']} ({index['kind']}; {search})"),
        ("certified exact", index["certified_fraction"]),
    ]
    check = index["check_exact"]
    if check:
        rows += [
            (f"recall@{check['k']} (sample of {check['queries']})", check["recall_at_k"]),
            (
                "‖T − T_exact‖ mean / max",
                f"{check['pattern_gap_mean']:.3g} / {check['pattern_gap_max']:.3g}",
            ),
            ("sse − sse_exact (mean)", check["sse_difference_mean"]),
        ]
    print_table("Index (approximation cost)", ["measure", "value"], rows)


def _query_text(queries: dict) -> str:
    if queries["source"] == "stored":
        return "corrupted stored patterns; target: the uncorrupted pattern"
    targets = {
        "file": f"targets from {queries['targets_file']}",
        "indices": "targets by stored index",
        None: "no targets",
    }[queries["targets"]]
    return f"from {queries['file']}; {targets}"


def _print_recall(recall: list[dict]) -> None:
    """Per query: the items recalled with their weights (rules that form weights; a hetero
    memory's key → its value), then the item nearest the output with its cosine."""
    rows = []
    for number, entry in enumerate(recall, 1):
        for rank, item in enumerate(entry["recalled"] or [], 1):
            text = item.get("text", "")
            if "value" in item:
                text += f" → {item['value'].get('text', item['value'].get('id'))}"
            weight = f"weight {format_value(item['weight'])}"
            rows.append([number, f"#{rank}", item.get("id", item["row"]), text, weight])
        near = entry["nearest"]
        cosine = f"cosine {format_value(near['cosine'])}"
        rows.append([number, "nearest", near.get("id", near["row"]), near.get("text", ""), cosine])
    print_table("Recalled", ["query", "", "id", "text", "score"], rows)
