"""bench/run.py end to end on CPU: small models, subprocess per row, JSON and Markdown out."""

import importlib.util
import json
import subprocess
import time
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RUN = REPO / "bench" / "run.py"
ROWS = [(model, mode) for model in ("mlp", "tiny") for mode in ("eager", "aotgrad_compile_eager")]


def load_bench():
    if "bench_run" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_run", RUN)
        module = sys.modules["bench_run"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # its dataclasses look their module up by name
    return sys.modules["bench_run"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, str(RUN), "--small", "--models", "mlp,tiny",
         "--modes", "eager,aotgrad_compile_eager", "--steps", "2", "--warmup", "1",
         "--device", "cpu", "--threads", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout


def test_json_has_one_ok_row_per_model_and_mode(results):
    out, _ = results
    data = json.loads((out / "results.json").read_text())
    assert {"date", "torch", "device"} <= set(data["meta"])
    rows = {(r["model"], r["mode"]): r for r in data["results"]}
    assert set(rows) == set(ROWS)
    for key, row in rows.items():
        assert row["status"] == "ok", (key, row.get("error"), row.get("traceback"))
        assert row["step_ms"] > 0 and row["host_ms"] > 0 and row["peak_mb"] is None


def test_aotgrad_rows_carry_stage_timings(results):
    out, _ = results
    rows = json.loads((out / "results.json").read_text())["results"]
    for row in rows:
        if row["mode"] == "aotgrad_compile_eager":
            assert {"capture", "trace", "partition"} <= set(row["stages"])
            assert row["aotgrad_graphs"] == 1


def test_rows_carry_the_cpu_time_of_their_threads_and_workers(results):
    out, _ = results
    for row in json.loads((out / "results.json").read_text())["results"]:
        assert row["cpu_ms"] >= 0 and row["children_cpu_ms"] is not None


def test_descendants_cpu_time_counts_a_busy_child():
    bench = load_bench()
    before = bench.descendants_cpu_s()
    # The child spins for a second of its own CPU time (a loaded host stretches the wall
    # time); read while it is alive, its time shows.
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nwhile time.process_time() < 1: pass"])
    busy, deadline = before, time.time() + 60
    while child.poll() is None and busy - before <= 0.3 and time.time() < deadline:
        time.sleep(0.05)
        busy = bench.descendants_cpu_s() or busy
    child.kill()
    child.wait()
    assert busy - before > 0.3


def test_an_experiments_inductor_config_reaches_the_row(monkeypatch):
    from torch._inductor import config
    bench = load_bench()
    monkeypatch.setenv("BENCH_INDUCTOR_CONFIG", "max_fusion_unique_io_buffers=48, max_fusion_size=32")
    with config.patch(max_fusion_unique_io_buffers=None, max_fusion_size=64):
        bench.prepare(bench.Job("mlp", "eager", None, True, "cpu", 1, 1))
        assert (config.max_fusion_unique_io_buffers, config.max_fusion_size) == (48, 32)


def test_markdown_and_stdout_list_every_row(results):
    out, stdout = results
    markdown = (out / "results.md").read_text()
    assert "torch:" in markdown and "device:" in markdown
    summary = stdout[stdout.index("== aotgrad bench"):]  # printed last
    for model, mode in ROWS:
        assert f"| {model} | {mode} |" in markdown
        assert any(line.split()[:2] == [model, mode] for line in summary.splitlines())


def test_budgeted_modes_expand_and_lower_budgets_run_last():
    bench = load_bench()
    args = bench.parse_args(["--models", "mlp", "--modes", "eager,torch_compile,aotgrad_dynamo",
                             "--budgets", "default,0.5", "--device", "cpu"])
    jobs = bench.plan_jobs(args)
    assert [j.label for j in jobs] == ["mlp/eager", "mlp/torch_compile", "mlp/torch_compile@0.5",
                                       "mlp/aotgrad_dynamo", "mlp/aotgrad_dynamo@0.5"]
    order = [jobs[i].label for i in bench.run_order(jobs)]
    assert order[-2:] == ["mlp/torch_compile@0.5", "mlp/aotgrad_dynamo@0.5"]


def test_a_missing_dependency_skips_the_row_with_a_note():
    bench = load_bench()
    job = bench.Job("gpt2", "eager", None, True, "cpu", 1, 1)
    if importlib.util.find_spec("transformers") is not None:
        pytest.skip("transformers is installed here: nothing is missing")
    row = bench.run_job(job, bench.parse_args([]), deadline=None)
    assert row["status"] == "skipped" and "transformers" in row["error"]


def test_rows_past_the_time_limit_are_skipped():
    bench = load_bench()
    job = bench.Job("tiny", "eager", None, True, "cpu", 1, 1)
    row = bench.run_job(job, bench.parse_args(["--device", "cpu"]), deadline=time.time() + 1)
    assert row["status"] == "skipped" and "time" in row["error"]


def test_an_error_in_a_row_is_recorded_not_raised():
    bench = load_bench()
    job = bench.Job("tiny", "eager", None, True, "no_such_device", 1, 1)
    row = bench.run_job(job, bench.parse_args(["--device", "cpu"]), deadline=None)
    assert row["status"] == "error" and "no_such_device" in row["error"]
    assert "Traceback" in row["traceback"]


def test_overhead_bench_writes_ratios(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "overhead.py"), "--calls", "3", "--repeats", "1",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "overhead_cpu.json").read_text())
    assert [(r["case"], r["mode"]) for r in data["rows"]] == \
        [(c, m) for c in ("function", "module") for m in ("fwd+bwd", "no_grad")]
    assert all(r["ratio_to_eager"]["aotgrad"] > 0 for r in data["rows"])
    assert "| function | fwd+bwd |" in (tmp_path / "overhead_cpu.md").read_text()


