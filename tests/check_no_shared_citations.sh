#!/usr/bin/env bash
# Fails (exit 1) when a tracked file cites a design note that lives beside the repository, in ../shared,
# instead of the project's own docs/: ../shared holds the task's working notes, which a clone of attnprobe
# does not have, so a comment or page that points there points nowhere. Reading data from ../shared/data
# (tests, plots, tools) is fine and not matched. Skipped (77) outside a git checkout.
set -euo pipefail
cd "$1"
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "not a git checkout: skipped"; exit 77; }
# The shared notes by name, and any ../shared/ path other than ../shared/data.
pattern='(ESTIMATORS(_BEYOND|_INFERENCE)?|DESIGN|PERF_NOTES|STYLE)\.md|\.\./shared(/[^d]|/d[^a]|/da[^t]|/dat[^a]|/?$|[^/])'
self=tests/check_no_shared_citations.sh
if hits=$(git grep -n -I -E "$pattern" -- . ":(exclude)$self"); then
  printf 'citations of design notes outside the repository (point to docs/ instead):\n%s\n' "$hits"
  exit 1
fi
echo "no citations of ../shared design notes"
