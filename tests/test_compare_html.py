"""The HTML report of ``mldbg compare --html``: structure, escaping, and what a browser shows.

The browser tests drive a real headless Chromium (``scripts/ensure_chromium.sh`` installs
one); they are skipped, with that advice, where none is installed.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from mldbg.compare.report.html import render_html, write_html

CULPRIT = "model.layers.1.mlp"
WEIRD = 'weird.<root>&"q"#0.out'


# -- building results --------------------------------------------------------------------


def entry(
    name: str, role: str | None, max_abs: Any, ok: bool = True, **extra: Any
) -> dict[str, Any]:
    """One compared pair as ``compare_sources`` writes it."""
    module, _, rest = name.partition("#")
    call = int(rest.split(".")[0]) if rest else None
    value = max_abs if isinstance(max_abs, int | float) else 0.0
    item: dict[str, Any] = {
        "name": name,
        "module": module if rest else None,
        "call": call,
        "role": role,
        "shape_a": [1, 8, 64],
        "shape_b": [1, 8, 64],
        "dtype_a": "BF16",
        "dtype_b": "BF16",
        "transpose": None,
        "layout": None,
        "max_abs": max_abs,
        "mean_abs": value / 7 if isinstance(max_abs, int | float) else max_abs,
        "max_rel": value * 3 if isinstance(max_abs, int | float) else max_abs,
        "cosine": 1.0 - value / 100 if isinstance(max_abs, int | float) else None,
        "range_a": [-2.5, 3.25],
        "range_b": [-2.5, 3.25],
        "range_ratio": 1.0,
        "min_atol": 0.0 if ok else value / 2,
        "mismatched": 0 if ok else 37,
        "numel": 512,
        "rtol": 0.016,
        "atol": 1e-5,
        "head_a": [0.125, -1.5, 2.0, 0.0, 3.25],
        "head_b": [0.125, -1.5, 2.0, 0.0, 3.25],
        "worst": {"index": [0, 3, 17], "a": 1.0, "b": 1.0 + value},
        "nan_a": 0,
        "nan_b": 0,
        "error": None,
        "ok": ok,
        "culprit": False,
    }
    item.update(extra)
    return item


def llama_entries(layers: int) -> list[dict[str, Any]]:
    """A decoder's captures in execution order; layer 1's MLP is where the port goes wrong."""
    out = [
        entry(
            "model.embed_tokens#0.in.0",
            "in",
            0,
            shape_a=[1, 8],
            shape_b=[1, 8],
            dtype_a="I64",
            dtype_b="I32",
            head_a=[3, 17, 5, 9, 120],
            head_b=[3, 17, 5, 9, 120],
        ),
        entry("model.embed_tokens#0.out", "out", 0),
    ]
    broken = False
    for i in range(layers):
        base = f"model.layers.{i}"
        small = 10 ** -(7 - (i % 3)) if not broken else 0.3 * (i + 1)
        out.append(entry(f"{base}#0.in.0", "in", small, ok=not broken))
        for sub in ("input_layernorm", "self_attn", "post_attention_layernorm"):
            out.append(entry(f"{base}.{sub}#0.in.0", "in", small, ok=not broken))
            out.append(entry(f"{base}.{sub}#0.out", "out", small * 1.5, ok=not broken))
        out.append(entry(f"{base}.mlp#0.in.0", "in", small, ok=not broken))
        if i == 1:
            broken = True
            out.append(entry(f"{base}.mlp#0.out", "out", 0.31, ok=False, culprit=True))
            out.append(entry(f"{base}#0.out", "out", 0.35, ok=False))
        else:
            out.append(entry(f"{base}.mlp#0.out", "out", small * 2, ok=not broken))
            out.append(entry(f"{base}#0.out", "out", small * 3, ok=not broken))
    return out


def realistic_result(layers: int = 3) -> dict[str, Any]:
    """~40 entries with a culprit, an error, a transposed pair, hostile names and nan values."""
    entries = llama_entries(layers)
    entries += [
        entry(
            "model.conv#0.out",
            "out",
            2.5,
            ok=False,
            shape_a=[1, 8, 4, 4],
            shape_b=[1, 4, 4, 8],
            transpose=[0, 3, 1, 2],
            layout="NHWC→NCHW",
        ),
        entry(WEIRD, "out", "nan", ok=False, head_b=["nan", "inf", "-inf", 1.0, 2.0]),
        entry("model.norm#0.out", "out", "inf", ok=False, max_rel="inf", cosine=None),
        entry(
            "x",
            None,
            None,
            ok=False,
            shape_a=[3],
            shape_b=[4],
            error="shapes differ: [3] vs [4]",
            mean_abs=None,
            max_rel=None,
            cosine=None,
            min_atol=None,
            mismatched=None,
        ),
        {"name": "lm_head#0.out", "ok": False},  # everything else missing: must not crash
    ]
    failed = sum(1 for e in entries if not e["ok"])
    return {
        "ok": False,
        "a": {
            "spec": "ref",
            "kind": "capture",
            "path": "/x/.mldbg/runs/r1/captures/ref",
            "label": "ref (run llama-20261122-1)",
        },
        "b": {
            "spec": "port",
            "kind": "capture",
            "path": "/x/.mldbg/runs/r2/captures/port",
            "label": "port <mlx> & co (run llama-20261122-2)",
        },
        "rtol": None,
        "atol": None,
        "first_divergence": {
            "name": f"{CULPRIT}#0",
            "module": CULPRIT,
            "call": 0,
            "class": "LlamaMLP",
            "reason": "inputs agree, outputs differ",
            "entries": [f"{CULPRIT}#0.out"],
            "max_abs": 0.31,
            "inputs_compared": True,
        },
        "entries": entries,
        "unpaired_a": ["model.rotary_emb#0.out.0", "<only>&a"],
        "unpaired_b": ["model.layers.0.self_attn.rope#0.out"],
        "counts": {
            "compared": len(entries),
            "passed": len(entries) - failed,
            "failed": failed,
            "unpaired_a": 2,
            "unpaired_b": 1,
        },
        "warnings": ["B: 2 tensors stored as F8 were upcast"],
    }


def agreeing_result(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "ok": True,
        "a": {"spec": "a", "kind": "directory", "path": "/tmp/a", "label": "a"},
        "b": {"spec": "b", "kind": "directory", "path": "/tmp/b", "label": "b"},
        "rtol": 1e-3,
        "atol": None,
        "first_divergence": None,
        "entries": entries,
        "unpaired_a": [],
        "unpaired_b": [],
        "counts": {
            "compared": len(entries),
            "passed": len(entries),
            "failed": 0,
            "unpaired_a": 0,
            "unpaired_b": 0,
        },
    }


# -- structure ---------------------------------------------------------------------------

VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "col", "source", "area", "base"}
SVG_LEAVES = {"line", "circle", "path", "polyline", "polygon", "rect"}


class Structure(HTMLParser):
    """Checks nesting of every non-void element and records what the page pulls in."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.tags: dict[str, int] = {}
        self.external: list[str] = []
        self.text: list[str] = []
        self.doctype = ""

    def handle_decl(self, decl: str) -> None:
        self.doctype = decl

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] = self.tags.get(tag, 0) + 1
        values = dict(attrs)
        if tag == "script" and values.get("src"):
            self.external.append(f"script src={values['src']}")
        if tag == "link" and values.get("href"):
            self.external.append(f"link href={values['href']}")
        for key in ("src", "href", "xlink:href"):
            value = values.get(key) or ""
            if value and not value.startswith("#"):
                self.external.append(f"{tag} {key}={value}")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] = self.tags.get(tag, 0) + 1
        if tag not in VOID and tag not in SVG_LEAVES:
            self.problems.append(f"self-closed <{tag}/>")

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            self.problems.append(f"end tag for void </{tag}>")
        elif not self.stack:
            self.problems.append(f"</{tag}> with nothing open")
        elif self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes <{self.stack[-1]}> (open: {self.stack[-4:]})")
            if tag in self.stack:
                while self.stack and self.stack.pop() != tag:
                    pass
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(page: str) -> Structure:
    parser = Structure()
    parser.feed(page)
    parser.close()
    return parser


