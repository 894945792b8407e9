#!/usr/bin/env python3
"""Loads an `attnprobe report` page in headless Chromium and checks that it renders (issue: the HTML report).

Usage: check_report_browser.py ATTNPROBE WORK_DIR

Builds a small run (a synthetic dump; four estimators at two lengths and two sample counts, bias/variance, a
selection estimator with keys read, head diagnostics), writes its report with itself as the baseline, then in
Chromium: the page's script ran (data-ready), raised no error (data-errors="0", and no "Uncaught" console line),
every chart is an <svg> in the rendered DOM, a #hide=... address hides that estimator, and a screenshot is not
blank (many colours, a good share of non-white pixels). Exit 77 (skipped) without Chromium or Pillow.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, **kwargs)
    if result.returncode != 0:
        sys.exit(f"FAILED: {' '.join(map(str, command))} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def browse(browser, work, args):
    # --user-data-dir: a fresh profile per call, so runs never share state; no sandbox as root in CI.
    profile = work / "profile"
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args]
    return run(command)


def main():
    attnprobe, work = sys.argv[1], pathlib.Path(sys.argv[2])
    browser = chromium()
    if browser is None:
        print("SKIPPED: no chromium on PATH (tools/install_deps.sh installs Debian's)")
        return 77
    try:
        from PIL import Image
    except ImportError:
        print("SKIPPED: no Pillow (python3-pil) for the screenshot check")
        return 77
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    dump = work / "synth.h5"
    run([attnprobe, "synth", "-o", dump, "--layers", "2", "--heads", "3", "--batch", "1", "--tokens", "256",
         "--dim", "16", "--gzip", "0"])
    csv = work / "run.csv"
    run([attnprobe, "sweep", dump, "-e", "softmax", "-e", "vmean", "-e", "performer", "-e", "yoso",
         "--samples", "8,32", "--lengths", "128,256", "--trials", "3", "--metrics", "all,case", "-q", "-o", csv])
    selection = work / "selection.csv"
    run([attnprobe, "sweep", dump, "-e", "topk", "-e", "oracle_sample", "--samples", "8,32", "--lengths", "128,256",
         "--mask", "causal", "--queries", "last:8", "--trials", "3", "--metrics", "all,selection", "-q",
         "-o", selection])
    diagnostics = work / "diag.csv"
    run([attnprobe, "diagnose", dump, "--lengths", "256", "-q", "-o", diagnostics])
    pages = {}
    # Each run against itself as its baseline (the gate's section).
    for name, inputs in (("run", [csv, csv]), ("selection", [selection, selection])):
        page = work / f"{name}.html"
        run([attnprobe, "report", *inputs, "--diagnostics", diagnostics, "-o", page])
        pages[name] = page

    for name, page in pages.items():
        expected_charts = page.read_text().count("<svg")
        dom = browse(browser, work, ["--dump-dom", page.as_uri()])
        uncaught = [line for line in dom.stderr.splitlines() if "CONSOLE" in line and "Uncaught" in line]
        if uncaught:
            sys.exit(f"FAILED: {name}: script errors in the console:\n" + "\n".join(uncaught))
        body = re.search(r"<body[^>]*>", dom.stdout)
        if not body or 'data-ready="yes"' not in body.group(0) or 'data-errors="0"' not in body.group(0):
            sys.exit(f"FAILED: {name}: the page's script did not finish cleanly: {body.group(0) if body else dom.stdout[:300]}")
        charts = int(re.search(r'data-charts="(\d+)"', body.group(0)).group(1))
        if charts != expected_charts or charts < 10:
            sys.exit(f"FAILED: {name}: {charts} svg elements rendered, the page holds {expected_charts}")
        for section in ("run", "gate", "numbers", "ranking", "length", "samples", "heads", "cost", "bias"):
            if f'<section id="{section}">' not in dom.stdout:
                sys.exit(f"FAILED: {name}: section {section} missing from the rendered page")
        print(f"{name}: {charts} svg elements rendered (charts, maps, legend swatches), no script errors")

    # The address can hide an estimator: every element of it gets the class `hidden`, the others do not.
    dom = browse(browser, work, ["--dump-dom", pages["run"].as_uri() + "#hide=performer"]).stdout
    performer = re.findall(r'<[^>]*data-estimator="performer"[^>]*>', dom)
    vmean = re.findall(r'<[^>]*data-estimator="vmean"[^>]*>', dom)
    if not performer or any("hidden" not in tag for tag in performer) or any("hidden" in tag for tag in vmean):
        sys.exit("FAILED: #hide=performer did not hide exactly performer's series, maps and rows")
    print(f"#hide=performer: {len(performer)} elements hidden, vmean's {len(vmean)} shown")

    shot = work / "shot.png"
    browse(browser, work, [f"--screenshot={shot}", "--window-size=1200,2400", pages["run"].as_uri()])
    image = Image.open(shot).convert("RGB")
    pixels = list(image.getdata())
    colours = len(set(pixels))
    inked = sum(1 for p in pixels if sum(p) < 3 * 235) / len(pixels)
    print(f"screenshot: {image.size[0]}x{image.size[1]}, {colours} colours, {inked:.1%} of pixels inked")
    # observed: 740 colours, 9.0% inked (text, lines, maps on white)
    if colours < 50 or inked < 0.02:
        sys.exit("FAILED: the screenshot is (nearly) blank")
    print("report renders in Chromium: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
