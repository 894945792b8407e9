#!/usr/bin/env bash
# `pip install --no-build-isolation .` into a fresh virtual environment (Debian's packages visible through
# --system-site-packages: numpy, pandas, torch), reusing this build directory for the CMake step, then imports
# the installed package from outside the source and build trees and runs one estimate through it.
# Skipped (77) where pip, venv or setuptools are missing.
set -euo pipefail
source_dir=$1 build=$2
python=/usr/bin/python3
for module in venv pip setuptools wheel; do
  "$python" -c "import $module" 2>/dev/null || { echo "SKIPPED: no Python module $module (Debian: python3-$module)"; exit 77; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m venv --system-site-packages "$work/venv"
# No index: nothing is downloaded; the build dependencies are the system's.
ATTNPROBE_BUILD_DIR=$build "$work/venv/bin/pip" install --no-build-isolation --no-index --no-deps --quiet \
  "$source_dir"
cd "$work"
"$work/venv/bin/python" - "$work/venv" <<'PY'
import sys
import numpy as np
import attnprobe
venv = sys.argv[1]
assert attnprobe.__file__.startswith(venv), f"imported {attnprobe.__file__}, not the installed package"
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((32, 8)).astype(np.float32) for _ in range(3))
exact = attnprobe.exact(q, k, v, 8 ** -0.5)
approx = attnprobe.estimate("performer(M=16)", q, k, v, 8 ** -0.5, seed=0)
assert approx.shape == exact.shape and np.isfinite(approx).all()
# The library the module loaded is the wheel's copy beside it, not the build tree's.
loaded = {line.split()[-1] for line in open("/proc/self/maps") if "libattnprobe" in line}
assert loaded and all(path.startswith(venv) for path in loaded), f"libattnprobe loaded from {loaded}"
print("installed", attnprobe.__version__, "at", attnprobe.__file__)
PY
"$work/venv/bin/pip" uninstall --yes --quiet attnprobe