def test_realistic_report_is_well_formed_escaped_and_offline() -> None:
    page = render_html(realistic_result())
    assert page.startswith("<!DOCTYPE html>")
    assert '<meta charset="utf-8">' in page
    doc = parse(page)
    assert doc.doctype.lower() == "doctype html"
    assert not doc.problems, doc.problems[:5]
    assert not doc.stack, f"left open: {doc.stack}"
    for tag in ("html", "head", "body", "main", "svg", "table", "thead", "tbody", "details"):
        assert doc.tags.get(tag, 0) >= 1, tag
    assert doc.tags["tr"] == len(realistic_result()["entries"]) + 1
    # nothing from outside the file
    assert not doc.external, doc.external
    assert "http://" not in page and "https://" not in page
    assert "@import" not in page and "url(" not in page
    assert "<script" not in page
    # hostile names arrive escaped, and read back as themselves
    assert "<root>" not in page and "<only>" not in page and "<mlx>" not in page
    assert "weird.&lt;root&gt;&amp;&quot;q&quot;#0.out" in page
    text = "".join(doc.text)
    assert WEIRD in text and "<only>&a" in text and "port <mlx> & co" in text
    # header, verdict, culprit box, layout, error, nan
    assert "mldbg parity report" in text
    assert "diverges" in text and "scale-aware" in text
    assert CULPRIT in text and "inputs agree, outputs differ" in text
    assert "deepest module whose inputs agree but whose outputs differ" in text
    assert "NHWC→NCHW" in text and "shapes differ: [3] vs [4]" in text
    assert "nan" in text and "inf" in text
    assert "B: 2 tensors stored as F8 were upcast" in text
    # the culprit's row is marked, and only that one
    assert page.count('class="fail output culprit"') == 1
    assert "10⁻⁷" in text  # y ticks are powers of ten