def test_interleaved_steps_run_end_to_end_on_cpu(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "interleaved.py"), "--small", "--device", "cpu",
         "--models", "tiny", "--modes", "eager,aotgrad_compile_eager", "--rounds", "2",
         "--steps", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads((tmp_path / "interleaved.json").read_text())
    assert row["model"] == "tiny" and row["eager"]["step"] > 0
    assert row["aotgrad_compile_eager"]["host"] > 0
    assert "| tiny | 1.0 |" in (tmp_path / "interleaved.md").read_text()


def test_peak_snapshot_finds_the_blocks_alive_at_the_peak(tmp_path):
    spec = importlib.util.spec_from_file_location("peak_snapshot",
                                                  REPO / "bench" / "peak_snapshot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    code = tmp_path / "torchinductor_me" / "cx.py"  # Inductor's generated code, by its path
    code.parent.mkdir()
    code.write_text("def call(args):\n    buf0 = empty_strided_cuda((4, 4), (4, 1))\n")
    events = [{"action": "alloc", "addr": 1, "size": 10}, {"action": "alloc", "addr": 2, "size": 5,
               "frames": [{"filename": str(code), "line": 2, "name": "call"}]},
              {"action": "free_completed", "addr": 1}, {"action": "alloc", "addr": 3, "size": 8}]
    assert module.alive_at_peak(events) == [
        (10, "?", None), (5, "cx.py:2 buf0 = empty_strided_cuda((4, 4), (4, 1))", str(code))]
    rows = [{"mode": "a", "blocks": [(10, "x"), (5, "y")]}, {"mode": "b", "blocks": [(10, "x")]}]
    (line,) = module.differing_sizes(rows)
    assert "a 1, b 0" in line


def test_run_report_merges_runs_and_draws_the_memory_time_curve(tmp_path):
    """`run_report.py OUT a.json b.json`: b's rows replace a's for the same model, mode and
    budget, a's skipped rows do not count, and the curve is drawn where matplotlib is."""
    def row(mode, budget, status="ok", step=10.0, peak=100.0):
        return {"model": "mlp", "mode": mode, "budget": budget, "status": status,
                "step_ms": step, "peak_mb": peak, "error": "out of time"}
    meta = {"date": "d", "torch": "t", "device": "cpu", "python": "3", "versions": {},
            "settings": {}}
    first = {"meta": meta, "results": [
        row("torch_compile", 1.0), row("aotgrad_dynamo", 1.0, peak=90.0),
        row("aotgrad_dynamo", 0.5, status="skipped")]}
    second = {"meta": {**meta, "date": "e"},
              "results": [row("aotgrad_dynamo", 0.5, step=12.0, peak=70.0)]}
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, data in zip(paths, [first, second]):
        path.write_text(json.dumps(data))
    out = tmp_path / "merged"
    subprocess.run([sys.executable, str(REPO / "bench" / "run_report.py"), str(out),
                    *map(str, paths)], check=True, cwd=REPO, timeout=120)
    merged = json.loads((out / "results.json").read_text())
    assert merged["meta"]["date"] == "d"
    assert [(r["mode"], r["budget"], r["peak_mb"]) for r in merged["results"]] == [
        ("torch_compile", 1.0, 100.0), ("aotgrad_dynamo", 1.0, 90.0),
        ("aotgrad_dynamo", 0.5, 70.0)]
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    assert (out / "tradeoff.png").exists() == has_matplotlib


def test_compile_stages_tells_our_stages_from_torchs_phases(tmp_path):
    """bench/compile_stages.py, each mode in a fresh process: aotgrad's stage times on one
    side, torch's AOTAutograd on the other, Dynamo's counts on both."""
    out = tmp_path / "stages.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "compile_stages.py"), "--model", "tiny",
         "--small", "--device", "cpu", "--modes", "aotgrad_eager,aot_eager",
         "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    ours, torchs = rows["aotgrad_eager"], rows["aot_eager"]
    assert {"capture", "analysis", "trace", "partition"} <= set(ours["aotgrad_stages"])
    assert ours["aotgrad_graphs"] == ours["dynamo_graphs"] == torchs["dynamo_graphs"] == 1
    assert "create_aot_dispatcher_function" in torchs["phases"]
    assert "create_aot_dispatcher_function" not in ours["phases"]
    assert abs(ours["loss"] - torchs["loss"]) < 1e-5  # the same model, seed and batch
    assert "| aotgrad: trace |" in proc.stdout


def test_trace_time_times_both_traces_and_a_baseline_checkout(tmp_path):
    """bench/trace_time.py: aotgrad's stages and torch's AOTAutograd phases per round, on
    one Dynamo graph, and another checkout (here this one) loaded beside aotgrad."""
    out = tmp_path / "trace.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "trace_time.py"), "--model", "tiny", "--small",
         "--device", "cpu", "--rounds", "2", "--baseline", str(REPO), "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rounds = json.loads(out.read_text())["rounds"]
    assert set(rounds) == {"aotgrad", "baseline", "torch"}
    assert all(len(r) == 2 for r in rounds.values())
    assert {"capture", "analysis", "trace"} <= set(rounds["baseline"][0])
    assert rounds["torch"][0]["aot_trace_joint_graph"] > 0
    assert "aotgrad   trace" in proc.stdout


def _step_as_eager(mode: str, sink: list) -> None:
    """The mlp's step through `mode` (Dynamo reset first): loss and gradients eager's."""
    import torch
    bench = load_bench()
    torch.manual_seed(0)
    model, batch, _ = bench.prepare(bench.Job("mlp", mode, None, True, "cpu", 1, 1))
    expected = model(*batch)
    expected.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    loss = bench.MODES[mode].compile(model, None, sink)(*batch)
    loss.backward()
    torch.testing.assert_close(loss, expected)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g)


