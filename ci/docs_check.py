"""Checks of the built documentation site (ci/docs.sh runs both).

python ci/docs_check.py links HTML_DIR
    Every internal link and resource of every page resolves: the file exists, and the
    anchor (#...) is an id or name in it. External links (a scheme, or //host) are
    counted, not fetched (CI has no internet).

python ci/docs_check.py screenshots HTML_DIR OUT_DIR
    Headless Chromium (Debian's `chromium`) renders the start page, sendrecv's entry
    in the API reference and the performance guide (its plots) to OUT_DIR/*.png. A
    page fails if its HTML shows a build error (a docutils system message, a
    traceback), lacks what it must show (the entry's anchor, the images of its plots),
    or its picture is blank: almost every pixel one colour.

python ci/docs_check.py readme README DOCS_INDEX
    The README's example is the start page's first example, which CI runs: the same
    code (the README's first Python block, less its leading comment lines), and each
    line the start page's output block shows is quoted in the README. Every relative
    link of the README names a file of the checkout, and a heading of it where it has
    an anchor (#...).
"""

from __future__ import annotations

import collections
import html.parser
import pathlib
import re
import shutil
import subprocess
import sys
import urllib.parse

# (name, page, anchor that must exist in it, whether it must show a plot)
PAGES = [
    ("start", "index.html", "", False),
    ("api-sendrecv", "api/point-to-point.html", "jaxmpi.sendrecv", False),
    ("guide-performance", "guides/performance.html", "", True),
]
WINDOW = (1280, 1400)
MOST_COMMON_COLOUR_AT_MOST = 0.97  # a blank page is one colour; a page of text is not
BUILD_ERRORS = (
    'class="system-message"',
    "Traceback (most recent call last)",
    'class="problematic"',
)