def test_plot_draws_outputs_only_with_tooltips_and_culprit_marker() -> None:
    result = realistic_result()
    page = render_html(result)
    outputs = [e for e in result["entries"] if e.get("role") in ("out", None)]
    plotted = [e for e in outputs if e.get("max_abs") is not None or not e["ok"]]
    svg = page[page.index("<svg") : page.index("</svg>")]
    marks = svg.count("<circle") + svg.count("<path")
    assert marks == len(plotted)
    assert svg.count("<title>") >= len(plotted)
    assert "first divergence: " + CULPRIT in svg
    assert 'class="culprit-line"' in svg
    assert 'class="pass zero"' in svg  # exact zeros drawn on their own band


def test_cosine_near_one_keeps_its_difference() -> None:
    result = agreeing_result([entry("t", None, 1e-6, cosine=1 - 2.5e-7)])
    assert "1−2.50e-7" in render_html(result)


def test_all_agree_and_empty_results_say_so() -> None:
    entries = [entry(f"step{i}", None, 0 if i % 2 else 1e-7) for i in range(12)]
    page = render_html(agreeing_result(entries))
    doc = parse(page)
    assert not doc.problems and not doc.stack
    text = "".join(doc.text)
    assert "match" in text and "diverges" not in text
    assert "Everything agrees" in text and "All 12 compared tensors" in text
    assert "rtol 0.001 · atol dtype default" in text

    empty = render_html(agreeing_result([]))
    doc = parse(empty)
    assert not doc.problems and not doc.stack
    text = "".join(doc.text)
    assert "Everything agrees" in text and "No entries." in text and "No outputs to plot" in text

    bare = render_html({"ok": False, "entries": [{"name": "x", "ok": False, "error": "boom"}]})
    text = "".join(parse(bare).text)
    assert "no first divergence was named" in text and "boom" in text

    assert "mldbg parity report" in render_html({})


