"""What bench/run.py writes: results.json, results.md, plots, and the stdout summary."""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

STAGES = ["capture", "analysis", "trace", "passes", "partition", "compile_forward",
          "compile_backward"]

# (header, how to read the cell from a row and the eager row of its model); None prints "-"
MAIN_COLUMNS = [
    ("model", lambda r, e: r["model"]),
    ("mode", lambda r, e: r["mode"]),
    ("budget", lambda r, e: _num(r.get("budget"), "g")),
    ("status", lambda r, e: r["status"]),
    ("compile s", lambda r, e: _num(r.get("compile_s"), ".1f")),
    ("step ms", lambda r, e: _num(r.get("step_ms"), ".2f")),
    ("vs eager", lambda r, e: _speedup(r, e)),
    ("host ms", lambda r, e: _num(r.get("host_ms"), ".3f")),
    ("wall ms", lambda r, e: _num(r.get("wall_ms"), ".3f")),
    ("cpu ms", lambda r, e: _num(r.get("cpu_ms"), ".1f")),
    ("workers cpu ms", lambda r, e: _num(r.get("children_cpu_ms"), ".1f")),
    ("peak MB", lambda r, e: _num(r.get("peak_mb"), ".0f")),
    ("peak-base MB", lambda r, e: _num(_minus(r.get("peak_mb"), r.get("base_mb")), ".0f")),
    ("saved MB", lambda r, e: _num(r.get("saved_mb"), ".0f")),
    ("est. peak MB", lambda r, e: _num(r.get("estimated_peak_mb"), ".0f")),
    ("graphs/breaks", lambda r, e: _graphs(r)),
]

SUMMARY_COLUMNS = ["model", "mode", "budget", "status", "compile s", "step ms", "vs eager",
                   "host ms", "peak MB", "est. peak MB"]

NOTES = [
    "compile s: wall time of the first step minus the median wall time of a timed step.",
    "step ms: median over the timed steps of forward + loss.backward() + zero grads "
    "(CUDA events on GPU, perf_counter on CPU); vs eager: eager step / this step.",
    "host ms: median time until the step's Python call returns; wall ms: until the device "
    "has finished it too. For the `tiny` model these are the host overhead per call.",
    "cpu ms: CPU time a timed step, all of the row's threads (above host ms: a thread besides "
    "the step's was busy); workers cpu ms: its child processes' (Inductor's compile workers).",
    "peak MB: torch.cuda.max_memory_allocated over the timed steps; peak-base: minus what "
    "was allocated before them (parameters, batch). saved MB: what aotgrad's forward saves.",
    "budget: torch_compile via torch._functorch.config.activation_memory_budget, aotgrad "
    "via aotgrad.backend(memory_budget=...); '-' is each one's default.",
    "Inductor's on-disk cache starts empty for the run and is shared by its rows (unless "
    "--cold), so a later row can reuse kernels an earlier one compiled.",
    "With --jobs > 1 (the --quick default on GPU) rows compile side by side, so compile "
    "times include contention for the CPU; timed steps never overlap (a lock).",
]


def write_outputs(out: Path, meta: dict, rows: list[dict], plots: bool = True) -> list[str]:
    """Write everything; return notes worth printing (skipped models, missing plots)."""
    out.mkdir(parents=True, exist_ok=True)
    notes = skip_notes(rows) + (write_plots(out, rows) if plots else [])
    (out / "results.json").write_text(json.dumps({"meta": meta, "notes": notes,
                                                  "results": rows}, indent=1, default=str))
    (out / "results.md").write_text(markdown(meta, rows, notes))
    return notes


def skip_notes(rows: list[dict]) -> list[str]:
    skipped = {(r["model"], r["error"]) for r in rows if r["status"] == "skipped"}
    return [f"{model} skipped: {reason}" for model, reason in sorted(skipped)]


# ---------------------------------------------------------------------------- tables

def table(rows: list[dict], columns=MAIN_COLUMNS) -> list[list[str]]:
    eager = {r["model"]: r for r in rows if r["mode"] == "eager" and r["status"] == "ok"}
    return [[cell(r, eager.get(r["model"])) for _, cell in columns] for r in rows]


def markdown_table(headers: list[str], cells: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])


def stage_table(rows: list[dict]) -> str:
    timed = [r for r in rows if r.get("stages")]
    cells = [[r["model"], r["mode"], _num(r.get("budget"), "g")]
             + [_num(r["stages"].get(s), ".2f") for s in STAGES]
             + [_num(sum(r["stages"].values()), ".2f")] for r in timed]
    return markdown_table(["model", "mode", "budget"] + STAGES + ["total"], cells)


def markdown(meta: dict, rows: list[dict], notes: list[str]) -> str:
    headers = [h for h, _ in MAIN_COLUMNS]
    failures = [f"- **{_label(r)}** ({r['status']}): `{_one_line(r.get('error', ''))}`"
                for r in rows if r["status"] not in ("ok", "skipped")]
    parts = [
        "# aotgrad benchmark", "",
        f"- date: {meta['date']}", f"- torch: {meta['torch']}", f"- device: {meta['device']}",
        f"- python: {meta['python']}; " + ", ".join(f"{k} {v}" for k, v in
                                                     meta["versions"].items()),
        f"- settings: {meta['settings']}", f"- total: {meta.get('total_s', 0):.0f} s", "",
        "## Results", "", markdown_table(headers, table(rows)), "",
        "## aotgrad compile time by stage (s)", "", stage_table(rows), "",
        "## Failures", "", *(failures or ["none"]), "",
        "## Notes", "", *[f"- {n}" for n in notes + NOTES], "",
    ]
    return "\n".join(parts)


