"""The timeline file (writer, reader) and ``python -m scrapy_hostqueue plot``."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from scrapy_hostqueue.__main__ import main as cli
from scrapy_hostqueue._plot import load
from scrapy_hostqueue._timeline import (
    OTHER_HOSTS,
    HostSample,
    TimelineError,
    TimelineWriter,
    build_series,
    read_timeline,
)


def write_sample_timeline(path: Path, intervals: int = 5) -> None:
    writer = TimelineWriter(str(path), max_hosts=2)
    for step in range(1, intervals + 1):
        samples = [
            HostSample("fast.test", in_flight=4, queued=10, limit=4),
            HostSample("slow.test", in_flight=2, queued=3, limit=2, blocked_for=1.5),
            HostSample("idle.test", in_flight=0, queued=1, limit=1),
        ]
        writer.write(step * 0.5, 0.5, samples, {"fast.test": 20, "slow.test": 1, "gone.test": 3})
    writer.close()


def test_writer_rows(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_sample_timeline(path, intervals=2)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[:3] == [
        {
            "t": 0.5,
            "dt": 0.5,
            "host": "fast.test",
            "in_flight": 4,
            "overdue": 0,
            "fetched": 20,
            "failed": 0,
            "queued": 10,
            "limit": 4,
            "blocked": False,
        },
        {
            "t": 0.5,
            "dt": 0.5,
            "host": "slow.test",
            "in_flight": 2,
            "overdue": 0,
            "fetched": 1,
            "failed": 0,
            "queued": 3,
            "limit": 2,
            "blocked": True,
        },
        {
            # idle.test and gone.test (finished, not sampled) add up here.
            "t": 0.5,
            "dt": 0.5,
            "host": OTHER_HOSTS,
            "in_flight": 0,
            "overdue": 0,
            "fetched": 3,
            "failed": 0,
            "queued": 1,
            "limit": None,
            "blocked": False,
            "hosts": 2,
            "blocked_hosts": 0,
        },
    ]
    assert len(rows) == 6
    assert read_timeline(str(path)) == rows


def test_writer_keeps_each_interval_bounded(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    writer = TimelineWriter(str(path), max_hosts=50)
    samples = [
        HostSample(f"h{i}.test", in_flight=i % 3, queued=i % 5, limit=3, blocked_for=i % 2)
        for i in range(100_000)
    ]
    fetched = {f"h{i}.test": 1 for i in range(0, 100_000, 7)}
    writer.write(1.0, 1.0, samples, fetched)
    writer.close()
    rows = read_timeline(str(path))
    assert len(rows) == 51
    other = rows[-1]
    assert other["host"] == OTHER_HOSTS
    assert other["hosts"] == 100_000 - 50
    # Totals are kept exactly.
    assert sum(row["in_flight"] for row in rows) == sum(s.in_flight for s in samples)
    assert sum(row["fetched"] for row in rows) == len(fetched)
    assert sum(row["queued"] for row in rows) == sum(s.queued for s in samples)
    # The named rows are the busiest.
    assert min(row["in_flight"] + row["fetched"] for row in rows[:-1]) == 3


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "no timeline rows"),
        ("not json\n", "line 1: not JSON"),
        ("[1, 2]\n", "line 1: expected a JSON object"),
        ('{"t": 1}\n', "line 1: missing dt, host"),
        (
            '{"t": 1, "dt": 1, "host": "a", "in_flight": -1, "fetched": 0, "queued": 0,'
            ' "limit": 1, "blocked": false}\n',
            "in_flight must be a number >= 0",
        ),
        (
            '{"t": 1, "dt": 1, "host": 3, "in_flight": 1, "fetched": 0, "queued": 0,'
            ' "limit": 1, "blocked": false}\n',
            "host must be a string",
        ),
    ],
)
def test_reader_rejects_bad_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TimelineError, match=message):
        read_timeline(str(path))


def test_reader_rejects_missing_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(TimelineError, match="cannot read"):
        read_timeline(str(tmp_path / "missing.jsonl"))
    binary = tmp_path / "binary.png"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(TimelineError):
        read_timeline(str(binary))


def test_a_host_that_only_fails_is_named_with_its_failures(tmp_path: Path) -> None:
    # A dead host answers nothing: in flight 0, no responses. Its failures
    # make it one of the busiest, ahead of a host idle with work queued.
    path = tmp_path / "t.jsonl"
    writer = TimelineWriter(str(path), max_hosts=2)
    samples = [
        HostSample("fast.test", in_flight=4, queued=10, limit=4),
        HostSample("idle.test", in_flight=0, queued=5, limit=2),
    ]
    # dead.test was given up meanwhile: no longer sampled, still written.
    writer.write(1.0, 1.0, samples, {"fast.test": 20}, {"dead.test": 6, "idle.test": 0})
    writer.close()
    rows = {row["host"]: row for row in read_timeline(str(path))}
    assert set(rows) == {"fast.test", "dead.test", OTHER_HOSTS}
    assert (rows["dead.test"]["failed"], rows["dead.test"]["fetched"]) == (6, 0)
    assert rows["fast.test"]["failed"] == 0
    assert (rows[OTHER_HOSTS]["hosts"], rows[OTHER_HOSTS]["failed"]) == (1, 0)


def test_files_written_before_failures_were_counted_still_plot(tmp_path: Path) -> None:
    path, out = tmp_path / "old.jsonl", tmp_path / "chart.html"
    row = {"dt": 1.0, "host": "a", "in_flight": 1, "fetched": 3, "queued": 0}
    row.update(limit=2, blocked=False)
    path.write_text("".join(json.dumps(dict(row, t=t)) + "\n" for t in (1.0, 2.0)))
    assert [r["failed"] for r in read_timeline(str(path))] == [0, 0]
    assert cli(["plot", str(path), "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8").count("<svg") == 2


def test_failures_get_a_panel_of_their_own(tmp_path: Path) -> None:
    source, out = tmp_path / "t.jsonl", tmp_path / "chart.html"
    writer = TimelineWriter(str(source), max_hosts=5)
    for t in (1.0, 2.0, 3.0):
        writer.write(t, 1.0, [HostSample("up.test", 2, 5, 2)], {"up.test": 8}, {"down.test": 4})
    writer.close()
    series = load(str(source))
    assert series.failed["down.test"] == [4.0, 4.0, 4.0]
    assert series.rate["down.test"] == [0.0, 0.0, 0.0]
    assert series.failed["up.test"] == [0.0, 0.0, 0.0]
    assert cli(["plot", str(source), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert page.count("<svg") == 3
    assert "failed downloads / s" in page


def test_failures_panel_in_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from PIL import Image  # matplotlib needs Pillow

    source, out = tmp_path / "t.jsonl", tmp_path / "chart.png"
    writer = TimelineWriter(str(source), max_hosts=5)
    for t in (1.0, 2.0):
        writer.write(t, 1.0, [HostSample("up.test", 2, 5, 2)], {"up.test": 8}, {"down.test": 4})
    writer.close()
    assert cli(["plot", str(source), "-o", str(out)]) == 0
    with Image.open(out) as image:
        three = image.size
    write_sample_timeline(source)
    assert cli(["plot", str(source), "-o", str(out)]) == 0
    with Image.open(out) as image:
        two = image.size
    # One panel more: the figure is half as tall again.
    assert three[1] == pytest.approx(two[1] * 1.5, rel=0.02)


def test_series_groups_small_hosts() -> None:
    rows = [
        {"t": t, "dt": 1.0, "host": host, "in_flight": n, "fetched": 2 * n, "queued": 0}
        for t in (1.0, 2.0)
        for host, n in (("a", 5), ("b", 3), ("c", 1), (OTHER_HOSTS, 2))
    ]
    series = build_series(rows, max_lines=2)
    assert series.times == [1.0, 2.0]
    assert list(series.in_flight) == ["a", "b", OTHER_HOSTS]
    assert series.in_flight[OTHER_HOSTS] == [3.0, 3.0]
    assert series.rate["a"] == [10.0, 10.0]


@pytest.mark.parametrize("last_interval", [0.1, 0.3, 0.7])
def test_each_rate_stair_has_its_intervals_responses_as_area(
    tmp_path: Path, last_interval: float
) -> None:
    """Each rate stair has its interval's responses as its area.

    The last interval, cut short when the spider closed, was drawn at its
    responses over a whole interval, so the chart showed too few of them.
    """
    writer = TimelineWriter(str(tmp_path / "t.jsonl"), max_hosts=5)
    fetched = [{"a.test": 10, "b.test": 4}, {"a.test": 10}, {"a.test": 6, "c.test": 2}]
    ends = [1.0, 2.0, 2.0 + last_interval]
    for i, (t, counts) in enumerate(zip(ends, fetched, strict=True)):
        dt = t - (ends[i - 1] if i else 0.0)
        samples = [HostSample(host, 1, 0, 4) for host in counts]
        writer.write(t, dt, samples, counts)
    writer.close()
    series = load(str(tmp_path / "t.jsonl"))
    edges = [series.start, *series.times]
    widths = [end - start for start, end in itertools.pairwise(edges)]
    for host in ("a.test", "b.test", "c.test"):
        area = sum(rate * width for rate, width in zip(series.rate[host], widths, strict=True))
        assert area == pytest.approx(sum(counts.get(host, 0) for counts in fetched)), host
    # No spike: the last stair is no steeper than the rate over the whole crawl.
    assert series.rate["a.test"][-1] <= 26 / ends[-1] * 1.5
    # In flight at the end is what was sampled at the end.
    assert series.in_flight["b.test"][-1] == 0
    assert series.in_flight["a.test"][-1] == 1


def test_plot_html_is_self_contained(tmp_path: Path) -> None:
    source, out = tmp_path / "t.jsonl", tmp_path / "chart.html"
    write_sample_timeline(source)
    assert cli(["plot", str(source), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<svg") == 2
    assert "fast.test" in page
    assert "slow.test" in page
    for needle in ("<script", "<link", "src=", "@import"):
        assert needle not in page
    for svg in re.findall(r"<svg.*?</svg>", page, re.DOTALL):
        root = ElementTree.fromstring(svg)  # well-formed
        assert len(root.findall("{http://www.w3.org/2000/svg}polyline")) == 3


def test_plot_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    source, out = tmp_path / "t.jsonl", tmp_path / "chart.png"
    write_sample_timeline(source)
    assert cli(["plot", str(source), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_png_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = tmp_path / "t.jsonl", tmp_path / "chart.png"
    write_sample_timeline(source)
    # A None entry makes the import fail as if the package were not installed.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    assert cli(["plot", str(source), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "pip install 'scrapy-hostqueue[plot]'" in err
    assert not out.exists()


@pytest.mark.parametrize("content", [None, "garbage\n", ""])
def test_plot_bad_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None
) -> None:
    source = tmp_path / "t.jsonl"
    if content is not None:
        source.write_text(content)
    assert cli(["plot", str(source), "-o", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert err.count("\n") == 1
    assert not (tmp_path / "x.html").exists()


def test_plot_unwritable_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "t.jsonl"
    write_sample_timeline(source)
    assert cli(["plot", str(source), "-o", str(tmp_path / "missing" / "x.html")]) == 1
    assert capsys.readouterr().err.startswith("error: cannot write")


def test_module_entry_point(tmp_path: Path) -> None:
    source = tmp_path / "t.jsonl"
    source.write_text("{}\n")
    result = subprocess.run(
        [sys.executable, "-m", "scrapy_hostqueue", "plot", str(source), "-o", "x.html"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: ")
    assert "missing" in result.stderr


@pytest.mark.parametrize("name", ["chart.jpgx", "chart", "", "outdir"])
def test_plot_output_names_other_than_png_or_html_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """Plot output names other than PNG or HTML are one-line errors.

    matplotlib picked a format from other names (a traceback for unknown
    ones), or added .png to a name without one, and "wrote" named a file
    that was not written.
    """
    source = tmp_path / "t.jsonl"
    write_sample_timeline(source)
    (tmp_path / "outdir").mkdir()
    before = set(tmp_path.iterdir())
    assert cli(["plot", str(source), "-o", str(tmp_path / name) if name else ""]) == 1
    out, err = capsys.readouterr()
    assert err.startswith("error: ")
    assert err.count("\n") == 1
    assert "wrote" not in out
    assert set(tmp_path.iterdir()) == before


def test_overdue_requests_are_written_per_host_and_added_up(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    writer = TimelineWriter(str(path), max_hosts=1)
    writer.write(
        1.0,
        1.0,
        [
            HostSample("hangs.test", 3, 5, 4, overdue=2),
            HostSample("a.test", 1, 0, 4, overdue=1),
            HostSample("b.test", 1, 0, 4),
        ],
        {},
    )
    writer.close()
    rows = read_timeline(str(path))
    assert [(row["host"], row["overdue"]) for row in rows] == [("hangs.test", 2), (OTHER_HOSTS, 1)]
