"""The web UI in a real headless chromium against a stand-in REST server (harness.py) answering as
the contract does: every page renders its data, a subtask without a timeline is drawn from its
durations, the slowest channel and upload are named, an API error is shown, and the page asks for
nothing but its own server."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.integration.ui.conftest import BrowserPage
from tests.integration.ui.harness import AGG, DLQ, JOB, SRC, serve

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve() as url:
        yield url


def only_local(browser: BrowserPage, base_url: str) -> None:
    foreign = [url for url in browser.requests if not (url.startswith(base_url) or url.startswith("data:"))]
    assert foreign == [], f"the UI asked for something else than its own server: {foreign}"
    assert browser.page_errors == [], browser.page_errors


def test_overview_lists_jobs_and_taskmanagers(browser: BrowserPage, base_url: str) -> None:
    page = browser.page
    page.goto(base_url)
    row = page.locator(f'[data-testid="job-row"][data-job-id="{JOB}"]')
    expect(row).to_contain_text("keyed-aggregation")
    expect(row).to_contain_text("RUNNING")
    expect(page.get_by_test_id("overview-taskmanagers")).to_contain_text("3")
    expect(page.get_by_test_id("overview-slots-total")).to_contain_text("6")
    expect(page.get_by_test_id("overview-slots-free")).to_contain_text("1")
    expect(page.get_by_test_id("taskmanager-row")).to_have_count(3)
    expect(page.get_by_test_id("cluster-name")).to_contain_text("v0.1.0")
    expect(page.get_by_test_id("refresh-indicator")).to_have_attribute("data-state", re.compile("ok|loading"))
    row.get_by_test_id("job-link").click()
    expect(page).to_have_url(re.compile(f"#/jobs/{JOB}$"))
    expect(page.get_by_test_id("job-name")).to_have_text("keyed-aggregation")
    # the job's tasks: its vertices' per-state counts summed (2 + 3 + 1), not Flink's per-vertex status-counts
    expect(page.locator(".fact", has_text="tasks").first).to_contain_text("6 RUNNING")
    only_local(browser, base_url)


def test_job_graph_draws_vertices_edges_and_live_figures(browser: BrowserPage, base_url: str) -> None:
    page = browser.page
    page.goto(f"{base_url}#/jobs/{JOB}")
    nodes = page.get_by_test_id("graph-node")
    expect(nodes).to_have_count(3)
    edges = page.get_by_test_id("graph-edge")
    expect(edges).to_have_count(2)
    expect(page.locator(f'[data-testid="graph-edge"][data-target="{AGG}"]')).to_have_attribute(
        "data-ship-strategy", "HASH"
    )
    expect(page.locator(f'[data-testid="graph-edge"][data-target="{DLQ}"]')).to_contain_text("REBALANCE [malformed]")
    source = page.locator(f'[data-testid="graph-node"][data-vertex-id="{SRC}"]')
    agg = page.locator(f'[data-testid="graph-node"][data-vertex-id="{AGG}"]')
    # backpressure colours: the source is backpressured 62% (high), the aggregation not at all
    expect(source).to_have_attribute("data-backpressure", "high")
    expect(agg).to_have_attribute("data-backpressure", "ok")
    expect(source).to_contain_text("↳ parse")
    expect(agg.get_by_test_id("node-parallelism")).to_have_text("P=3")
    expect(agg.get_by_test_id("node-ratios")).to_have_text("93% / 0%")
    expect(agg.get_by_test_id("node-watermark-lag")).to_have_text("1.70 s")
    # the harness's counts grow with every poll: the second answer gives a rate
    expect(agg.get_by_test_id("node-records-in")).to_contain_text("/s", timeout=10_000)
    tables = page.get_by_test_id("subtask-table")
    expect(tables).to_have_count(3)
    agg_table = page.locator(f'[data-testid="subtask-table"][data-vertex-id="{AGG}"]')
    expect(agg_table.get_by_test_id("subtask-row")).to_have_count(3)
    expect(agg_table.get_by_test_id("subtask-watermark-lag").first).to_have_text("1.50 s")
    expect(page.get_by_test_id("job-failure")).to_contain_text("TaskManagerLost")
    only_local(browser, base_url)


def test_checkpoints_history_and_timeline(browser: BrowserPage, base_url: str) -> None:
    page = browser.page
    page.goto(f"{base_url}#/jobs/{JOB}/checkpoints")
    rows = page.get_by_test_id("checkpoint-row")
    expect(rows).to_have_count(3)
    failed = page.locator('[data-testid="checkpoint-row"][data-checkpoint-id="42"]')
    expect(failed).to_contain_text("FAILED")
    expect(failed).to_contain_text("expired after 10 s")
    expect(page.get_by_test_id("count-completed")).to_contain_text("40")
    expect(page.get_by_test_id("latest-restored")).to_contain_text("#7")
    page.locator('[data-testid="checkpoint-row"][data-checkpoint-id="41"]').click()
    expect(page).to_have_url(re.compile(f"#/jobs/{JOB}/checkpoints/41$"))

    timeline_rows = page.get_by_test_id("timeline-row")
    expect(timeline_rows).to_have_count(6)
    expect(page.get_by_test_id("timeline-group")).to_have_count(3)
    expect(page.get_by_test_id("timeline-legend")).to_contain_text("async upload")
    # the subtask without a timeline is drawn from its durations, and says so
    derived = page.locator('[data-testid="timeline-row"][data-source="durations"]')
    expect(derived).to_have_count(1)
    expect(derived).to_have_attribute("data-subtask", "2")
    expect(derived.get_by_test_id("from-durations")).to_have_text("from durations")
    kinds = derived.locator('[data-testid="timeline-segment"]').evaluate_all("els => els.map(e => e.dataset.kind)")
    assert kinds == ["start_delay", "alignment", "sync", "async", "ack"]  # 13 + 20 + 4 + 50 ms, acked at 92 ms
    # every recorded segment is a bar with a width
    widths = page.locator('[data-testid="timeline-segment"]').evaluate_all("els => els.map(e => e.getBBox().width)")
    assert len(widths) >= 20 and all(w >= 1 for w in widths), widths
    expect(page.get_by_test_id("slowest-channel")).to_contain_text(
        "window-aggregate -> kafka-sink subtask 0, channel 1 from kafka-source -> parse subtask 1"
    )
    expect(page.get_by_test_id("slowest-channel")).to_contain_text("83 ms after the first one")
    expect(page.get_by_test_id("slowest-upload")).to_contain_text("window-aggregate -> kafka-sink subtask 1, 172 ms")
    assert page.locator("[data-testid=checkpoint-timeline] .seg.slowest-upload").count() == 1
    assert page.locator("[data-testid=checkpoint-timeline] .tick.slowest-channel").count() == 1
    # hovering a channel's tick names the channel, its upstream subtask and the offset
    agg0 = page.locator(f'[data-testid="timeline-row"][data-vertex-id="{AGG}"][data-subtask="0"]')
    agg0.locator('[data-testid="timeline-channel-tick"][data-channel="1"]').hover()
    tooltip = page.get_by_test_id("tooltip")
    expect(tooltip).to_be_visible()
    expect(tooltip).to_contain_text("channel 1 from kafka-source -> parse subtask 1")
    expect(tooltip).to_contain_text("+95 ms after the trigger")
    only_local(browser, base_url)


def test_exceptions_and_taskmanagers(browser: BrowserPage, base_url: str) -> None:
    page = browser.page
    page.goto(f"{base_url}#/jobs/{JOB}/exceptions")
    rows = page.get_by_test_id("exception-row")
    expect(rows).to_have_count(2)
    expect(rows.nth(1)).to_contain_text("ValueError")
    expect(rows.nth(1)).to_contain_text("USER")
    expect(rows.nth(1)).to_contain_text("kafka-source -> parse")
    expect(rows.nth(0)).to_contain_text("tm-3")
    page.get_by_test_id("nav-taskmanagers").click()
    sections = page.get_by_test_id("taskmanager")
    expect(sections).to_have_count(3)
    expect(sections.first.get_by_test_id("taskmanager-task")).to_contain_text("window-aggregate -> kafka-sink")
    only_local(browser, base_url)


def test_an_api_error_is_shown(browser: BrowserPage, base_url: str) -> None:
    page = browser.page
    page.goto(f"{base_url}#/jobs/0000/checkpoints")
    banner = page.get_by_test_id("api-error")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("HTTP 404")
    expect(banner).to_contain_text("job 0000 not found")
    expect(page.get_by_test_id("refresh-indicator")).to_have_attribute("data-state", "error")
    page.goto(f"{base_url}#/jobs/{JOB}/checkpoints/999")
    expect(banner).to_contain_text("checkpoint 999")
    page.goto(f"{base_url}#/")
    expect(banner).to_be_hidden()
    expect(page.get_by_test_id("job-row")).to_have_count(1)
    assert browser.page_errors == []


def test_a_cluster_with_a_token_asks_for_it_and_the_page_then_loads(browser: BrowserPage) -> None:
    with serve(token="s3cret") as url:
        page = browser.page
        page.goto(url)
        banner = page.get_by_test_id("api-error")
        expect(banner).to_contain_text("HTTP 401")
        expect(page.get_by_test_id("refresh-indicator")).to_have_attribute("data-state", "error")
        page.get_by_test_id("token-input").fill("wrong")
        page.get_by_test_id("token-submit").click()
        expect(banner).to_contain_text("That token was refused")
        page.get_by_test_id("token-input").fill("s3cret")
        page.get_by_test_id("token-submit").click()
        expect(page.get_by_test_id("job-row")).to_have_count(1)
        expect(banner).to_be_hidden()
        page.reload()  # the token is kept for the tab
        expect(page.get_by_test_id("job-row")).to_have_count(1)
        expect(page.get_by_test_id("refresh-indicator")).to_have_attribute("data-state", re.compile("ok|loading"))