def summary_table(meta: dict, rows: list[dict], notes: list[str]) -> str:
    """Plain text for stdout: the last thing a remote run prints."""
    chosen = [(h, c) for h, c in MAIN_COLUMNS if h in SUMMARY_COLUMNS] + \
        [("note", lambda r, e: _one_line(r.get("error", ""))[:60])]
    headers = [h for h, _ in chosen]
    cells = table(rows, chosen)
    widths = [max(len(x) for x in col) for col in zip(headers, *cells)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [f"== aotgrad bench: {meta['date']}  torch {meta['torch']}  {meta['device']}  "
             f"({meta.get('total_s', 0):.0f} s)", *notes, fmt.format(*headers).rstrip()]
    return "\n".join(lines + [fmt.format(*row).rstrip() for row in cells])


def _num(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _minus(a, b):
    return None if a is None or b is None else a - b


def _speedup(row: dict, eager: dict | None) -> str:
    if eager is None or row.get("step_ms") is None:
        return "-"
    return f"{eager['step_ms'] / row['step_ms']:.2f}x"


def _graphs(row: dict) -> str:
    if "graphs" not in row:
        return _num(row.get("aotgrad_graphs"), "d")
    return f"{row['graphs']}/{row['graph_breaks']}"


def _label(row: dict) -> str:
    budget = "" if row.get("budget") is None else f"@{row['budget']:g}"
    return f"{row['model']}/{row['mode']}{budget}"


def _one_line(text: str) -> str:
    lines = [line for line in str(text).splitlines() if line.strip()]
    return (lines[0] if lines else "").replace("|", "/")[:300]


# ---------------------------------------------------------------------------- plots

PLOTS = [  # (file, row metric, y label)
    ("step_time.png", "step_ms", "step time (ms), lower is better"),
    ("compile_time.png", "compile_s", "compile time (s)"),
    ("peak_memory.png", "peak_mb", "peak memory (MB)"),
]


def write_plots(out: Path, rows: list[dict]) -> list[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["plots skipped: matplotlib is not installed"]
    notes = []
    charts = [(name, functools.partial(bar_chart, metric=metric, ylabel=ylabel), (metric,))
              for name, metric, ylabel in PLOTS]
    charts.append(("tradeoff.png", tradeoff_chart, ("step_ms", "peak_mb")))
    for name, chart, metrics in charts:
        ok = [r for r in rows if r["status"] == "ok" and all(r.get(m) is not None
                                                             for m in metrics)]
        try:
            if ok:
                chart(plt, ok, path=out / name)
        except Exception as e:  # a plot is a nicety: it must not cost the tables
            notes.append(f"plot {name} failed: {type(e).__name__}: {e}")
    return notes


def tradeoff_chart(plt, rows: list[dict], path: Path) -> None:
    """The memory/time curve: one panel per model, peak memory against step time, one line
    per mode through its budgets (each point labelled with its budget)."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for mode in dict.fromkeys(r["mode"] for r in rows if r["model"] == model):
            mine = sorted((r for r in rows if r["model"] == model and r["mode"] == mode),
                          key=lambda r: -(r.get("budget") if r.get("budget") is not None else 2))
            ax.plot([r["step_ms"] for r in mine], [r["peak_mb"] for r in mine], "o-",
                    label=mode)
            for r in mine:
                ax.annotate(_num(r.get("budget"), "g"), (r["step_ms"], r["peak_mb"]),
                            textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_title(model)
        ax.set_xlabel("step time (ms)")
        ax.set_ylabel("peak memory (MB)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bar_chart(plt, rows: list[dict], metric: str, ylabel: str, path: Path) -> None:
    """One panel per model (scales differ by orders of magnitude), one bar per mode."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r["model"] == model]
        ax.bar(range(len(mine)), [r[metric] for r in mine])
        ax.set_xticks(range(len(mine)), [_label(r).split("/", 1)[1] for r in mine],
                      rotation=60, ha="right", fontsize=8)
        ax.set_title(model)
        ax.set_ylabel(ylabel)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    """Redraw the tables and plots of one or more runs' results.json, merged (the rows of a
    later file replace those of an earlier one for the same model, mode and budget)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("results", type=Path, nargs="+")
    args = parser.parse_args()
    merged, meta = {}, {}
    for path in args.results:
        data = json.loads(path.read_text())
        meta = {**data["meta"], **meta}  # the first file's settings
        for row in data["results"]:
            if row["status"] != "skipped":
                merged[row["model"], row["mode"], row.get("budget")] = row
    meta["merged_from"] = [str(p) for p in args.results]
    write_outputs(args.out, meta, list(merged.values()))


if __name__ == "__main__":
    main()
