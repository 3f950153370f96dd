"""Every corpus case compiled cold, then again from the persistent cache (a hit, or a bypass
that says why), each compared against eager by the harness: a warm compile behaves exactly
as a cold one."""

from __future__ import annotations

import pytest

import aotgrad
from aotgrad import cache
from corpus import CASES
from harness import check_case
from test_corpus import REFUSED, compat_nop, dynamo


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("AOTGRAD_CACHE", "1")
    monkeypatch.setenv("AOTGRAD_CACHE_DIR", str(tmp_path / "cache"))
    cache.reset_stats()


# Inference graphs that copy their inputs' new values in themselves, on the cases that
# mutate: their in-place ops run again on a hit's fake values.
MUTATING = [c for c in CASES if any(w in c.name for w in ("mutat", "inplace", "buffer", "copy_"))]
# Dynamo's graphs are keyed before the trace (cache/program.py): a warm hit skips the
# analysis and the trace, and runs on what the entry holds of them.
DOORS = {"compile-eager": lambda target: aotgrad.compile(target, backend="eager"),
         "compat-nop-keep": lambda target: compat_nop(target, keep_inference_input_mutations=True),
         "dynamo-aotgrad-eager": dynamo(lambda: aotgrad.backend(backend="eager"))}


@pytest.mark.parametrize("case,door", [pytest.param(c, "compile-eager", id=c.name) for c in CASES]
                         + [pytest.param(c, "compat-nop-keep", id=f"keep-{c.name}")
                            for c in MUTATING]
                         + [pytest.param(c, "dynamo-aotgrad-eager", id=f"dynamo-{c.name}")
                            for c in CASES])
def test_warm_compile_matches_eager(case, door):
    compile_fn = DOORS[door]
    doors, error = REFUSED.get(case.name, ((), ""))

    def check():
        if door not in doors:
            return check_case(case, compile_fn)
        with pytest.raises(Exception, match=error):  # refused in capture, warm or cold
            check_case(case, compile_fn)
    check()
    cold = cache.events()
    assert all(event in ("miss", "bypass") for event, _ in cold), cold
    cache.reset_stats()
    check()
    warm = cache.events()
    # Every compile the cold run stored is a hit now; what it bypassed is bypassed again.
    assert [e for e, _ in warm] == [{"miss": "hit"}.get(e, e) for e, _ in cold], warm
