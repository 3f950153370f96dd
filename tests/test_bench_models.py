"""bench/models.py's report on a made-up result set: the ratios, geomeans, failures and the
hand-written SVG. (The benchmark itself runs on CPU with `python bench/models.py --small`.)"""

import json
import math
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import models_report  # noqa: E402

# step ms, peak MB, cold compile s per mode
MEASURED = {
    "gpt2": {"eager": (30.0, 6000, 0.1), "inductor": (25.0, 5000, 40.0),
             "inductor_ro": (20.0, 5000, 50.0), "aotgrad": (22.5, 4500, 36.0),
             "aotgrad_ro": (20.0, 4000, 50.0)},
    "resnet50": {"eager": (24.0, 3000, 0.1), "inductor": (24.0, 2800, 50.0),
                 "inductor_ro": (12.0, 1400, 45.0), "aotgrad": (19.2, 2800, 40.0),
                 "aotgrad_ro": (12.0, 1400, 45.0)},
}


def model_json(model: str, failed_mode: str | None = None) -> dict:
    cold, timed = {}, {}
    for mode, (step, peak, compile_s) in MEASURED[model].items():
        cold[mode] = {"status": "ok", "peak_mb": peak, "reserved_mb": peak + 100,
                      "compile_s": compile_s, "loss": 10.5}
        timed[mode] = {"status": "ok", "step_ms": step, "min_ms": step * 0.9}
    if failed_mode:
        cold[failed_mode] = {"status": "timeout", "error": "no result after 170s (compiling)"}
        timed[failed_mode] = {"status": "error", "error": "RuntimeError: boom\nmore"}
    return {"model": model, "meta": {"date": "2026-11-25T10:00:00+00:00", "torch": "2.11.0",
                                     "device": "NVIDIA H100 80GB HBM3", "commit": "abc1234"},
            "cold": cold, "interleaved": {"status": "ok", "modes": timed}}


@pytest.fixture
def report(tmp_path):
    (tmp_path / "gpt2.json").write_text(json.dumps(model_json("gpt2")))
    (tmp_path / "resnet50.json").write_text(json.dumps(model_json("resnet50", "aotgrad_ro")))
    (tmp_path / "bert.json").write_text(json.dumps(
        {"model": "bert", "meta": {}, "cold": {}, "interleaved": {},
         "skipped": "--budget 300s spent"}))
    return tmp_path, models_report.write_report(tmp_path)


def test_ratios_against_both_references():
    result = model_json("gpt2")
    assert models_report.ratio(result, "aotgrad", "step", "inductor") == pytest.approx(0.9)
    assert models_report.ratio(result, "aotgrad_ro", "step", "inductor_ro") == 1.0
    assert models_report.ratio(result, "aotgrad", "peak", "inductor") == pytest.approx(0.9)
    assert models_report.ratio(result, "aotgrad", "compile", "inductor") == pytest.approx(0.9)


def test_a_failed_mode_has_no_ratio():
    result = model_json("resnet50", "aotgrad_ro")
    assert models_report.ratio(result, "aotgrad_ro", "step", "inductor") is None
    assert models_report.ratio(result, "inductor", "step", "aotgrad_ro") is None


def test_geomean_skips_missing_values():
    assert models_report.geomean([0.9, None, 0.8]) == pytest.approx(math.sqrt(0.72))
    assert models_report.geomean([None]) is None


def test_markdown_has_header_geomeans_rows_and_failures(report):
    out, text = report
    assert text == (out / "results.md").read_text()
    assert "2026-11-25" in text and "torch 2.11.0" in text and "NVIDIA H100" in text
    # aotgrad step: 0.9 (gpt2) and 0.8 (resnet50) x inductor
    geomean_row = next(line for line in text.splitlines() if line.startswith("| aotgrad |"))
    assert f"{math.sqrt(0.72):.3f}" in geomean_row.split("|")[2]
    assert "| gpt2 | aotgrad | 22.50 | 20.25 | 0.900 | 1.125 | 4500 |" in text
    assert "- resnet50/aotgrad_ro (cold): timeout: no result after 170s" in text
    assert "- resnet50/aotgrad_ro (interleaved): error: RuntimeError: boom" in text
    assert "- bert: not run (--budget 300s spent)" in text