def test_huge_result_renders_fast_and_bounded() -> None:
    entries = llama_entries(510)  # 10 tensors per layer
    assert len(entries) > 5000
    result = realistic_result()
    result["entries"] = entries
    page = render_html(result)  # how fast: benchmarks/parity.py
    assert page.count("<tr id=") == len(entries)
    svg = page[page.index("<svg") : page.index("</svg>")]
    assert svg.count("<circle") <= 1000 and svg.count("<title>") < 20  # drawn as an envelope
    assert "<polygon" in svg and "first divergence: " + CULPRIT in svg
    assert not parse(page).problems


def test_write_html_is_atomic_and_leaves_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_text("<!DOCTYPE html>\nan older report")  # only an earlier report is replaced
    returned = write_html(realistic_result(), target)
    assert returned == target
    assert target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]
    with pytest.raises(FileNotFoundError):
        write_html(realistic_result(), tmp_path / "missing" / "r.html")
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


# -- in a real browser -------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no headless Chromium on PATH: run scripts/ensure_chromium.sh to install one")


def run_chromium(binary: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        binary,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"chromium exited {done.returncode}:\n{done.stderr[-5000:]}"
    return done


@pytest.mark.browser
def test_browser_renders_culprit_and_plot(chromium: str, tmp_path: Path) -> None:
    result = realistic_result()
    report = write_html(result, tmp_path / "report.html")
    done = run_chromium(chromium, tmp_path, "--dump-dom", report.as_uri())
    dom = done.stdout
    assert CULPRIT in dom, done.stderr[-3000:]
    assert "<svg" in dom
    svg = dom[dom.index("<svg") : dom.index("</svg>")]
    assert svg.count("<circle") >= 15, done.stderr[-3000:]
    assert "weird.&lt;root&gt;&amp;" in dom


@pytest.mark.browser
def test_screenshot_is_not_blank_and_shows_red(chromium: str, tmp_path: Path) -> None:
    report = write_html(realistic_result(), tmp_path / "report.html")
    shot = tmp_path / "shot.png"
    done = run_chromium(
        chromium, tmp_path, f"--screenshot={shot}", "--window-size=1280,2000", report.as_uri()
    )
    assert shot.exists(), done.stderr[-3000:]
    width, height, pixels = decode_png(shot.read_bytes(), max_rows=1100)
    assert width == 1280 and height == 2000
    colours = set(pixels)
    assert len(colours) > 200, f"only {len(colours)} colours: blank page?\n{done.stderr[-3000:]}"
    reds = sum(1 for r, g, b in pixels if r > 180 and g < 80 and b < 80)
    assert reds > 500, f"{reds} red pixels: failures not drawn in red?"
    whites = sum(1 for p in pixels if p == (255, 255, 255))
    assert whites > len(pixels) // 4  # a light page


def decode_png(data: bytes, max_rows: int) -> tuple[int, int, list[tuple[int, int, int]]]:
    """(width, height, RGB of the first ``max_rows`` rows) of an 8-bit RGB/RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = zlib.decompressobj().decompress(idat, 0)
    stride = width * channels
    previous = bytearray(stride)
    pixels: list[tuple[int, int, int]] = []
    for row in range(min(height, max_rows)):
        start = row * (stride + 1)
        line = unfilter(
            raw[start], bytearray(raw[start + 1 : start + 1 + stride]), previous, channels
        )
        pixels.extend(zip(line[0::channels], line[1::channels], line[2::channels], strict=True))
        previous = line
    return width, height, pixels


def unfilter(kind: int, line: bytearray, prev: bytearray, bpp: int) -> bytearray:
    if kind == 1:
        for i in range(bpp, len(line)):
            line[i] = (line[i] + line[i - bpp]) & 0xFF
    elif kind == 2:
        line = bytearray((x + y) & 0xFF for x, y in zip(line, prev, strict=True))
    elif kind == 3:
        for i in range(len(line)):
            left = line[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
    elif kind == 4:
        for i in range(len(line)):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
            line[i] = (line[i] + pred) & 0xFF
    return line
