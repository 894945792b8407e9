#!/usr/bin/env bash
# Installs what attnprobe needs from Debian's packages, and only what is missing.
#   tools/install_deps.sh             everything: the build, every test, the figures (tools/run_tests.sh)
#   tools/install_deps.sh --for demo  only what the README's first command (tools/run_demo.sh) uses: the build of
#                                     the CLI and the demo's plot (no PyTorch, Chromium, MPI or pybind11, which a
#                                     fresh machine would otherwise spend minutes downloading)
# Needs root (or sudo). The CUDA Toolkit is optional and not installed here: when nvcc is on the
# machine (/usr/local/cuda), the build compiles the CUDA backend too (ATTNPROBE_CUDA=AUTO).
set -euo pipefail

group=all
case "${1:-}" in
  "") ;;
  --for)
    group=${2:-}
    [ "$group" = demo ] || [ "$group" = all ] || { echo "install_deps: --for demo or --for all, not '$group'" >&2; exit 2; }
    ;;
  *) echo "usage: tools/install_deps.sh [--for demo|all]" >&2; exit 2 ;;
esac

# The demo's: configure and build the CLI (catch2: the build configures its tests), and plot its sweep.
demo_packages=(
  cmake g++ make pkg-config
  libeigen3-dev libhdf5-dev libcli11-dev libfmt-dev catch2   # build and test
  nlohmann-json3-dev zlib1g-dev                               # run.json/check --json; .npz dumps (deflated zip entries)
  python3 python3-matplotlib python3-numpy                   # plots/
)
packages=("${demo_packages[@]}")
[ "$group" = demo ] || packages+=(
  clang-format git                                           # the format test
  libopenblas0-pthread                                       # bench's sgemm floor (loaded at run time)
  time                                                       # bench/scaling.py (peak RSS per process)
  libopenmpi-dev openmpi-bin                                 # the MPI sweep runner (ATTNPROBE_MPI)
  python3-torch python3-h5py                                 # tools/dump_qkv.py, tools/train_charlm.py and their test
  python3-dev pybind11-dev python3-pandas python3-pytest      # the Python package (python/) and its tests
  python3-venv python3-pip python3-setuptools python3-wheel   # pip install --no-build-isolation . (pyproject.toml)
  locales                                                    # a de_DE locale the locale-independence test builds
  chromium python3-pil                                       # the report's test in a headless browser
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all packages present ($group)"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
