#!/usr/bin/env python3
"""Keeps the Markdown tables that `attnprobe list --markdown NAME` prints in step with the registry.

docs/*.md (and any Markdown file given) hold each generated table between two markers:

    <!-- generated: attnprobe list --markdown estimators -->
    | estimator | ... |
    <!-- end generated -->

Check (the CTest `generated_tables`; exit 1 naming every stale block):
    tools/generated_tables.py build/attnprobe docs/*.md
Rewrite the blocks after registering or changing an estimator:
    tools/generated_tables.py build/attnprobe --write docs/*.md
"""
import argparse
import re
import subprocess
import sys

BLOCK = re.compile(r"(<!-- generated: attnprobe list --markdown (\w+) -->\n)(.*?)(<!-- end generated -->)", re.S)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("attnprobe", help="the attnprobe binary")
    parser.add_argument("files", nargs="+", help="Markdown files that may hold generated blocks")
    parser.add_argument("--write", action="store_true", help="rewrite stale blocks instead of reporting them")
    args = parser.parse_args()

    tables = {}

    def table(name: str) -> str:
        if name not in tables:
            tables[name] = subprocess.run([args.attnprobe, "list", "--markdown", name], check=True,
                                          capture_output=True, text=True).stdout
        return tables[name]

    stale, blocks = [], 0
    for path in args.files:
        with open(path, encoding="utf-8") as f:
            text = f.read()

        def replace(match: re.Match) -> str:
            nonlocal blocks
            blocks += 1
            fresh = table(match.group(2))
            if match.group(3) != fresh:
                stale.append(f"{path}: the '{match.group(2)}' table")
            return match.group(1) + fresh + match.group(4)

        updated = BLOCK.sub(replace, text)
        if args.write and updated != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(updated)
    if args.write:
        print(f"generated_tables: {len(stale)} of {blocks} blocks rewritten")
        return 0
    if stale:
        print("generated_tables: stale generated blocks (the registry changed):\n  " + "\n  ".join(stale) +
              "\nrun: tools/generated_tables.py build/attnprobe --write docs/*.md", file=sys.stderr)
        return 1
    if blocks == 0:
        print("generated_tables: no generated blocks found in " + ", ".join(args.files), file=sys.stderr)
        return 1
    print(f"generated_tables: {blocks} blocks up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
