"""The state benchmark's results as files: ``state.json`` (everything measured), ``state.md`` (tables and
the targets as pass/miss) and ``state.png`` (the curves over state size, the targets as lines)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

TARGET_KEYS: Final = 1_000_000
TARGET_INCREMENTAL_S: Final = 1.0
TARGET_RESTORE_S: Final = 5.0  # at another parallelism (2 -> 1)
TARGET_SAME_RESTORE_S: Final = ((1_000_000, 1.0), (5_000_000, 3.0))  # keys, seconds: same parallelism (1 -> 1)
TARGET_AFTER_RESTORE_SHARE: Final = 0.01  # of the state an unchanged checkpoint after a restore uploads
TARGET_AFTER_RESTORE_KEYS: Final = (1_000_000, 5_000_000)  # the sizes that share is checked at
INCREMENTAL: Final = "incremental 1%"
AFTER_RESTORE: Final = "unchanged after restore 1->1"
RESTORE_CURVES: Final = (
    ("1->1", "same parallelism (1 -> 1)"),
    ("2->1", "2 -> 1 (two handles merged)"),
    ("1->2", "1 -> 2 (half the range, slower subtask)"),
    ("2->3", "2 -> 3 (subtask 1: part of each handle)"),
)


def write(document: dict[str, Any], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    document["targets"] = targets(document)
    _atomic_write(directory / "state.json", json.dumps(document, indent=2, default=str) + "\n")
    _atomic_write(directory / "state.md", markdown(document))
    chart(document, directory / "state.png")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


# Reading the figures -------------------------------------------------------------------------------


def checkpoint(size: dict[str, Any], label: str) -> dict[str, Any] | None:
    """The (first) checkpoint of that label in one size's figures."""
    return next((c for c in size["checkpoints"] if c["label"] == label), None)


def restore_s(size: dict[str, Any], label: str) -> float | None:
    """The restore time of that kind; of its slowest subtask when several restored (1 -> 2)."""
    times = [r["usage"]["wall_s"] for r in size["restores"] if r["label"] == label]
    return max(times) if times else None


def restore_cpu_s(size: dict[str, Any], label: str) -> float | None:
    """The CPU seconds of the restore ``restore_s`` reports."""
    found = [r["usage"] for r in size["restores"] if r["label"] == label]
    return max(found, key=lambda u: u["wall_s"])["cpu_s"] if found else None


def _size(document: dict[str, Any], keys: int) -> dict[str, Any] | None:
    return next((s for s in document.get("sizes", []) if s["keys"] == keys), None)


def targets(document: dict[str, Any]) -> list[dict[str, Any]]:
    size = _size(document, TARGET_KEYS)
    incremental = checkpoint(size, INCREMENTAL) if size else None
    found = [
        _target(
            "incremental checkpoint (1 % of the keys changed) of 1M keys",
            f"< {TARGET_INCREMENTAL_S:.0f} s",
            incremental["usage"]["wall_s"] if incremental else None,
            TARGET_INCREMENTAL_S,
        ),
    ]
    for keys, limit in TARGET_SAME_RESTORE_S:
        at = _size(document, keys)
        found.append(
            _target(
                f"restore of {_keys_label(keys)} keys, same parallelism (1 -> 1)",
                f"< {limit:g} s",
                restore_s(at, "1->1") if at else None,
                limit,
            )
        )
    found.append(
        _target(
            "restore of 1M keys, changed parallelism (2 -> 1)",
            f"< {TARGET_RESTORE_S:.0f} s",
            restore_s(size, "2->1") if size else None,
            TARGET_RESTORE_S,
        )
    )
    for keys in TARGET_AFTER_RESTORE_KEYS:
        at = _size(document, keys)
        after = checkpoint(at, AFTER_RESTORE) if at else None
        found.append(
            _target(
                f"first checkpoint after the 1 -> 1 restore of {_keys_label(keys)} keys, unchanged: "
                "share of the state uploaded",
                f"< {TARGET_AFTER_RESTORE_SHARE:.0%}",
                after["uploaded_bytes"] / after["size_bytes"] if after and after["size_bytes"] else None,
                TARGET_AFTER_RESTORE_SHARE,
                unit="",
            )
        )
    return found


def _target(name: str, goal: str, value: float | None, limit: float, unit: str = "s") -> dict[str, Any]:
    if value is None:
        return {"target": name, "goal": goal, "value": None, "unit": unit, "result": "not measured"}
    return {"target": name, "goal": goal, "value": value, "unit": unit, "result": "pass" if value < limit else "miss"}


# Markdown ------------------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:.1f}"


def _checkpoint_cell(c: dict[str, Any] | None) -> str:
    return "-" if c is None else f"{c['usage']['wall_s']:.2f} s / {c['uploaded_bytes'] / 1e6:.1f} MB"


