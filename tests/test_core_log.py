"""The structured logger: JSON and text lines, levels, held lines written at once."""

from __future__ import annotations

import io
import json
import re
import threading

import pytest

from plugproxy.core.log import Logger


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_time_level_event_and_fields_in_order():
    out = io.StringIO()
    Logger(out).info("call", method="/csi.v1.Identity/Probe", code="OK", keys=["volume:v1"])
    (line,) = lines(out)
    assert list(line) == ["time", "level", "event", "method", "code", "keys"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", str(line["time"]))
    assert line["level"] == "info" and line["keys"] == ["volume:v1"]


def test_values_json_cannot_hold_natively_still_make_a_line():
    out = io.StringIO()
    logger = Logger(out)
    logger.info("odd", huge=1 << 70, raw=b"\x00", text="ünïcode")
    (line,) = lines(out)
    assert line["huge"] == 1 << 70  # beyond 64 bits: the standard encoder takes over
    assert line["raw"] == "b'\\x00'" and line["text"] == "ünïcode"


def test_levels_below_the_threshold_are_dropped_and_text_format_reads_well():
    out = io.StringIO()
    logger = Logger(out, fmt="text", level="warning")
    logger.info("quiet")
    logger.warning("upstream down", reason="connection refused")
    (text,) = out.getvalue().splitlines()
    assert text.endswith('WARNING upstream down reason="connection refused"')
    assert not logger.enabled("info") and logger.enabled("error")


def test_held_lines_are_written_at_once_on_release_in_order():
    out = CountingStream()
    logger = Logger(out)
    logger.hold()
    logger.hold()  # holds nest
    for i in range(5):
        logger.info("call", n=i)
    logger.release()
    assert out.writes == 0 and out.getvalue() == ""
    logger.release()
    assert out.writes == 1
    assert [line["n"] for line in lines(out)] == [0, 1, 2, 3, 4]
    logger.info("after")
    assert out.writes == 2  # not held any more: written at once


def test_lines_from_other_threads_during_a_hold_are_not_lost():
    out = io.StringIO()
    logger = Logger(out)
    logger.hold()
    worker = threading.Thread(target=lambda: logger.error("stage failed", stage="tracing"))
    worker.start()
    worker.join()
    logger.release()
    assert [line["event"] for line in lines(out)] == ["stage failed"]


def test_a_closed_stream_does_not_raise():
    out = io.StringIO()
    logger = Logger(out)
    out.close()
    logger.info("call")  # a closed stdout must not take calls down
    logger.hold()
    logger.info("call")
    logger.release()


@pytest.mark.parametrize(("fmt", "level"), [("yaml", "info"), ("json", "verbose")])
def test_bad_format_or_level_is_rejected(fmt, level):
    with pytest.raises(ValueError, match="must be"):
        Logger(io.StringIO(), fmt=fmt, level=level)


def test_text_lines_show_non_ascii_as_is_and_never_split():
    out = io.StringIO()
    logger = Logger(out, fmt="text")
    logger.warning(
        "violation",
        section="CSI v1.12 §CreateVolume",
        word="§5",
        fields={"name": "ünïcode §"},
        message="line one\nline two",
    )
    (text,) = out.getvalue().splitlines()
    assert 'section="CSI v1.12 §CreateVolume"' in text
    assert " word=§5 " in text
    assert 'fields={"name":"ünïcode §"}' in text
    assert 'message="line one\\nline two"' in text
    assert "\\u00" not in text


def test_json_lines_keep_non_ascii_as_utf8():
    out = io.StringIO()
    logger = Logger(out)
    logger.info("violation", section="CSI v1.12 §CreateVolume", huge=1 << 70)  # both encoders
    logger.info("violation", section="CSI v1.12 §CreateVolume")
    assert out.getvalue().count("§CreateVolume") == 2 and "\\u00a7" not in out.getvalue()
