"""What bench/models.py writes from its per-model JSONs: results.md and plot.svg.

matplotlib is not among the GPU machine's packages: the plot is SVG written by hand.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

# the order rows and bars take; a mode not named here follows them (`modes`)
MODES = ["eager", "inductor", "inductor_ro", "aotgrad", "aotgrad_ro", "inductor_cpp",
         "aotgrad_cpp", "inductor_combo", "aotgrad_combo", "aotgrad_combo_pw",
         "aotgrad_no_combo", "inductor_combo_pw"]
REFERENCES = ["inductor", "inductor_ro"]  # every ratio is against each of these
COLORS = {"eager": "#8c8c8c", "inductor": "#4c72b0", "inductor_ro": "#9ecae9",
          "aotgrad": "#c44e52", "aotgrad_ro": "#f4a6a6", "inductor_cpp": "#2a4d7a",
          "aotgrad_cpp": "#7a2a2c", "inductor_combo": "#55a868", "aotgrad_combo": "#8172b2",
          "aotgrad_combo_pw": "#ccb974", "aotgrad_no_combo": "#e17c05",
          "inductor_combo_pw": "#64b5cd"}
# (name, where the value lives, key): the measures that get ratios
MEASURES = [("step", "interleaved", "step_ms"), ("peak", "cold", "peak_mb"),
            ("compile", "cold", "compile_s")]

NOTES = [
    "step ms / min ms: median / min CUDA-event time of a training step (forward with the "
    "loss under bf16 autocast, backward, grads set to None), every mode in one process, "
    "taking turns (rounds of a few synced steps, the order flipping every round).",
    "peak MB: torch.cuda.max_memory_allocated over a few steps after warm-up, each mode in "
    "a process of its own. A CUDA graph's pool is allocated when it is recorded and not "
    "again in a replay, so `_ro` peaks count little of it; reserved MB "
    "(max_memory_reserved) includes it.",
    "cold compile s: the first step's wall time less a warm step's, in a fresh process "
    "with empty Inductor and aotgrad caches; the modes' cold processes run side by side, `jobs` of them at once (settings above).",
    "x inductor, x inductor_ro: this mode's value / that mode's, same model; geomeans over "
    "the models where both were measured. `_ro`: mode=\"reduce-overhead\" (CUDA graphs).",
]


def load(out: Path) -> list[dict]:
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    return [r for r in results if "model" in r and "cold" in r]


def value(result: dict, mode: str, phase: str, key: str) -> float | None:
    row = result.get(phase, {})
    row = row.get("modes", {}) if phase == "interleaved" else row
    cell = row.get(mode, {})
    return cell.get(key) if cell.get("status") == "ok" else None


def ratio(result: dict, mode: str, measure: str, reference: str) -> float | None:
    _, phase, key = next(m for m in MEASURES if m[0] == measure)
    mine, theirs = value(result, mode, phase, key), value(result, reference, phase, key)
    return mine / theirs if mine is not None and theirs else None


def modes(results: list[dict]) -> list[str]:
    """Every mode some result measured or tried, MODES' order first."""
    seen = {m: None for r in results
            for m in [*r.get("cold", {}), *r.get("interleaved", {}).get("modes", {})]}
    return [m for m in MODES if m in seen] + [m for m in seen if m not in MODES]