def markdown(document: dict[str, Any]) -> str:
    host, git = document["host"], document["git"]
    updates = document["layout"]["updates"]
    sizes = document.get("sizes", [])
    incremental_labels = [f"incremental {u:.0%}" for u in updates]
    lines = [
        f"# State benchmark: checkpoints and restores over state size ({'quick' if document['quick'] else 'full'} "
        f"run {document['run_id']})",
        "",
        f"Measured {document['measured_at']} on {host['cpus']} CPUs ({host.get('cpu_model') or 'unknown model'}, "
        f"{host['memory_bytes'] / 2**30:.0f} GiB), Python {host['python']}, rocksdict {host['rocksdict']}; "
        f"commit {(git.get('commit') or 'unknown')[:12]}{' (uncommitted changes)' if git.get('dirty') else ''}; "
        f"checkpoint storage {document['storage']}; load average at start "
        f"{_load(document.get('load_average_at_start'))}, at end {_load(document.get('load_average_at_end'))}.",
        "",
        f"Keys of {document['layout']['key_bytes']} bytes with {document['layout']['value_bytes']}-byte values over "
        f"{document['layout']['max_parallelism']} key groups, written by one subtask through a `KeyedStateStore`; "
        "the TaskManager's snapshot code (`TaskKeyedState`) without a cluster. Wall seconds; CPU seconds of the "
        "benchmark's process (all threads) in the last column and in the tables below. Definitions: "
        "docs/benchmarks.md.",
        "",
        "| keys | SST MB | first checkpoint | "
        + " | ".join(incremental_labels)
        + " | restore 1->1 | restore 2->1 | restore 1->2 (slower subtask) | restore 2->3 (subtask 1) | CPU s |",
        "| ---: | ---: | ---: | " + " | ".join("---:" for _ in updates) + " | ---: | ---: | ---: | ---: | ---: |",
    ]
    for size in sizes:
        cells = [
            f"{size['keys']:,}",
            _mb(size["live_sst_bytes"]),
            _checkpoint_cell(checkpoint(size, "first")),
            *(_checkpoint_cell(checkpoint(size, label)) for label in incremental_labels),
            *(f"{_s(restore_s(size, label))} s" for label, _ in RESTORE_CURVES),
            f"{size['total']['cpu_s']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if sizes:
        loads = ", ".join(f"{s['keys']:,} keys {s['load_average_at_start'][0]:.2f}" for s in sizes)
        lines += [f"Load average (1 min) when each size started: {loads}.", ""]
    for keys, error in document.get("errors", {}).items():
        lines += [f"**{int(keys):,} keys failed:** {error}", ""]

    lines += [
        "## Targets",
        "",
        "| target | goal | measured | result |",
        "| --- | --- | ---: | --- |",
    ]
    for t in document.get("targets") or targets(document):
        unit = t.get("unit", "s")
        value = _s(t["value"]) + " s" if unit == "s" else ("-" if t["value"] is None else f"{t['value']:.1%}")
        lines.append(f"| {t['target']} | {t['goal']} | {value} | {t['result']} |")
    lines += [""]

    lines += [
        "## Checkpoints",
        "",
        "Sync: the store's cache flush and the snapshot's synchronous part (memtable flush, RocksDB checkpoint) "
        "on the task thread; async: waiting for the uploads; total: from the cache flush until every file is in "
        "the storage. Uploaded: what this snapshot uploaded; handle: everything it references (reused files "
        "were uploaded by an earlier completed checkpoint).",
        "",
        "| keys | checkpoint | subtask | keys changed | sync s | async s | total s | CPU s | S3 server CPU s "
        "| uploaded MB (files) | handle MB (files, reused) |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for size in sizes:
        for c in size["checkpoints"]:
            lines.append(
                f"| {size['keys']:,} | {c['checkpoint_id']}: {c['label']} | {c['subtask']} | {c['changed_keys']:,} "
                f"| {c['sync_s']:.3f} | {c['async_s']:.2f} | {c['usage']['wall_s']:.2f} | {c['usage']['cpu_s']:.2f} "
                f"| {_s(c['usage']['s3_cpu_s'])} | {_mb(c['uploaded_bytes'])} ({c['uploaded_files']}) "
                f"| {_mb(c['size_bytes'])} ({c['files']}, {c['reused_files']}) |"
            )
    lines += [
        "",
        "## Restores",
        "",
        "Each into a fresh database, as a redeployed subtask: download the handles' files, open the snapshot the "
        "subtask owns the largest share of (at least half) as its database and range-delete the key groups it "
        "does not own (adopted), copy the overlapping key groups of the others entry by entry (copied). Entries: "
        "in the subtask's key groups after the restore, checked against the keys written into them. "
        f"Each kind ran {document['layout'].get('restore_repeats', 1)} times (a fresh database each); the figures "
        "are the median run's.",
        "",
        "| keys | restore | subtask (key groups) | handles | adopted | entries | copied | downloaded MB | s (median) "
        "| CPU s | S3 server CPU s | every repeat, s |",
        "| ---: | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for size in sizes:
        for r in size["restores"]:
            first, last = r["key_groups"]
            lines.append(
                f"| {size['keys']:,} | {r['label']} | {r['subtask']} ({first}..{last}) | {r['handles_used']} "
                f"| {'yes' if r.get('adopted') else 'no'} | {r['entries']:,} "
                f"| {r.get('copied_entries', r['entries']):,} "
                f"| {_mb(r['downloaded_bytes'])} | {r['usage']['wall_s']:.2f} "
                f"| {r['usage']['cpu_s']:.2f} | {_s(r['usage']['s3_cpu_s'])} "
                f"| {' / '.join(_s(u['wall_s']) for u in r['samples'])} |"
            )
    lines += [""]
    writes = ", ".join(
        f"{s['keys']:,} in {s['write']['wall_s']:.1f} s (CPU {s['write']['cpu_s']:.1f} s)" for s in sizes
    )
    if writes:
        lines += [f"Writing the keys (not measured against a target): {writes}.", ""]
    return "\n".join(lines)


def _load(value: Any) -> str:
    return "-" if not value else " / ".join(f"{v:.2f}" for v in value)


# Chart -------------------------------------------------------------------------------------------


def chart(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    sizes = sorted(document.get("sizes", []), key=lambda s: s["keys"])
    keys = [s["keys"] for s in sizes]
    labels = ["first", *(f"incremental {u:.0%}" for u in document["layout"]["updates"])]
    fig, (duration, volume, restore) = plt.subplots(1, 3, figsize=(15, 4.8))

    def series(values: list[float | None]) -> tuple[list[int], list[float]]:
        pairs = [(k, v) for k, v in zip(keys, values, strict=True) if v is not None]
        return [k for k, _ in pairs], [v for _, v in pairs]

    for label in labels:
        found = [checkpoint(s, label) for s in sizes]
        duration.plot(*series([c["usage"]["wall_s"] if c else None for c in found]), marker="o", label=label)
        volume.plot(*series([c["uploaded_bytes"] / 1e6 if c else None for c in found]), marker="o", label=label)
    duration.axhline(TARGET_INCREMENTAL_S, color="#c0392b", linestyle="--", linewidth=1)
    duration.plot(
        [TARGET_KEYS],
        [TARGET_INCREMENTAL_S],
        marker="x",
        color="#c0392b",
        linestyle="none",
        label=f"target: incremental of 1M keys < {TARGET_INCREMENTAL_S:.0f} s",
    )
    duration.set_title("Checkpoint duration")
    duration.set_ylabel("s (wall, flush to last upload)")
    volume.set_title("Checkpoint size (uploaded)")
    volume.set_ylabel("MB uploaded")
    for label, name in RESTORE_CURVES:
        (line,) = restore.plot(*series([restore_s(s, label) for s in sizes]), marker="o", label=name)
        cpu = [restore_cpu_s(s, label) for s in sizes]
        restore.plot(*series(cpu), linestyle=":", linewidth=1, color=line.get_color())
    restore.plot(
        [TARGET_KEYS],
        [TARGET_RESTORE_S],
        marker="x",
        color="#c0392b",
        linestyle="none",
        label=f"target: 2 -> 1 restore of 1M keys < {TARGET_RESTORE_S:.0f} s",
    )
    restore.plot(
        [k for k, _ in TARGET_SAME_RESTORE_S],
        [s for _, s in TARGET_SAME_RESTORE_S],
        marker="+",
        color="#c0392b",
        linestyle="--",
        linewidth=1,
        label="targets: 1 -> 1 restore of 1M keys < 1 s, of 5M < 3 s",
    )
    restore.set_title("Restore duration (dotted: CPU s of the same restore)")
    restore.set_ylabel("s (wall)")
    for axis in (duration, volume, restore):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xticks(keys, [_keys_label(k) for k in keys])
        axis.xaxis.set_minor_formatter(FuncFormatter(lambda _v, _p: ""))
        axis.set_xlabel("keys in state")
        axis.grid(True, which="major", alpha=0.3)
        axis.legend(fontsize=7)
    kind = "quick run" if document["quick"] else "full run"
    commit = (document["git"].get("commit") or "")[:10]
    fig.suptitle(
        f"Weir keyed state: checkpoints and restores over state size ({kind} {document['run_id']}, {commit}, "
        f"{document['host']['cpus']} CPUs)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _keys_label(keys: int) -> str:
    return f"{keys / 1e6:g}M" if keys >= 1_000_000 else f"{keys / 1e3:g}k"
