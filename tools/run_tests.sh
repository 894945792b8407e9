#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test (CTest + Catch2). The README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
tools/build.sh
cd build
ctest -j "$(nproc)" --output-on-failure