def test_the_torch_partition_mode_runs_aotgrad_with_torchs_partitioner(monkeypatch):
    """Issue 20's comparison of partitioners on one Inductor: the mode's graphs are aotgrad's,
    cut by functorch's min cut; the step's loss and gradients stay eager's."""
    import functorch.compile
    calls, sink = [], []
    torch_min_cut = functorch.compile.min_cut_rematerialization_partition

    def counted(*args, **kwargs):
        calls.append(1)
        return torch_min_cut(*args, **kwargs)
    monkeypatch.setattr(functorch.compile, "min_cut_rematerialization_partition", counted)
    _step_as_eager("aotgrad_torch_partition", sink)
    assert calls and [s.artifact for s in sink]


@pytest.mark.parametrize("mode, swapped", [("aotgrad_dynamo_spans_saved", "saved_below_peak"),
                                           ("aotgrad_dynamo_no_exchanges", "_exchanges")])
def test_the_partition_experiments_keep_eagers_step_and_put_the_cut_back(mode, swapped):
    """Issue 20's experiments swap one step of the min cut for their own compiles: the step
    stays eager's, and the package's function is back afterwards."""
    from aotgrad.partition import remat
    original = getattr(remat, swapped)
    _step_as_eager(mode, [])
    assert getattr(remat, swapped) is original


