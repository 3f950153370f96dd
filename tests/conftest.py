"""The persistent compile cache is off in the test suite unless a run asks for it
(`AOTGRAD_CACHE=1`): a test's compile must not be served by an entry an earlier test or run
wrote. Either way it never touches the user's cache: its directory is a fresh one per run.
tests/test_cache*.py turn it on, each test in a directory of its own."""

import atexit
import functools
import os
import shutil
import tempfile

os.environ.setdefault("AOTGRAD_CACHE", "0")
os.environ["AOTGRAD_CACHE_DIR"] = tempfile.mkdtemp(prefix="aotgrad-cache-tests-")
# removed when this process ends (each xdist worker has its own): runs left hundreds behind
atexit.register(functools.partial(shutil.rmtree, os.environ["AOTGRAD_CACHE_DIR"],
                                  ignore_errors=True))