def geomean(values) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _num(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


# ---------------------------------------------------------------------------- Markdown

def model_rows(result: dict) -> list[str]:
    rows = []
    for mode in modes([result]):
        cells = [result["model"], mode]
        for measure, phase, key in MEASURES:
            cells += [_num(value(result, mode, phase, key), ".2f" if measure != "peak"
                           else ".0f")]
            if measure == "step":
                cells += [_num(value(result, mode, "interleaved", "min_ms"), ".2f")]
            cells += [_num(ratio(result, mode, measure, ref), ".3f") for ref in REFERENCES]
            if measure == "peak":
                cells += [_num(value(result, mode, "cold", "reserved_mb"), ".0f")]
        cells += [_num(value(result, mode, "cold", "loss"), ".5g")]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def results_table(results: list[dict]) -> list[str]:
    x = " | ".join(f"x {ref}" for ref in REFERENCES)
    header = (f"| model | mode | step ms | min ms | {x} | peak MB | {x} | reserved MB | "
              f"cold compile s | {x} | first loss |")
    lines = [header, "|---|---|" + "---:|" * (header.count("|") - 3)]
    for result in results:
        lines += model_rows(result)
    return lines


def geomean_table(results: list[dict]) -> list[str]:
    names = [f"{m} x {ref}" for m, _, _ in MEASURES for ref in REFERENCES]
    lines = ["| mode | " + " | ".join(names) + " | models |",
             "|---|" + "---:|" * (len(names) + 1)]
    for mode in modes(results):
        cells = [[ratio(r, mode, m, ref) for r in results] for m, _, _ in MEASURES
                 for ref in REFERENCES]
        count = max(sum(v is not None for v in c) for c in cells)
        if count:
            lines.append(f"| {mode} | " + " | ".join(_num(geomean(c), ".3f") for c in cells)
                         + f" | {count} |")
    return lines


def problems(results: list[dict]) -> list[str]:
    """One line for each model not run and each mode that did not measure."""
    lines = []
    for r in results:
        if "skipped" in r:
            lines.append(f"- {r['model']}: not run ({r['skipped']})")
        for phase, row in (("cold", r["cold"]), ("interleaved", r["interleaved"])):
            lines += _failures(r["model"], phase, row)
    return lines


def _failures(model: str, phase: str, row: dict) -> list[str]:
    if phase == "interleaved" and row and row.get("status") != "ok":
        return [f"- {model} ({phase}): {row.get('status')}: {_first_line(row)}"]
    cells = row.get("modes", {}) if phase == "interleaved" else row
    return [f"- {model}/{mode} ({phase}): {cell.get('status')}: {_first_line(cell)}"
            for mode, cell in cells.items() if cell.get("status") != "ok"]


def allocator_calls(results: list[dict]) -> list[str]:
    """One line for each timed row whose steady steps called the driver's allocator
    (bench/run.py's `allocator_calls`): host time a step should not spend."""
    lines = []
    for r in results:
        cold = r.get("cold", {})
        rows = [("cold", mode, row) for mode, row in cold.items()]
        rows += [(f"process {k}", mode, row)
                 for k, process in enumerate(_interleaved_processes(r.get("interleaved", {})))
                 for mode, row in process.items()]
        for where, mode, row in rows:
            calls = {k: v for k, v in (row.get("allocator_calls_per_step") or {}).items() if v}
            if calls:
                lines.append(f"- {r['model']}/{mode} ({where}): "
                             + ", ".join(f"{k} {v:.2f}" for k, v in calls.items()))
    return lines


def device_events(results: list[dict]) -> list[str]:
    """A line per model: the GPU events (kernels, copies) a step of each mode put on the
    device in each interleaved process, which tells which compiled code a mode ran."""
    lines = []
    for r in results:
        processes = _interleaved_processes(r.get("interleaved", {}))
        counts = [{m: row.get("device_events_per_step") for m, row in p.items()}
                  for p in processes]
        if any(v is not None for c in counts for v in c.values()):
            lines.append(f"- {r['model']}: " + "; ".join(
                ", ".join(f"{m} {_num(v, 'd')}" for m, v in c.items()) for c in counts))
    return lines


def copies_and_waits(results: list[dict]) -> list[str]:
    """A line per model and mode whose profiled step copied or waited (models.profiled_step),
    each process's counts by name."""
    lines = []
    for r in results:
        for p in _interleaved_processes(r.get("interleaved", {})):
            for mode, row in p.items():
                if row.get("copies_and_waits"):
                    lines.append(f"- {r['model']}/{mode}: " + ", ".join(
                        f"{name} {n}" for name, n in sorted(row["copies_and_waits"].items())))
    return lines


def host_speeds(results: list[dict]) -> list[str]:
    """A line per model: `models.host_launch_us` of each of its interleaved processes, the
    covariate of its host-bound rows."""
    lines = []
    for r in results:
        speeds = r.get("interleaved", {}).get("host_launch_us")
        if speeds:
            lines.append(f"- {r['model']}: " + "; ".join(
                " / ".join(f"{us:.2f}" for us in pair) for pair in speeds))
    return lines


def _interleaved_processes(row: dict) -> list[dict]:
    return row.get("processes") or ([row["modes"]] if row.get("modes") else [])


def _commits(results: list[dict]) -> str:
    """The commit each model ran at: a report may merge the directories of several runs."""
    models = {}
    for r in results:
        models.setdefault((r.get("meta") or {}).get("commit"), []).append(r.get("model", "?"))
    if len(models) == 1:
        return f"Commit {next(iter(models))}"
    return "Commits " + ", ".join(f"{c} ({', '.join(m)})" for c, m in models.items())


def _first_line(row: dict) -> str:
    return (row.get("error") or "").strip().split("\n")[0][:200]


def markdown(results: list[dict]) -> str:
    meta = next((r["meta"] for r in results if r.get("meta")), {})
    title = (f"# Model list: eager, Inductor, aotgrad, with and without CUDA graphs "
             f"({meta.get('date', '?')[:10]}, torch {meta.get('torch', '?')}, "
             f"{meta.get('device', '?')})")
    parts = [title, f"{_commits(results)}; settings {meta.get('settings')}; "
             f"versions {meta.get('versions')}.", "## Geomeans", *geomean_table(results),
             "## Per model", *results_table(results), "![step time and peak memory](plot.svg)"]
    trouble = problems(results)
    if trouble:
        parts += ["## Not measured", *trouble]
    calls = allocator_calls(results)
    if calls:
        parts += ["## Allocator calls a steady step made (per step)", *calls]
    events = device_events(results)
    if events:
        parts += ["## GPU events a step (kernels and copies, one profiled step a mode)",
                  *events]
    waits = copies_and_waits(results)
    if waits:
        parts += ["## Copies and the host's waits on the GPU in the profiled step", *waits]
    speeds = host_speeds(results)
    if speeds:
        parts += ["## The host's speed in each interleaved process (us a launch of a "
                  "one-element add, before and after the turns)", *speeds]
    parts += ["## Notes", *[f"- {n}" for n in NOTES]]
    return "\n\n".join(p for p in _blocks(parts)) + "\n"


def _blocks(parts: list[str]) -> list[str]:
    """Table and list lines joined by single newlines, everything else by blank lines."""
    blocks: list[str] = []
    for part in parts:
        if part[:1] in "|-" and blocks and blocks[-1][:1] == part[:1]:
            blocks[-1] += "\n" + part
        else:
            blocks.append(part)
    return blocks


# ---------------------------------------------------------------------------- SVG

def svg_plot(panels: list[tuple[str, dict[str, dict[str, float]]]], models: list[str],
             modes: list[str], caption: str = "") -> str:
    """Grouped bars: one panel per (title, {model: {mode: ratio}}), a group per model, a bar
    per mode, a dashed line at 1.0; `caption` under them."""
    bar, gap, left, panel_h = 16, 20, 56, 230
    width = max(left + len(models) * (bar * len(modes) + gap), left + 110 * len(modes)) + 20
    parts = [_legend(modes, left)]
    for i, (title, values) in enumerate(panels):
        parts += _panel(title, values, models, modes, 40 + i * (panel_h + 40), panel_h,
                        (left, bar, gap))
    height = 40 + len(panels) * (panel_h + 40)
    parts.append(f'<text x="{left}" y="{height - 12}" fill="#555">{html.escape(caption)}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif" font-size="11">\n'
            f'<rect width="{width}" height="{height}" fill="white"/>\n'
            + "\n".join(parts) + "\n</svg>\n")


def _legend(modes: list[str], left: int) -> str:
    items = [f'<rect x="{left + i * 110}" y="8" width="12" height="12" '
             f'fill="{COLORS.get(m, "#333")}"/><text x="{left + i * 110 + 16}" y="18">'
             f'{html.escape(m)}</text>' for i, m in enumerate(modes)]
    return "\n".join(items)


def _panel(title, values, models, modes, top, height, geometry) -> list[str]:
    left, bar, gap = geometry
    found = [v for per_model in values.values() for v in per_model.values() if v]
    top_value = max([1.5] + found) * 1.05
    y = lambda v: top + 20 + (height - 40) * (1 - v / top_value)  # noqa: E731
    parts = [f'<text x="{left}" y="{top + 12}" font-weight="bold">{html.escape(title)}'
             f'{"" if found else ": not measured"}</text>']
    parts += _y_axis(left, y, top_value, len(models) * (bar * len(modes) + gap))
    for i, model in enumerate(models):
        x0 = left + gap / 2 + i * (bar * len(modes) + gap)
        for j, mode in enumerate(modes):
            v = values.get(model, {}).get(mode)
            if v:
                parts.append(f'<rect x="{x0 + j * bar:.1f}" y="{y(v):.1f}" width="{bar - 2}" '
                             f'height="{y(0) - y(v):.1f}" fill="{COLORS.get(mode, "#333")}">'
                             f'<title>{html.escape(f"{model} {mode}: {v:.3f}")}</title></rect>')
        parts.append(f'<text x="{x0 + bar * len(modes) / 2:.1f}" y="{y(0) + 14:.1f}" '
                     f'text-anchor="middle">{html.escape(model)}</text>')
    return parts


def _y_axis(left, y, top_value, span) -> list[str]:
    step = 0.25 if top_value <= 2 else 0.5 if top_value <= 4 else 1.0
    ticks = [k * step for k in range(int(top_value / step) + 1)]
    parts = [f'<line x1="{left}" x2="{left + span}" y1="{y(t):.1f}" y2="{y(t):.1f}" '
             f'stroke="#e4e4e4"/><text x="{left - 6}" y="{y(t) + 4:.1f}" '
             f'text-anchor="end">{t:g}</text>' for t in ticks]
    parts.append(f'<line x1="{left}" x2="{left + span}" y1="{y(1):.1f}" y2="{y(1):.1f}" '
                 f'stroke="black" stroke-dasharray="4,3"/>')
    return parts


def plot(results: list[dict]) -> str:
    measured = [r for r in results if "skipped" not in r]
    models = [r["model"] for r in measured]
    shown = modes(measured)
    panels = [(f"{label} / inductor's (lower is better)",
               {r["model"]: {m: ratio(r, m, measure, "inductor") for m in shown}
                for r in measured})
              for label, measure in (("step time", "step"), ("peak memory", "peak"))]
    meta = next((r["meta"] for r in results if r.get("meta")), {})
    caption = (f"{meta.get('device', '?')}, torch {meta.get('torch', '?')}, "
               f"{meta.get('date', '?')[:10]}, commit {meta.get('commit')}")
    return svg_plot(panels, models, shown, caption)


def write_report(out: Path) -> str:
    """results.md and plot.svg in `out`, from the model JSONs there; returns the Markdown."""
    results = load(Path(out))
    text = markdown(results)
    (Path(out) / "results.md").write_text(text)
    (Path(out) / "plot.svg").write_text(plot(results))
    return text
