#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test (CTest + Catch2). The README's test command.
# Extra arguments go to cmake's configure (tools/build.sh), e.g. -DATTNPROBE_CUDA=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
tools/build.sh "$@"
cd build
ctest -j "$(nproc)" --output-on-failure