def test_svg_is_well_formed_with_a_bar_per_measured_ratio(report):
    out, _ = report
    svg = ET.parse(out / "plot.svg").getroot()
    ns = "{http://www.w3.org/2000/svg}"
    bars = [r for r in svg.iter(f"{ns}rect") if r.find(f"{ns}title") is not None]
    # two panels x (2 models x 5 modes), less resnet50/aotgrad_ro in each
    assert len(bars) == 2 * (2 * 5 - 1)
    titles = {r.find(f"{ns}title").text for r in bars}
    assert "gpt2 aotgrad: 0.900" in titles and "resnet50 inductor_ro: 0.500" in titles
    labels = {t.text for t in svg.iter(f"{ns}text")}
    assert {"gpt2", "resnet50", "aotgrad_ro"} <= labels and "bert" not in labels


def test_several_interleaved_processes_merge_into_each_modes_medians():
    import models  # bench/models.py (imports torch and aotgrad)

    def run(inductor, aotgrad):
        return {"status": "ok", "elapsed_s": 10.0, "modes": {
            "inductor": {"status": "ok", "step_ms": inductor, "host_ms": 1.0,
                         "min_ms": inductor - 1, "samples_ms": [[inductor, 1.0]]},
            "aotgrad": {"status": "ok", "step_ms": aotgrad, "host_ms": 2.0,
                        "min_ms": aotgrad - 1, "samples_ms": [[aotgrad, 2.0]]}}}
    runs = [run(40.0, 50.0), run(38.0, 33.0), run(39.0, 36.0), {"status": "timeout"}]
    merged = models.merge_processes(runs)
    assert merged["modes"]["inductor"]["step_ms"] == 39.0
    assert merged["modes"]["aotgrad"]["step_ms"] == 36.0
    assert merged["modes"]["aotgrad"]["min_ms"] == 32.0
    assert [p["aotgrad"]["step_ms"] for p in merged["processes"]] == [50.0, 33.0, 36.0]
    assert "samples_ms" not in merged["modes"]["aotgrad"] and merged["elapsed_s"] == 30.0
    assert models.merge_processes(runs[:1]) == runs[0]  # one process: its own row


def test_steady_steps_that_call_the_allocator_are_listed():
    """A mode whose timed steps called cudaMalloc or cudaFree is named, per process; a mode
    that called nothing, and a CPU row (no counters), are not."""
    result = model_json("gpt2")
    result["cold"]["aotgrad"]["allocator_calls_per_step"] = {
        "num_device_alloc": 0.0, "num_device_free": 0.0, "num_alloc_retries": 0.0}
    result["interleaved"] = {"status": "ok", "modes": {}, "processes": [
        {"inductor": {"allocator_calls_per_step": {"num_device_alloc": 0.0}},
         "aotgrad": {"allocator_calls_per_step": {"num_device_alloc": 2.5,
                                                  "num_device_free": 2.0}}},
        {"aotgrad": {"allocator_calls_per_step": {"num_device_alloc": 0.0}}}]}
    assert models_report.allocator_calls([result]) == [
        "- gpt2/aotgrad (process 0): num_device_alloc 2.50, num_device_free 2.00"]
    assert "## Allocator calls" in models_report.markdown([result])
    assert "## Allocator calls" not in models_report.markdown([model_json("gpt2")])


def test_each_interleaved_process_records_the_hosts_speed():
    """A host-bound row moves with the host's speed, which differs by process and by call:
    each interleaved process times a one-element add's launch before and after its turns,
    the merge keeps every process's pair, and the report lists them per model."""
    import models  # bench/models.py (imports torch and aotgrad)
    us = models.host_launch_us("cpu", calls=50, rounds=2)
    assert 0 < us < 10_000
    runs = [{"status": "ok", "elapsed_s": 1.0, "host_launch_us": pair,
             "modes": {"aotgrad": {"status": "ok", "step_ms": 2.0, "host_ms": 1.0,
                                   "min_ms": 1.5}}}
            for pair in ([[6.0, 6.5]], [[9.25, 9.0]])]
    merged = models.merge_processes(runs)
    assert merged["host_launch_us"] == [[6.0, 6.5], [9.25, 9.0]]
    one, several = model_json("gpt2"), model_json("resnet50")
    one["interleaved"]["host_launch_us"] = [[5.0, 5.5]]  # one process
    several["interleaved"]["host_launch_us"] = merged["host_launch_us"]
    assert models_report.host_speeds([one, several, model_json("gpt2")]) == [
        "- gpt2: 5.00 / 5.50", "- resnet50: 6.00 / 6.50; 9.25 / 9.00"]
    assert "## The host's speed" in models_report.markdown([one])


