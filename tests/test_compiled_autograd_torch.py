"""Torch's compiled autograd with aotgrad as its backend (the cases are in
torch_compiled_autograd_cases.py), run in an interpreter of their own.

Why: the autograd engine binds the backward functions of its C++ nodes to the first
compiled-autograd instance that asks, once per process. After aotgrad's compiled autograd
(aotgrad.autograd) has run in a process, torch's finds none of them bound to it and fails,
and the reverse; the suite runs both.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

CASES = os.path.join(os.path.dirname(__file__), "torch_compiled_autograd_cases.py")


def test_torch_compiled_autograd_cases_in_their_own_process():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
         os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "pytest", CASES, "-o", "addopts=", "-p", "no:xdist", "-p",
                          "no:cacheprovider", "-q", "-W", "ignore"],
                         capture_output=True, text=True, env=env,
                         cwd=os.path.dirname(__file__))
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert re.search(r"\d+ passed", summary) and not re.search(r"\d+ failed", summary), summary
