#!/usr/bin/env bash
# Fails (exit 1) when a C++ file of lib/, apps/ or tests/ differs from what clang-format makes of it,
# naming the files and the command that fixes them. Skipped (77) without clang-format.
set -euo pipefail
cd "$1"
command -v clang-format >/dev/null || { echo "clang-format not installed: skipped"; exit 77; }
mapfile -t files < <(git ls-files 'lib/*.cpp' 'lib/*.h' 'lib/*.cu' 'lib/*.cuh' 'apps/*.cpp' 'apps/*.h' \
                       'tests/*.cpp' 'tests/*.h' 'python/*.cpp' 2>/dev/null || find lib apps tests -name '*.cpp' -o -name '*.h')
bad=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  clang-format --dry-run -Werror --style=file "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  printf 'not formatted per .clang-format:\n'; printf '  %s\n' "${bad[@]}"
  printf 'fix with: clang-format -i --style=file %s\n' "${bad[*]}"
  exit 1
fi
echo "clang-format: ${#files[@]} files formatted"