def test_a_mode_the_report_does_not_know_gets_rows_and_geomeans(tmp_path):
    """Modes added to the benchmark after the report's list (session 37's `aotgrad_no_combo`
    and `inductor_combo_pw` were measured and missing from results.md)."""
    result = model_json("gpt2")
    result["cold"]["aotgrad_new"] = {**result["cold"]["aotgrad"]}
    result["interleaved"]["modes"]["aotgrad_new"] = {**result["interleaved"]["modes"]["aotgrad"]}
    (tmp_path / "gpt2.json").write_text(json.dumps(result))
    text = models_report.write_report(tmp_path)
    assert "| gpt2 | aotgrad_new | 22.50 |" in text
    assert "| aotgrad_new | 0.900 |" in text
    assert "aotgrad_new" in (tmp_path / "plot.svg").read_text()


def test_merged_caches_keep_each_cold_processs_inductor_keys(tmp_path):
    """One `.fxkey` file a graph, a record per context: each cold process of a model writes
    the same file with its own context's record; the interleaved process's cache has both."""
    import models
    from aotgrad.cache import store
    for n, context in enumerate(("combos", "no combos")):
        cold = tmp_path / f"bench-inductor-{n}" / "aotgrad"
        cold.mkdir(parents=True)
        (cold / "g.fxkey").write_bytes(store.seal({context: {"key": context, "guards": None}}))
        (cold / f"entry{n}.json").write_text("{}")
    warm = Path(models.merge_caches(str(tmp_path)))
    assert set(store.unseal((warm / "aotgrad" / "g.fxkey").read_bytes())) == {
        "combos", "no combos"}
    assert {p.name for p in (warm / "aotgrad").iterdir()} == {"g.fxkey", "entry0.json",
                                                              "entry1.json"}


def test_merged_caches_leave_out_autotuning_done_side_by_side(tmp_path):
    """Cold processes tune their Triton kernels while the others use the GPU: the
    interleaved process tunes again, alone, and keeps the kernels themselves."""
    import models
    kernels = tmp_path / "bench-inductor-0" / "ab"
    kernels.mkdir(parents=True)
    for name in ("cabc.py", "cabc.best_config", "cabc.cubin"):
        (kernels / name).write_text("x")
    warm = Path(models.merge_caches(str(tmp_path)))
    assert {p.name for p in (warm / "ab").iterdir()} == {"cabc.py", "cabc.cubin"}


def test_each_modes_gpu_events_a_step_are_listed():
    """Which code a mode ran: the kernels and copies of one profiled step, per process."""
    result = model_json("gpt2")
    for mode, count in (("inductor", 813), ("aotgrad", 571)):
        result["interleaved"]["modes"][mode]["device_events_per_step"] = count
    assert models_report.device_events([result, model_json("resnet50")]) == [
        "- gpt2: eager -, inductor 813, inductor_ro -, aotgrad 571, aotgrad_ro -"]
    assert "## GPU events a step" in models_report.markdown([result])


def test_a_profiled_steps_copies_and_waits_are_listed_by_name():
    """A host that waits on the GPU mid-step loses its lead: the profiled step counts its
    copies and waits by name, and the report lists the modes that had any."""
    import models
    row = models.profiled_step(lambda: torch.ones(3).add_(1))  # the CPU: nothing of either
    assert row == {"device_events_per_step": 0, "copies_and_waits": {}}
    result = model_json("gpt2")
    result["interleaved"]["modes"]["aotgrad"]["copies_and_waits"] = {
        "Memcpy HtoD (Pageable -> Device)": 3, "cudaStreamSynchronize": 3}
    assert models_report.copies_and_waits([result]) == [
        "- gpt2/aotgrad: Memcpy HtoD (Pageable -> Device) 3, cudaStreamSynchronize 3"]
    assert "## Copies and the host's waits" in models_report.markdown([result])


def test_a_result_names_the_code_it_ran_whatever_git_says(tmp_path, monkeypatch):
    """`code_version`: the commit, `+changes` over a changed tracked file, and a digest of
    aotgrad's sources that moves with any of them (a device's copy may carry a stale .git)."""
    import subprocess
    import types
    import run
    package = tmp_path / "aotgrad"
    package.mkdir()
    (package / "__init__.py").write_text("x = 1\n")
    monkeypatch.setattr(run, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(run, "aotgrad",
                        types.SimpleNamespace(__file__=str(package / "__init__.py")))
    assert run.code_version().startswith("no commit (aotgrad ")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "c"], cwd=tmp_path, check=True)
    clean = run.code_version()
    (package / "__init__.py").write_text("x = 2\n")
    changed = run.code_version()
    assert "+changes" not in clean and clean.split(" (")[0] + "+changes" == changed.split(" (")[0]
    assert clean.split(" (")[1] != changed.split(" (")[1]
