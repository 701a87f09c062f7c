"""The lock table: exclusive, FIFO, timeouts and cancellation leave no trace, forgets free keys."""

from __future__ import annotations

import asyncio

import pytest

from plugproxy.core.locks import LockTable


def empty(table: LockTable) -> bool:
    return len(table) == 0 and table.waiting == 0 and not table._queues


async def test_free_key_is_taken_at_once_and_forgotten_on_release():
    table = LockTable()
    await table.acquire("volume:a", "A", timeout=1.0)
    assert table.holder("volume:a") == "A"
    assert not table.try_acquire("volume:a", "B")
    assert table.release("volume:a", "A")
    assert empty(table)


async def test_release_by_someone_else_is_ignored():
    table = LockTable()
    assert table.try_acquire("k", "A")
    assert not table.release("k", "B")
    assert not table.release("other", "A")
    assert table.holder("k") == "A"


async def test_waiters_get_the_key_in_arrival_order():
    table = LockTable()
    table.try_acquire("k", "holder")
    order: list[str] = []

    async def waiter(name: str) -> None:
        await table.acquire("k", name, timeout=5.0)
        order.append(name)
        await asyncio.sleep(0)
        table.release("k", name)

    tasks = []
    for name in ("w1", "w2", "w3", "w4"):
        tasks.append(asyncio.create_task(waiter(name)))
        await asyncio.sleep(0)  # each enqueues before the next starts
    assert table.waiting == 4
    # A newcomer that arrives while the key is being handed over cannot overtake.
    table.release("k", "holder")
    assert table.holder("k") == "w1"
    assert not table.try_acquire("k", "newcomer")
    await asyncio.gather(*tasks)
    assert order == ["w1", "w2", "w3", "w4"]
    assert empty(table)


async def test_timeout_leaves_the_queue():
    table = LockTable()
    table.try_acquire("k", "holder")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        await table.acquire("k", "late", timeout=0.05)
    assert loop.time() - started < 1.0
    assert table.waiting == 0 and table.queued("k") == 0
    table.release("k", "holder")
    assert empty(table)


async def test_zero_timeout_never_queues():
    table = LockTable()
    table.try_acquire("k", "holder")
    with pytest.raises(TimeoutError):
        await table.acquire("k", "late", timeout=0)
    assert table.waiting == 0


async def test_cancelled_waiter_leaves_and_the_next_one_proceeds():
    table = LockTable()
    table.try_acquire("k", "holder")
    first = asyncio.create_task(table.acquire("k", "first", timeout=5.0))
    second = asyncio.create_task(table.acquire("k", "second", timeout=5.0))
    await asyncio.sleep(0)
    assert table.waiting == 2
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert table.waiting == 1
    table.release("k", "holder")
    await asyncio.wait_for(second, 1.0)
    assert table.holder("k") == "second"
    table.release("k", "second")
    assert empty(table)


async def test_cancel_landing_as_the_key_is_handed_over_passes_it_on():
    table = LockTable()
    table.try_acquire("k", "holder")
    first = asyncio.create_task(table.acquire("k", "first", timeout=5.0))
    second = asyncio.create_task(table.acquire("k", "second", timeout=5.0))
    await asyncio.sleep(0)
    table.release("k", "holder")  # hands to "first", whose task has not run yet
    assert table.holder("k") == "first"
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1.0)
    assert table.holder("k") == "second"
    table.release("k", "second")
    assert empty(table)


async def test_cancel_landing_just_after_expiry_does_not_touch_the_holder():
    table = LockTable()
    table.try_acquire("k", "holder")
    waiter = asyncio.create_task(table.acquire("k", "late", timeout=60.0))
    await asyncio.sleep(0)
    queued = table._queues["k"][0]
    table._expire("k", queued)  # the timer fires ...
    waiter.cancel()  # ... and the caller cancels before the task resumes
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert queued.future.done()
    assert table.holder("k") == "holder" and table.waiting == 0


async def test_table_is_empty_after_100k_distinct_keys():
    table = LockTable()
    for i in range(100_000):
        key = f"volume:pvc-{i}"
        owner = object()
        await table.acquire(key, owner, timeout=60.0)
        if i % 1000 == 0:  # some keys also see contention
            other = object()
            waiter = asyncio.create_task(table.acquire(key, other, timeout=60.0))
            await asyncio.sleep(0)
            table.release(key, owner)
            await waiter
            table.release(key, other)
        else:
            table.release(key, owner)
    assert empty(table)
