"""The rules' memory helpers (rules/memory.py): the bounded, expiring map the consistency
family keeps its state in, driven by a clock the test moves."""

from __future__ import annotations

from collections import OrderedDict

import pytest

from plugproxy.core.memory import ExpiringMap, ago, map_digest, remember


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def made(maxsize: int = 3, ttl: float = 10.0) -> tuple[ExpiringMap[str, int], Clock]:
    clock = Clock()
    return ExpiringMap(maxsize, ttl, clock), clock


def test_an_entry_lives_ttl_seconds_after_it_was_set():
    m, clock = made()
    m["a"] = 1
    clock.now += 9.999
    assert m.get("a") == 1 and m["a"] == 1 and "a" in m and len(m) == 1
    clock.now += 0.001  # set at 100, ttl 10: gone at 110 exactly
    assert m.get("a") is None and m.get("a", 7) == 7 and "a" not in m
    with pytest.raises(KeyError):
        m["a"]
    assert len(m) == 0 and not m and list(m) == []


def test_a_set_refreshes_and_a_read_does_not():
    m, clock = made()
    m["a"] = 1
    clock.now += 6
    assert m.get("a") == 1 and "a" in m  # reads: the entry still ends at 110
    m["b"] = 2
    clock.now += 4
    assert "a" not in m and m.get("b") == 2
    m["b"] = 3  # set again at 110: lives until 120, with its new value
    clock.now += 9
    assert m["b"] == 3
    clock.now += 1
    assert "b" not in m


def test_touch_reads_and_refreshes_in_one_step():
    m, clock = made(maxsize=2)
    m["a"] = 1
    m["b"] = 2
    clock.now += 6
    assert m.touch("a") == 1  # lives until 116 now, and counts as the newest
    m["c"] = 3
    assert list(m) == ["a", "c"]
    clock.now += 9
    assert m.touch("a") == 1 and m.touch("absent") is None and "absent" not in m
    clock.now += 10
    assert m.touch("a") is None and "a" not in m


def test_a_full_map_drops_the_entry_set_longest_ago():
    m, clock = made(maxsize=3)
    for i, key in enumerate("abc"):
        m[key] = i
        clock.now += 1
    assert m.get("a") == 0  # a read does not count as use: "a" is still the oldest set
    m["b"] = 10  # set again: now the newest
    m["d"] = 3
    assert list(m) == ["c", "b", "d"] and len(m) == 3
    m["e"] = 4
    assert "c" not in m and list(m) == ["b", "d", "e"]


def test_expired_entries_go_first_and_all_at_once():
    m, clock = made(maxsize=100, ttl=10.0)
    for i in range(50):
        m[f"old-{i}"] = i
    clock.now += 5
    m["young"] = 1
    clock.now += 5  # the 50 old ones expire together, "young" lives on
    m["new"] = 2
    assert len(m._data) == 2  # a set let go of them: they hold no memory any longer
    assert list(m) == ["young", "new"]


def test_pop_and_del_of_live_expired_and_absent_entries():
    m, clock = made()
    m["a"] = 1
    m["b"] = 2
    assert m.pop("a") == 1 and "a" not in m
    assert m.pop("a", None) is None
    with pytest.raises(KeyError):
        m.pop("a")
    del m["b"]
    with pytest.raises(KeyError):
        del m["b"]
    m["c"] = 3
    clock.now += 10  # expired: popped as absent, and gone
    assert m.pop("c", "gone") == "gone"
    m["d"] = 4
    clock.now += 10
    with pytest.raises(KeyError):
        del m["d"]
    assert len(m._data) == 0


def test_clear_and_the_bounds_it_is_made_with():
    m, _ = made(maxsize=2, ttl=5.0)
    m["a"] = 1
    m.clear()
    assert len(m) == 0 and m.maxsize == 2 and m.ttl == 5.0
    for maxsize, ttl in ((0, 1.0), (1, 0.0)):
        with pytest.raises(ValueError, match="maxsize"):
            ExpiringMap(maxsize, ttl)


def test_digests_and_ages_used_in_messages():
    assert map_digest({"a": "1", "b": "2"}) == map_digest({"b": "2", "a": "1"})
    assert map_digest({"a": "12"}) != map_digest({"a1": "2"})
    assert [ago(s) for s in (0.5, 12, 300, 9000)] == ["just before", "12s ago", "5m ago", "2h ago"]


@pytest.mark.parametrize("kind", [dict, OrderedDict])
def test_remember_keeps_a_table_to_its_limit_dropping_the_oldest_set(kind: type) -> None:
    table = kind()
    for n, key in enumerate("abcd"):
        remember(table, key, n, 3)
    assert table == {"b": 1, "c": 2, "d": 3}
    remember(table, "c", 9, 3)  # an update keeps its place and drops nothing
    assert list(table.items()) == [("b", 1), ("c", 9), ("d", 3)]
    for n in range(1000):
        remember(table, n, n, 3)
    assert list(table.items()) == [(997, 997), (998, 998), (999, 999)]


def test_dropped_after_tells_a_key_pushed_out_from_one_never_set():
    m, clock = made(maxsize=2, ttl=10.0)
    m["a"] = 1  # at 100
    clock.now += 1
    m["b"] = 2  # at 101
    assert not m.dropped_after(0.0) and not m.lossy()  # nothing dropped: absence is evidence
    clock.now += 1
    m["c"] = 3  # at 102: "a" goes to make room
    assert m.dropped_after(100.0) and not m.dropped_after(100.5)
    assert m.lossy()  # "a" would be alive still
    m["b"] = 4  # set again: now the newest, "c" the oldest
    m["d"] = 5  # "c" goes, set at 102
    assert m.dropped_after(102.0) and not m.dropped_after(102.5)
    clock.now += 10.5  # "c" would have expired by now as well
    assert not m.lossy() and m.dropped_after(102.0)


def test_entries_that_expire_are_not_counted_as_dropped():
    m, clock = made(maxsize=2, ttl=10.0)
    m["a"] = 1
    clock.now += 11
    m["b"] = 2
    m["c"] = 3  # "a" had expired: the map was not full
    assert len(m._data) == 2 and not m.dropped_after(0.0)
