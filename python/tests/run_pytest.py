#!/usr/bin/python3
"""CTest's entry to the Python package's tests: runs pytest on python/tests, or exits 77 (reported
as skipped, with the reason) when pytest or pandas is missing (Debian: python3-pytest, python3-pandas).
Usage: run_pytest.py BUILD_PYTHON_DIR [pytest arguments]."""
import os
import sys

try:
    import pandas  # noqa: F401
    import pytest
except ImportError as error:
    print(f"SKIPPED: {error} (install python3-pytest and python3-pandas, see tools/install_deps.sh)")
    sys.exit(77)

sys.path.insert(0, sys.argv[1])
here = os.path.dirname(os.path.abspath(__file__))
# -p no:cacheprovider: no .pytest_cache in the source tree.
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", here, *sys.argv[2:]]))
