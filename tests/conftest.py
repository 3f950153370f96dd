"""The persistent compile cache is off in the test suite unless a run asks for it
(`AOTGRAD_CACHE=1`): a test's compile must not be served by an entry an earlier test or run
wrote. Either way it never touches the user's cache: its directory is a fresh one per run.
tests/test_cache*.py turn it on, each test in a directory of its own."""

import os
import tempfile

os.environ.setdefault("AOTGRAD_CACHE", "0")
os.environ["AOTGRAD_CACHE_DIR"] = tempfile.mkdtemp(prefix="aotgrad-cache-tests-")
