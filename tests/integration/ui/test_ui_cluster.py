"""The web UI served by the JobManager of the session's local cluster, in a real headless chromium,
on a running job: the keyed aggregation (parallelism 3, a keyed shuffle, checkpoints every second)
and, for the exception history, a job failing in every attempt (restart_loop.py).

With WEIR_UI_SCREENSHOTS=1 the screenshots also go to docs/images/ (docs/ui.md shows them)."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.integration.conftest import WeirCluster, create_topics, create_window_table
from tests.integration.polling import poll
from tests.integration.ui.conftest import BrowserPage, Screenshots
from weir.jobmanager.rest.ids import flink_job_id
from weir.tools.events import EventSpec, produce_events

pytestmark = pytest.mark.integration

EVENTS = 300_000
RATE = 2_000  # records/s over all source subtasks: the job runs ~150 s, longer than this module
LOOP_JOB = "tests/integration/observability/jobs/restart_loop.py"


@dataclass(frozen=True)
class Ui:
    base_url: str  # the JobManager's REST port, where the UI is served
    keyed: str  # the keyed aggregation's job id
    loop: str  # the failing job's

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.base_url}{path.lstrip('/')}", timeout=10) as response:
            return json.load(response)


def _answers(ui: Ui, path: str) -> Any | None:
    try:
        return ui.get(path)
    except (urllib.error.URLError, ConnectionError):
        return None


@pytest.fixture(scope="module")
def ui(weir_cluster: WeirCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:
    endpoints = weir_cluster.endpoints
    host = endpoints.jobmanager_address.rsplit(":", 1)[0]
    base_url = f"http://{host}:{endpoints.jobmanager_rest_port}/"
    unique = f"ui{int(time.time())}"
    # One source partition per source subtask: each has a watermark from its first record on (with
    # two, a subtask's watermark waits until its consumer has read from both, which can take a while).
    source, sink, dlq, table = f"events-{unique}", f"results-{unique}", f"dlq-{unique}", f"window_results_{unique}"
    create_topics(endpoints, {source: 3, sink: 3, dlq: 1})
    create_window_table(endpoints, table)
    params = {
        "source.topic": source,
        "sink.topic": sink,
        "sink.table": table,
        "source.dlq_topic": dlq,
        "source.bounded": "true",
        "source.records_per_second": str(RATE),
        "checkpointing.interval": "1s",
    }
    # event time starts now and advances as fast as the source reads, so the watermark lag is real
    produce_events(
        endpoints,
        params["source.topic"],
        EventSpec(count=EVENTS, keys=400, start_ms=int(time.time() * 1000), events_per_ms=RATE // 1000),
    )
    submitted: list[str] = []
    try:
        submitted.append(weir_cluster.submit("examples/keyed_aggregation.py", params, parallelism=3))
        out = tmp_path_factory.mktemp("ui-loop")
        submitted.append(
            weir_cluster.submit(
                LOOP_JOB,
                {"output": str(out / "loop"), "restart.strategy": "fixed-delay", "restart.delay": "1s"},
                parallelism=1,
            )
        )
        ui = Ui(base_url, *submitted)
        poll(
            "a completed checkpoint of the keyed job, in the REST API",
            90,
            lambda: (c := _answers(ui, f"jobs/{ui.keyed}/checkpoints")) and c["counts"]["completed"] >= 2 or None,
        )
        poll(
            "an exception of the failing job, in the REST API",
            90,
            lambda: (e := _answers(ui, f"jobs/{ui.loop}/exceptions")) and e["exceptionHistory"]["entries"] or None,
        )
        yield ui
    finally:
        for job_id in submitted:
            weir_cluster.client.cancel_job(job_id)
        for job_id in submitted:
            status = weir_cluster.wait_for(job_id, ("CANCELED",), timeout_s=60)
            assert status.summary.status in ("CANCELED", "FINISHED"), status


def only_local(browser: BrowserPage, ui: Ui) -> None:
    foreign = [url for url in browser.requests if not (url.startswith(ui.base_url) or url.startswith("data:"))]
    assert foreign == [], f"the UI asked for something else than the JobManager: {foreign}"
    assert browser.page_errors == [], browser.page_errors
    assert browser.console_errors == [], browser.console_errors


def test_overview_lists_the_running_job(browser: BrowserPage, ui: Ui, screenshots: Screenshots) -> None:
    page = browser.page
    page.goto(ui.base_url)
    row = page.locator(f'[data-testid="job-row"][data-job-id="{flink_job_id(ui.keyed)}"]')  # Flink's JobID
    expect(row).to_contain_text("RUNNING")
    expect(page.get_by_test_id("overview-taskmanagers")).to_contain_text("3")
    expect(page.get_by_test_id("taskmanager-row")).to_have_count(3)
    expect(page.get_by_test_id("refresh-indicator")).to_have_attribute("data-state", "ok")
    screenshots.take(page, "ui-overview")
    only_local(browser, ui)


def test_job_graph_renders_with_live_counts(browser: BrowserPage, ui: Ui, screenshots: Screenshots) -> None:
    plan = ui.get(f"jobs/{ui.keyed}/plan")["plan"]
    edges = [(i["id"], n["id"], i["ship_strategy"]) for n in plan["nodes"] for i in n["inputs"]]
    assert any(strategy == "HASH" for _, _, strategy in edges), edges
    page = browser.page
    page.goto(f"{ui.base_url}#/jobs/{ui.keyed}")
    expect(page.get_by_test_id("graph-node")).to_have_count(len(plan["nodes"]))
    expect(page.get_by_test_id("graph-edge")).to_have_count(len(edges))
    for producer, consumer, strategy in edges:
        edge = page.locator(f'[data-testid="graph-edge"][data-source="{producer}"][data-target="{consumer}"]')
        expect(edge).to_have_attribute("data-ship-strategy", strategy)
    keyed = next(n for n in plan["nodes"] if any(i["ship_strategy"] == "HASH" for i in n["inputs"]))
    node = page.locator(f'[data-testid="graph-node"][data-vertex-id="{keyed["id"]}"]')
    expect(node.get_by_test_id("node-parallelism")).to_have_text("P=3")
    # live: a count above zero and, from the second poll on, a rate
    expect(node.get_by_test_id("node-records-in")).to_have_text(
        re.compile(r"^[1-9][\d,]*\s+·\s+\d[\d.]*k?/s$"), timeout=20_000
    )
    expect(node.get_by_test_id("node-ratios")).to_have_text(re.compile(r"^\d+% / \d+%$"), timeout=20_000)
    expect(node).to_have_attribute("data-backpressure", re.compile("^(ok|low|high)$"))
    expect(page.get_by_test_id("subtask-table")).to_have_count(len(plan["nodes"]))
    table = page.locator(f'[data-testid="subtask-table"][data-vertex-id="{keyed["id"]}"]')
    expect(table.get_by_test_id("subtask-row")).to_have_count(3)
    lag = table.get_by_test_id("subtask-watermark-lag").first
    try:
        expect(lag).to_have_text(re.compile(r"\d"), timeout=20_000)
    except AssertionError as error:
        vertex = next(v for v in ui.get(f"jobs/{ui.keyed}")["vertices"] if v["id"] == keyed["id"])
        seen = [(s["subtask"], s["watermark"], s["watermark_lag"]) for s in vertex["subtasks"]]
        raise AssertionError(f"no watermark lag shown; the API answers (subtask, watermark, lag) {seen}") from error
    screenshots.take(page, "ui-job-graph")
    only_local(browser, ui)


def test_checkpoints_list_and_one_timeline(browser: BrowserPage, ui: Ui, screenshots: Screenshots) -> None:
    page = browser.page
    page.goto(f"{ui.base_url}#/jobs/{ui.keyed}/checkpoints")
    completed = page.locator('[data-testid="checkpoint-row"][data-status="COMPLETED"]')
    expect(completed.first).to_be_visible()
    expect(page.get_by_test_id("count-completed")).not_to_contain_text(re.compile(r"^0"))
    expect(page.get_by_test_id("latest-completed")).to_contain_text("#")
    screenshots.take(page, "ui-checkpoints")

    checkpoint_id = completed.first.get_attribute("data-checkpoint-id")
    details = ui.get(f"jobs/{ui.keyed}/checkpoints/details/{checkpoint_id}")
    # the list is drawn again on every poll: click this checkpoint's row, whatever its place by now
    row = page.locator(f'[data-testid="checkpoint-row"][data-checkpoint-id="{checkpoint_id}"]')
    row.get_by_test_id("checkpoint-link").click()
    expect(page).to_have_url(re.compile(f"#/jobs/{flink_job_id(ui.keyed)}/checkpoints/{checkpoint_id}$"))
    expect(page.get_by_test_id("timeline-row")).to_have_count(len(details["subtasks"]))
    expect(page.get_by_test_id("timeline-group")).to_have_count(len({s["vertex_id"] for s in details["subtasks"]}))
    segments = page.locator('[data-testid="timeline-segment"]')
    expect(segments.first).to_be_visible()
    widths = segments.evaluate_all("els => els.map(e => e.getBBox().width)")
    assert len(widths) >= len(details["subtasks"]) and all(w >= 1 for w in widths), widths
    recorded = [s for s in details["subtasks"] if s["timeline"] is not None]
    expect(page.locator('[data-testid="timeline-row"][data-source="timeline"]')).to_have_count(len(recorded))
    barriers = [c for s in recorded for c in s["timeline"]["channels"] if c["barrier_timestamp"] is not None]
    ticks = page.get_by_test_id("timeline-channel-tick")
    expect(ticks).to_have_count(len(barriers))
    screenshots.take(page, "ui-checkpoint-timeline")  # before the hover: no tooltip over the bars
    if barriers:
        # the last tick drawn: barriers a few ms apart draw overlapping ticks, and a later one covers an
        # earlier one's pointer events (make test saw the first tick covered for 30 s)
        ticks.last.hover()
        expect(page.get_by_test_id("tooltip")).to_contain_text("barrier on channel")
    only_local(browser, ui)


def test_exceptions_of_a_failing_job(browser: BrowserPage, ui: Ui, screenshots: Screenshots) -> None:
    page = browser.page
    page.goto(f"{ui.base_url}#/jobs/{ui.loop}/exceptions")
    rows = page.get_by_test_id("exception-row")
    expect(rows.first).to_contain_text("InducedFailure")
    expect(rows.first).to_contain_text("USER")
    expect(rows.first).to_contain_text("induced failure at record")
    screenshots.take(page, "ui-exceptions", full_page=False)  # the list grows by one every ~3 s
    only_local(browser, ui)


def test_taskmanagers_show_their_tasks(browser: BrowserPage, ui: Ui) -> None:
    page = browser.page
    page.goto(f"{ui.base_url}#/taskmanagers")
    expect(page.get_by_test_id("taskmanager")).to_have_count(3)
    tasks = page.get_by_test_id("taskmanager-task")
    expect(tasks.first).to_be_visible()
    assert tasks.count() >= 3 + 1  # the keyed job's subtasks (chained or not) and the loop's
    only_local(browser, ui)