def test_warmed_up_rows_have_compiled_and_stepped():
    bench = load_bench()
    row = bench.warmed_up(bench.Job("mlp", "aotgrad_compile_eager", None, True, "cpu", 1, 1))
    assert len(row.compiled.artifacts) == 1  # compiled once, stepped twice
    assert all(p.grad is None for p in row.model.parameters())  # each step zeroes the grads
    assert row.step().item() > 0


def test_step_split_together_times_both_halves_and_profiles_each_mode(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "step_split.py"), "--models", "tiny",
         "--modes", "eager,aotgrad_compile_eager", "--together", "--small", "--device", "cpu",
         "--steps", "4", "--rounds", "2", "--profile-steps", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "step_split.json").read_text())["tiny"]
    assert set(rows) == {"eager", "aotgrad_compile_eager"}
    for row in rows.values():
        assert row["steps"]["host_fw"] > 0 and row["steps"]["host_bw"] > 0
        assert row["host_profile"] and all(c["own_us"] >= 0 for c in row["host_profile"])
    assert "tiny/aotgrad_compile_eager: host_fw" in proc.stdout


def test_overhead_instructions_reads_callgrinds_totals(tmp_path):
    """bench/overhead_instructions.py: each event of a callgrind dump's summary, per call,
    and the table's ratio to eager (valgrind itself is not run here)."""
    spec = importlib.util.spec_from_file_location(
        "overhead_instructions", REPO / "bench" / "overhead_instructions.py")
    counted = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(counted)
    dump = tmp_path / "cg.1"
    dump.write_text("version: 1\nevents: Ir I1mr D1mr D1mw Bcm Bim\nfn=x\n"
                    "summary: 3000 30 12 6 9 3\ntotals: 3000 30 12 6 9 3\n")
    assert counted._summary(dump) == {"Ir": 3000, "I1mr": 30, "D1mr": 12, "D1mw": 6,
                                      "Bcm": 9, "Bim": 3}
    rows = [{"case": "function", "mode": "no_grad", "path": path, "Ir": ir, "I1mr": 1.0,
             "D1mr": 2.0, "D1mw": 0.0, "Bcm": 3.0, "Bim": 0.0}
            for path, ir in (("eager", 60000.0), ("aotgrad", 74000.0))]
    table = counted.markdown({"date": "d", "torch": "t", "calls": 300, "baseline": None}, rows)
    assert "| function | no_grad | 60.0 | 74.0 | 1.233 |" in table
    assert "| function | no_grad | aotgrad | 1 | 2 | 3 |" in table