class Page(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.images: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        for key in ("id", "name"):
            if a.get(key) and (key == "id" or tag == "a"):
                self.ids.add(a[key])  # type: ignore[arg-type]
        for key in ("href", "src"):
            if a.get(key) and not (
                tag == "link" and a.get("rel") in ("preconnect", "dns-prefetch")
            ):
                self.links.append(a[key])  # type: ignore[arg-type]
        if tag == "img" and a.get("src"):
            self.images.append(a["src"])  # type: ignore[arg-type]


def parse(path: pathlib.Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def links(root: pathlib.Path) -> int:
    pages = {p: parse(p) for p in sorted(root.rglob("*.html"))}
    broken, internal, external = [], 0, 0
    for path, page in pages.items():
        for link in page.links:
            parts = urllib.parse.urlsplit(link)
            if parts.scheme or link.startswith("//"):
                external += 1
                continue
            internal += 1
            target = (
                (path.parent / urllib.parse.unquote(parts.path)).resolve() if parts.path else path
            )
            if target.is_dir():
                target = target / "index.html"
            where = f"{path.relative_to(root)}: {link}"
            if not target.is_file():
                broken.append(f"{where}: no file {target}")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else parse(target).ids
                if urllib.parse.unquote(parts.fragment) not in ids:
                    broken.append(f"{where}: no anchor #{parts.fragment} in {target.name}")
    print(
        f"docs_check links: {len(pages)} pages, {internal} internal links and resources, "
        f"{len(broken)} broken; {external} external links not fetched"
    )
    for line in broken:
        print(f"BROKEN {line}")
    return 1 if broken else 0


def blank_share(png: pathlib.Path) -> float:
    """The share of the picture's pixels that have its most common colour."""
    from PIL import Image

    with Image.open(png) as image:
        rgb = image.convert("RGB")
        pixels = rgb.get_flattened_data() if hasattr(rgb, "get_flattened_data") else rgb.getdata()
        counts = collections.Counter(pixels)
        return counts.most_common(1)[0][1] / len(pixels)


def screenshot(browser: str, url: str, out: pathlib.Path) -> str | None:
    """Renders url to out; None, or what went wrong."""
    out.unlink(missing_ok=True)
    argv = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions",
            f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--screenshot={out}", url]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return "chromium did not finish within 120 s"
    if not out.is_file():
        return f"chromium wrote no picture (exit {done.returncode}): {done.stderr.strip()[-500:]}"
    return None


def screenshots(root: pathlib.Path, out_dir: pathlib.Path) -> int:
    browser = shutil.which("chromium")
    if browser is None:
        print("docs_check screenshots: no `chromium` on PATH (ci/docs.sh installs Debian's)")
        return 1
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, page_path, anchor, plot in PAGES:
        path = root / page_path
        png = out_dir / f"{name}.png"
        problems = []
        if not path.is_file():
            problems.append(f"no page {page_path}")
        else:
            text = path.read_text(encoding="utf-8")
            problems += [f"the page shows a build error ({e})" for e in BUILD_ERRORS if e in text]
            page = parse(path)
            if anchor and anchor not in page.ids:
                problems.append(f"no #{anchor} on the page")
            if plot and not page.images:
                problems.append("no plot on the page")
            for src in page.images:
                if not (path.parent / urllib.parse.unquote(src)).is_file():
                    problems.append(f"the image {src} is missing")
            url = path.resolve().as_uri() + (f"#{anchor}" if anchor else "")
            problem = screenshot(browser, url, png)
            if problem:
                problems.append(problem)
            else:
                share = blank_share(png)
                if share > MOST_COMMON_COLOUR_AT_MOST:
                    problems.append(f"blank: {share:.1%} of the picture is one colour")
        status = "ok" if not problems else "FAIL " + "; ".join(problems)
        print(
            f"docs_check screenshots: {page_path}{'#' + anchor if anchor else ''} -> {png}: {status}"
        )
        failed += bool(problems)
    return 1 if failed else 0


def _fenced(text: str, opening: str) -> tuple[list[str], int]:
    """The lines of the first fenced block whose opening line is `opening`, and the index
    of the line after it (ValueError where there is none)."""
    lines = text.splitlines()
    start = lines.index(opening) + 1
    end = lines.index("```", start)
    return lines[start:end], end + 1


def _anchor(heading: str) -> str:
    """The anchor GitHub and MyST give a Markdown heading."""
    words = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
    return words.replace(" ", "-")


def _headings(path: pathlib.Path) -> set[str]:
    """The anchors of a Markdown file's headings (lines in fenced blocks are none)."""
    anchors, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif line.startswith("#") and not fenced:
            anchors.add(_anchor(line.lstrip("#").strip()))
    return anchors


def _readme_links(readme_path: pathlib.Path, text: str) -> list[str]:
    problems = []
    for target in re.findall(r"\]\(([^)]+)\)", text):
        if urllib.parse.urlsplit(target).scheme:
            continue
        path, _, anchor = target.partition("#")
        linked = readme_path.parent / path
        if not linked.is_file():
            problems.append(f"links to {path}, which does not exist")
        elif anchor and anchor not in _headings(linked):
            problems.append(f"links to {target}: {path} has no heading of that anchor")
    return problems


def readme(readme_path: pathlib.Path, index_path: pathlib.Path) -> int:
    text, index = readme_path.read_text(), index_path.read_text()
    problems = []
    try:
        code, _ = _fenced(text, "```python")
        ran, after = _fenced(index, "```{mpirun}")
        output, _ = _fenced("\n".join(index.splitlines()[after:]), "```{output}")
    except ValueError:
        print(f"{readme_path}: no ```python block, or {index_path}: no mpirun/output blocks")
        return 1
    while code and code[0].startswith("#"):
        code = code[1:]
    if code != ran:
        problems.append(f"its example is not {index_path.name}'s first mpirun block, which CI runs")
    problems += [f"it does not quote the line `{line}` printed" for line in output
                 if f"`{line}`" not in text]  # fmt: skip
    problems += _readme_links(readme_path, text)
    for problem in problems:
        print(f"{readme_path.name}: {problem}")
    if not problems:
        print(f"{readme_path.name}: its example is {index_path.name}'s first, and so is its output")
    return 1 if problems else 0


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "links":
        return links(pathlib.Path(sys.argv[2]).resolve())
    if len(sys.argv) == 4 and sys.argv[1] == "screenshots":
        return screenshots(pathlib.Path(sys.argv[2]).resolve(), pathlib.Path(sys.argv[3]))
    if len(sys.argv) == 4 and sys.argv[1] == "readme":
        return readme(pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3]))
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
