"""The web UI's assets are all served by the JobManager itself: index.html and the modules it loads
reference only local files (no CDN: machines running Weir often have no internet), every file they
reference exists, and the JobManager's REST app serves each of them with its media type."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.unit.jobmanager.conftest import MakeHarness
from weir.jobmanager.rest.app import create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # Starlette would rather have httpx2 under it
    from fastapi.testclient import TestClient

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


def index_references(html: str | None = None) -> list[str]:
    parser = References()
    parser.feed((WEB / "index.html").read_text() if html is None else html)
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


@pytest.fixture
def client(make_harness: MakeHarness) -> Iterator[TestClient]:
    harness = make_harness()
    harness.jm.recover_jobs()
    with TestClient(create_app(harness.jm)) as client:
        yield client


MEDIA_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}


def test_the_served_page_and_every_asset_it_loads_come_from_the_jobmanager(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), page.text[:300]
    assert not URL.search(page.text), "the served index.html names a remote URL"
    # what the page loads, then what each module imports, fetched from the app as a browser would
    todo = [r for r in index_references(page.text) if not r.startswith(("#", "data:"))]
    fetched: set[str] = set()
    while todo:
        ref = todo.pop()
        path = "/" + ref.lstrip("/")
        if path in fetched:
            continue
        fetched.add(path)
        response = client.get(path)
        assert response.status_code == 200, f"{path}: {response.status_code}"
        media = MEDIA_TYPES[Path(path).suffix]
        assert response.headers["content-type"].startswith(media), (path, response.headers["content-type"])
        if path.endswith(".js"):
            base = path.rsplit("/", 1)[0]
            todo += [f"{base}/{spec[2:]}" for spec in IMPORT.findall(response.text)]
    assert fetched >= {f"/web/{m.name}" for m in WEB.glob("*.js")} | {"/web/app.css"}, fetched
