"""The one look of every figure: each estimator's colour, the settings of one estimator, the legend and the sizes.

Colours come from plots/palette.csv (one row per estimator name of `attnprobe list`), which the HTML report reads
too (lib/CMakeLists.txt generates its table from the file), so an estimator has one colour in every figure and on
every report page. The settings of one estimator share its colour and differ in line style and marker
(`setting_style`). Importing this module sets matplotlib's sizes (fonts, legend frame) for the script.
"""
import colorsys
import csv
import os

import matplotlib

PALETTE_CSV = os.path.join(os.path.dirname(os.path.abspath(__file__)), "palette.csv")
# Neutral lines that are not an estimator (a promise, a diagonal, exact attention's time): grey, never a palette
# colour.
NEUTRAL = "#808080"
# Names the palette does not list (a custom py: estimator) take these in order of first use: Paul Tol's light
# scheme, none of which palette.csv uses, so they cannot be taken for a listed estimator.
FALLBACK = ["#77AADD", "#EE8866", "#EEDD88", "#FFAABB", "#99DDFF", "#44BB99", "#BBCC33", "#AAAA00"]
LINESTYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "P"]
LEGEND_FONTSIZE = 7.5


def read_palette(path=PALETTE_CSV):
    """{estimator name: '#RRGGBB'} from palette.csv ('#' lines are comments)."""
    with open(path, newline="") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return {row["estimator"]: row["colour"] for row in rows}


PALETTE = read_palette()
_fallback_of = {}


def estimator_of(label):
    """The estimator name a spec or a label starts with: 'yoso(m=8)' and 'yoso (m=8) vs yoso-e' -> 'yoso'."""
    return label.split("(", 1)[0].split(" ", 1)[0]


def colour(name):
    """The colour of the estimator `name` (a spec or label works too: its estimator name is used)."""
    name = estimator_of(name)
    if name in PALETTE:
        return PALETTE[name]
    if name not in _fallback_of:
        _fallback_of[name] = FALLBACK[len(_fallback_of) % len(FALLBACK)]
    return _fallback_of[name]


def shades(name, count):
    """`count` shades of the estimator's colour, dark to light: settings of one estimator told apart by lightness
    where line style cannot (dots, bars). The hue stays the estimator's."""
    r, g, b = matplotlib.colors.to_rgb(colour(name))
    hue, lightness, saturation = colorsys.rgb_to_hls(r, g, b)
    if count == 1:
        return [colour(name)]
    low, high = min(lightness, 0.25), max(lightness, 0.6)
    return [colorsys.hls_to_rgb(hue, low + (high - low) * i / (count - 1), saturation) for i in range(count)]


def setting_style(index):
    """Line style and marker of an estimator's `index`-th setting (0: solid with circles), its colour unchanged."""
    return {"linestyle": LINESTYLES[index % len(LINESTYLES)], "marker": MARKERS[index % len(MARKERS)]}


def settings_styles(labels):
    """{label: setting_style}: the settings of each estimator numbered in the order of `labels`."""
    seen, styles = {}, {}
    for label in labels:
        name = estimator_of(label)
        styles[label] = setting_style(seen.get(name, 0))
        seen[name] = seen.get(name, 0) + 1
    return styles


def room_above(ax, fraction):
    """Raise the top of `ax`'s (logarithmic) y axis so that the drawing fills only the lower 1 - `fraction` of it: space
    for a legend of many lines that no corner of the data leaves free."""
    low, high = ax.get_ylim()
    ax.set_ylim(low, high * (high / low) ** (fraction / (1 - fraction)))


def legend(ax, **options):
    """A legend inside the axes where it covers the fewest points, on a half-transparent frame."""
    options.setdefault("loc", "best")
    options.setdefault("fontsize", LEGEND_FONTSIZE)
    return ax.legend(framealpha=0.8, **options)


matplotlib.rcParams.update({"font.size": 9, "axes.titlesize": 9.5, "axes.labelsize": 9, "figure.titlesize": 10.5,
                            "errorbar.capsize": 2.5, "lines.markersize": 3.5})
