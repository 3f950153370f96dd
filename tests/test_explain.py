"""`aotgrad.explain`: the report matches the compile it explains."""

import importlib.util

import pytest
import torch
from torch import nn

import aotgrad
from aotgrad.explanation import Explanation

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, 1))



def test_report_lists_saved_values_recomputation_and_peak(capsys):
    model, x = mlp(), torch.randn(32, 16)
    report = aotgrad.explain(model, x)
    assert capsys.readouterr().out == ""  # explain returns the report; show() prints it
    report.show(graphs=True, curve=True)
    printed = capsys.readouterr().out
    assert isinstance(report, Explanation) and printed.strip() == \
        report.format(graphs=True, curve=True).strip()
    assert report.estimated_peak_bytes == report.memory.peak_bytes > 0
    for s in report.saved:  # name, producing op, shape, dtype, bytes
        assert s.graph_name in report.forward_code and s.nbytes == \
            torch.Size(s.shape).numel() * s.dtype.itemsize
        assert s.name in printed
    assert "def forward" in report.forward_code and "def forward" in report.backward_code
    assert "saved for backward" in printed and "recomputed in backward" in printed
    assert "memory/compute curve" in printed


def test_report_agrees_with_the_compiled_artifact():
    model, x = mlp(), torch.randn(32, 16)
    compiled = aotgrad.compile(model, backend="eager")
    compiled(x)
    art = compiled.artifacts[0]
    report = aotgrad.explain(model, x)
    assert [s.name for s in report.saved] == [s.name for s in art.saved]
    assert report.backward_code == art.backward_graph.code
    recomputed = {r.name for r in report.recomputed}
    fw_ops = {n.name for n in art.forward_graph.graph.nodes if n.op == "call_function"}
    bw_ops = {n.name for n in art.backward_graph.graph.nodes if n.op == "call_function"}
    assert fw_ops & bw_ops <= recomputed  # what runs in both graphs is recomputation
    assert all(r.cost_bytes >= 0 for r in report.recomputed)


@pytest.mark.parametrize("budget", [0.0, 0.5, 1.0])
def test_budget_report_marks_the_chosen_point(budget):
    x = torch.randn(32, 16)
    report = aotgrad.explain(mlp(), x, memory_budget=budget)
    assert report.chosen in report.curve.plans
    assert report.chosen.peak_bytes <= report.curve.target(budget)
    # the compile used the chosen plan: it saved what the plan saves
    assert [s.graph_name for s in report.saved] == list(report.chosen.saved)
    assert report.estimated_peak_bytes == report.chosen.peak_bytes
    assert "*" in str(report)
    points = report.budget_points()
    assert [b for b, _ in points] == [i / 10 for i in range(11)]
    peaks = [p.peak_bytes for _, p in points]
    assert peaks == sorted(peaks)


def test_explain_without_backward_is_refused():
    with pytest.raises(ValueError, match="nothing requires grad"):
        aotgrad.explain(lambda x: x.sin(), torch.randn(3))


def test_explain_without_the_curve():
    report = aotgrad.explain(mlp(), torch.randn(4, 16), curve=False)
    assert report.curve is None and report.budget_points() == []
    assert "memory/compute curve" not in str(report)


@pytest.mark.xfail(not HAS_MATPLOTLIB, raises=ImportError, strict=True,
                   reason="matplotlib not installed: plot() refuses with an ImportError")
def test_plot_writes_a_png(tmp_path):
    report = aotgrad.explain(mlp(), torch.randn(32, 16), memory_budget=0.5)
    path = tmp_path / "curve.png"
    report.plot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
