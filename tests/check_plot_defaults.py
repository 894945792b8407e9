#!/usr/bin/python3
"""The figures' labels leave out each estimator's default keys and its samples knob, which plots/sweep_csv.py keeps
as DEFAULT_SPECS and SAMPLES_KNOBS so that a figure draws without a build; this checks them against the registry
(`attnprobe list --json`), so a changed default fails here instead of putting a wrong key into a label.
  tests/check_plot_defaults.py ATTNPROBE SOURCE_DIR"""
import json
import subprocess
import sys

attnprobe, source = sys.argv[1], sys.argv[2]
sys.path.insert(0, f"{source}/plots")
from sweep_csv import DEFAULT_SPECS, SAMPLES_KNOBS  # noqa: E402

registry = json.loads(subprocess.run([attnprobe, "list", "--json"], check=True, capture_output=True, text=True).stdout)
expected_specs = [e["spec"] for e in registry]
expected_knobs = {e["name"]: e["samples_knob"] for e in registry if e["samples_knob"]}
failures = []
if sorted(DEFAULT_SPECS) != sorted(expected_specs):
    failures.append("DEFAULT_SPECS differ from the registry's default specs:\n  only in sweep_csv.py: "
                    f"{sorted(set(DEFAULT_SPECS) - set(expected_specs))}\n  only in the registry: "
                    f"{sorted(set(expected_specs) - set(DEFAULT_SPECS))}")
if SAMPLES_KNOBS != expected_knobs:
    failures.append(f"SAMPLES_KNOBS differ from the registry's: {SAMPLES_KNOBS} against {expected_knobs}")
if failures:
    sys.exit("FAILED: " + "\n".join(failures) + "\n(copy them from `attnprobe list --json`: spec, samples_knob)")
print(f"plots/sweep_csv.py: {len(DEFAULT_SPECS)} default specs and {len(SAMPLES_KNOBS)} samples knobs as registered")
