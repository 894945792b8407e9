#!/usr/bin/env python3
"""Fails (exit 1) when a file of lib/attnprobe includes a header of a later pipeline stage.

Usage: check_layering.py SOURCE_DIR

Each folder of lib/attnprobe has a level in the pipeline below; a file may include headers of its own
level and of lower ones. An include upwards (the metrics including the sweep planner, say) is a layering
leak: it names the file, the include and the rule. A folder missing from LEVELS is a failure too, so a
new folder gets a place in the pipeline when it is made.
"""
import pathlib
import re
import sys

# Lowest first. One line per level; folders of one level may include each other.
LEVELS = [
    ["common"],                                 # matrices, thread pool, errors, text
    ["rng"],                                    # keyed Philox and the draws made from it
    ["io", "view", "synth"],                    # dumps, slices of them, synthetic dumps
    ["exact"],                                  # the kernels of exact attention
    ["estimators", "gpu"],                      # the estimators (estimators/common too) and their CUDA versions
    ["metrics"],                                # errors between an estimate and its reference
    ["records"],                                # CSV rows and their schema
    ["sweep", "report", "bench", "diagnose"],   # planner and runner, reporters, timing, head diagnostics
    ["mpi"],                                    # the MPI runner (scale-out)
]
LEVEL = {folder: level for level, folders in enumerate(LEVELS) for folder in folders}
RULE = "the pipeline order of lib/attnprobe (a folder may include its own level and lower ones):\n  " + \
       "  <-  ".join(", ".join(folders) for folders in LEVELS)
INCLUDE = re.compile(r'^\s*#\s*include\s*["<]attnprobe/([^/">]+)/[^">]*[">]', re.MULTILINE)
SUFFIXES = {".h", ".cpp", ".cu", ".cuh"}


def main() -> int:
    root = pathlib.Path(sys.argv[1]) / "lib" / "attnprobe"
    problems = []
    files = sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file())
    for path in files:
        relative = path.relative_to(root)
        if len(relative.parts) < 2:
            continue  # version.h and the like, beside the folders: they include nothing of the pipeline
        folder = relative.parts[0]
        if folder not in LEVEL:
            problems.append(f"lib/attnprobe/{relative}: folder {folder}/ has no place in the pipeline order; "
                            f"add it to LEVELS in {pathlib.Path(__file__).name}")
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in INCLUDE.finditer(text):
            target = match.group(1)
            line = text.count("\n", 0, match.start()) + 1
            include = match.group(0).strip()
            if target not in LEVEL:
                problems.append(f"lib/attnprobe/{relative}:{line}: {include}: folder {target}/ has no place in the "
                                f"pipeline order")
            elif LEVEL[target] > LEVEL[folder]:
                problems.append(f"lib/attnprobe/{relative}:{line}: {include}: {folder}/ must not include {target}/, "
                                f"a later stage")
    if problems:
        print("layering check failed:\n  " + "\n  ".join(problems))
        print(f"\nRule: {RULE}\nMove the code to the stage that may see both, or the shared part down.")
        return 1
    print(f"layering: {len(files)} files of lib/attnprobe include only their own or earlier stages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
