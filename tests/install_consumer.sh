#!/usr/bin/env bash
# Installs the build into a scratch prefix, builds tests/consumer (a C++-only project) against it with
# find_package(attnprobe CONFIG), and runs it and the installed CLI (and imports the installed
# Python package when there is one). The consumer is also configured with C enabled, where the package
# finds HDF5 through FindHDF5 instead.
set -euo pipefail
build=$1 consumer=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
"$work/prefix/bin/attnprobe" list >/dev/null
cmake -S "$consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/consumer"
cmake -S "$consumer" -B "$work/build-c" -DCMAKE_PREFIX_PATH="$work/prefix" -DCONSUMER_WITH_C=ON >/dev/null
# The Python package, where the build made one: importable from the prefix's site-packages alone
# (its module finds the installed libattnprobe through its RPATH).
for site in "$work"/prefix/lib/python3*/site-packages; do
  [ -d "$site/attnprobe" ] || continue
  (cd "$work" && PYTHONPATH="$site" /usr/bin/python3 -c \
    "import attnprobe, os; assert attnprobe.__file__.startswith('$site'); assert attnprobe.estimators()")
done
