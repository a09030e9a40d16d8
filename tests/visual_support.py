"""Support for the console's visual regression test: pinned fonts, and a tolerant
comparison of a screenshot against a committed baseline PNG (Pillow).

Rendering is made repeatable before anything is compared:

- :func:`pinned_fontconfig` writes a fontconfig file that offers Chromium only the
  DejaVu fonts (Debian's ``fonts-dejavu-core``, which fontconfig itself depends on)
  and maps the generic families to them, so ``system-ui`` and ``monospace``
  resolve the same whatever other fonts a machine has installed;
- the test fixes the data (turn IDs, the fake provider), the viewport and the
  device scale factor, and screenshots with animations disabled and the caret
  hidden.

What is left between two runs with the same browser is at most a few pixels of a
rounded corner off by 1-2 levels. :func:`compare` ignores a channel difference up
to ``CHANNEL_TOLERANCE`` and accepts up to ``MAX_DIFFERING_SHARE`` of the pixels
differing by more. Measured against the baseline with a stylesheet changed on
purpose, this catches a garbage stylesheet (51 % of the pixels), a heading 1px
larger (5.8 %), a 1px wider button padding (0.47 %), the accent colour moved by 11
levels (0.70 %), the muted text colour moved by 16 (0.50 %) and a corner radius
2px larger (0.037 %). A new browser release may move antialiasing everywhere:
the baseline records the browser it was made with (:func:`save_baseline`), and a
mismatch says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CHANNEL_TOLERANCE",
    "DEJAVU",
    "MAX_DIFFERING_SHARE",
    "Mismatch",
    "compare",
    "pinned_fontconfig",
    "save_baseline",
]

DEJAVU = Path("/usr/share/fonts/truetype/dejavu")

#: A pixel counts as different when one of its channels is off by more than this (0-255).
CHANNEL_TOLERANCE = 8
#: The screenshot matches when at most this share of its pixels differ (0.02 %: 220 of
#: the 1,100,800 pixels of a 1280x860 view, a few glyphs' worth).
MAX_DIFFERING_SHARE = 0.0002

#: The PNG text chunk where a baseline records the browser that rendered it.
BROWSER_KEY = "intention-kernel:browser"

# The machine's own rules (hinting, antialiasing, the generic families) but only the
# DejaVu fonts: without the rules, generic families fall back to whatever font comes
# first (a serif), and weights are not matched.
_FONTCONFIG = """<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "fonts.dtd">
<fontconfig>
  <dir>{fonts}</dir>
  <cachedir>{cache}</cachedir>
  <include ignore_missing="yes">/etc/fonts/conf.d</include>
{aliases}
</fontconfig>
"""

_ALIAS = (
    '  <alias binding="strong"><family>{generic}</family>'
    "<prefer><family>{font}</family></prefer></alias>"
)

_GENERIC = {
    "sans-serif": "DejaVu Sans",
    "sans": "DejaVu Sans",
    "system-ui": "DejaVu Sans",
    "serif": "DejaVu Serif",
    "monospace": "DejaVu Sans Mono",
}


def pinned_fontconfig(directory: Path) -> Path:
    """A fontconfig file offering only the DejaVu fonts; pass it to Chromium as
    ``FONTCONFIG_FILE``."""
    cache = directory / "fontconfig-cache"
    cache.mkdir(parents=True, exist_ok=True)
    aliases = "\n".join(_ALIAS.format(generic=g, font=f) for g, f in _GENERIC.items())
    path = directory / "fonts.conf"
    path.write_text(_FONTCONFIG.format(fonts=DEJAVU, cache=cache, aliases=aliases))
    return path


@dataclass(frozen=True)
class Mismatch:
    """Why a screenshot does not match its baseline; ``diff`` highlights where."""

    reason: str
    diff: Path | None = None

    def __str__(self) -> str:
        where = f"; differences in red: {self.diff}" if self.diff else ""
        return f"{self.reason}{where}"


def save_baseline(actual: Path, baseline: Path, browser: str) -> None:
    """Store ``actual`` as the baseline, recording ``browser`` (name and version)."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text(BROWSER_KEY, browser)
    baseline.parent.mkdir(parents=True, exist_ok=True)
    with Image.open(actual) as shot:
        shot.save(baseline, pnginfo=info, optimize=True)


def compare(actual: Path, baseline: Path, diff: Path, browser: str) -> Mismatch | None:
    """``None`` when ``actual`` matches ``baseline`` within the tolerance; otherwise
    the mismatch, with a diff image written to ``diff`` (the screenshot faded, every
    differing pixel red)."""
    from PIL import Image, ImageChops

    with Image.open(actual) as shot, Image.open(baseline) as base:
        got, want = shot.convert("RGB"), base.convert("RGB")
        made_with = str(base.info.get(BROWSER_KEY, "an unrecorded browser"))
    if got.size != want.size:
        return Mismatch(f"the screenshot is {got.size}, the baseline {want.size}")
    red, green, blue = ImageChops.difference(got, want).split()
    largest = ImageChops.lighter(ImageChops.lighter(red, green), blue)
    mask = largest.point(lambda level: 255 if level > CHANNEL_TOLERANCE else 0)
    differing = mask.histogram()[255]
    share = differing / (got.width * got.height)
    if share <= MAX_DIFFERING_SHARE:
        return None
    picture = Image.blend(got, Image.new("RGB", got.size, "white"), 0.75)
    picture.paste((255, 0, 0), mask=mask)
    picture.save(diff)
    browsers = (
        f"rendered by {browser}, as the baseline was"
        if browser == made_with
        else f"rendered by {browser}, the baseline by {made_with}: if the diff shows only "
        "antialiasing, the browser changed, not the console"
    )
    return Mismatch(
        f"{differing} pixels ({share:.3%}) differ from the baseline by more than "
        f"{CHANNEL_TOLERANCE} levels (at most {MAX_DIFFERING_SHARE:.2%} may), within the "
        f"box {mask.getbbox()}; {browsers}",
        diff,
    )
