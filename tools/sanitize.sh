#!/usr/bin/env bash
# The sanitizer job (CI, .ci/run): builds the library, the CLI and the Catch2 tests with AddressSanitizer and
# UndefinedBehaviorSanitizer into ./build-asan (-O1, CUDA off: the sanitizers check host code) and runs the
# Catch2 tests under CTest; any report fails the run. Left out, and why:
#   - baseline_gate, install_consumer, dump_qkv_python, clang_format, no_shared_citations: they test the release
#     build's numbers, packaging, Python, formatting and citations, not memory safety, and run in the normal job;
#   - mpi_sweep runs with leak detection off (OpenMPI's own allocations live to exit), memory errors on.
# Every Catch2 test runs, the statistical ones included (their trials are few enough at -O1).
# Usage: tools/sanitize.sh [ctest arguments, e.g. -R fuzz]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DATTNPROBE_SANITIZE=ON -DATTNPROBE_CUDA=OFF -DATTNPROBE_PYTHON=OFF >/dev/null
cmake --build build-asan --target attnprobe attnprobe_tests -j "$jobs"
cd build-asan
# detect_leaks: leaks are reported too; abort_on_error off so CTest sees a failing exit code, not a core dump.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest -j "$jobs" --output-on-failure -E "^(baseline_gate|install_consumer|dump_qkv_python|clang_format|no_shared_citations|mpi_sweep)$" \
  "$@"
# mpi_sweep starts OpenMPI, whose own allocations (libmpi and the MCA plugins it dlopens) are still
# held at exit and are reported as leaks we cannot fix or name by library; memory errors are still
# checked there, leaks are not.
if [ $# -eq 0 ]; then
  ASAN_OPTIONS="${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0}" ctest --output-on-failure -R "^mpi_sweep$"
fi
