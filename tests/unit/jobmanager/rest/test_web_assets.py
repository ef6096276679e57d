"""The web UI's assets are all served by the JobManager itself: index.html and the modules it loads
reference only local files (no CDN: machines running Weir often have no internet), and every file
they reference exists."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

WEB = Path(__file__).resolve().parents[4] / "jobmanager" / "rest" / "web"
SVG_NAMESPACE = "http://www.w3.org/2000/svg"  # an XML namespace name, never fetched
URL = re.compile(r"https?://[^\s'\")]+", re.IGNORECASE)
IMPORT = re.compile(r"""^\s*import\s+(?:[^'"]+\s+from\s+)?["']([^"']+)["']""", re.MULTILINE)


class References(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value is not None:
                self.refs.append(value)


def index_references() -> list[str]:
    parser = References()
    parser.feed((WEB / "index.html").read_text())
    return parser.refs


def asset(ref: str) -> Path:
    """The file of a reference relative to / (``web/app.js`` -> jobmanager/rest/web/app.js)."""
    path = ref.split("?")[0].split("#")[0].lstrip("/")
    assert path.startswith("web/"), f"{ref}: assets are served under /web/"
    return WEB / path.removeprefix("web/")


def test_index_references_only_local_assets() -> None:
    refs = index_references()
    assert any(r.endswith("app.js") for r in refs) and any(r.endswith("app.css") for r in refs), refs
    text = (WEB / "index.html").read_text()
    assert not URL.search(text), f"index.html names a remote URL: {URL.search(text)}"
    for ref in refs:
        if ref.startswith("#") or ref.startswith("data:"):
            continue  # a route of the page itself, an inline icon
        assert asset(ref).is_file(), f"index.html references {ref}, which is not in {WEB}"


def test_modules_import_only_local_modules_that_exist() -> None:
    modules = sorted(WEB.glob("*.js"))
    assert {"app.js", "lib.js"} <= {m.name for m in modules}
    for module in modules:
        text = module.read_text()
        for spec in IMPORT.findall(text):
            assert spec.startswith("./"), f"{module.name} imports {spec!r}: only modules beside it"
            assert (WEB / spec[2:]).is_file(), f"{module.name} imports {spec}, which does not exist"
        remote = URL.findall(text.replace(SVG_NAMESPACE, ""))
        assert remote == [], f"{module.name} names remote URLs: {remote}"


def test_stylesheet_loads_nothing_remote() -> None:
    css = (WEB / "app.css").read_text()
    assert "@import" not in css
    assert not re.search(r"url\(\s*['\"]?(?:https?:)?//", css)
    assert not URL.search(css)
