"""A table of named exclusive locks for one event loop: FIFO, with timeouts, that forgets.

Each key has at most one holder (any object, compared by identity) and a FIFO queue of
waiters. Release hands the key straight to the oldest waiter, so a newcomer can never
overtake the queue. A key nobody holds or waits for is not in the table at all: memory
follows the keys in use, not the keys ever seen.

Taking a free key is one dictionary lookup and one store; no future, timer or lock object
is created unless the key is busy. Not thread-safe: every caller runs on the same loop.
"""

from __future__ import annotations

import asyncio
from collections import deque


class _Waiter:
    __slots__ = ("future", "owner")

    def __init__(self, future: asyncio.Future[None], owner: object) -> None:
        self.future = future
        self.owner = owner


class LockTable:
    """Exclusive locks by string key; see the module docstring."""

    __slots__ = ("_holders", "_queues", "waiting")

    def __init__(self) -> None:
        self._holders: dict[str, object] = {}
        self._queues: dict[str, deque[_Waiter]] = {}  # only for keys with waiters
        self.waiting = 0  # waiters queued over all keys

    def __len__(self) -> int:
        """Keys currently held (a key with waiters always has a holder)."""
        return len(self._holders)

    def holder(self, key: str) -> object | None:
        return self._holders.get(key)

    def queued(self, key: str) -> int:
        queue = self._queues.get(key)
        return len(queue) if queue is not None else 0

    def try_acquire(self, key: str, owner: object) -> bool:
        """Take ``key`` if it is free; never waits."""
        holders = self._holders
        if key in holders:
            return False
        holders[key] = owner
        return True

    async def acquire(self, key: str, owner: object, timeout: float | None) -> None:
        """Take ``key``, queueing FIFO behind its holder for at most ``timeout`` seconds.

        Raises TimeoutError when the time is up (the waiter has then left the queue). If the
        awaiting task is cancelled, the waiter leaves the queue, or, when the key was handed
        over in the same instant, the key is passed on to the next waiter.
        """
        if self.try_acquire(key, owner):
            return
        if timeout is not None and timeout <= 0:
            raise TimeoutError
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop.create_future(), owner)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        queue.append(waiter)
        self.waiting += 1
        timer = None if timeout is None else loop.call_later(timeout, self._expire, key, waiter)
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.cancelled():
                self._leave(key, waiter)
            elif waiter.future.exception() is None:  # handed over as the cancel landed
                self.release(key, owner)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def release(self, key: str, owner: object) -> bool:
        """Give ``key`` up if ``owner`` holds it: to the oldest waiter, or to nobody."""
        holders = self._holders
        if holders.get(key) is not owner:
            return False
        queue = self._queues.get(key)
        while queue:
            waiter = queue.popleft()
            self.waiting -= 1
            if not waiter.future.done():
                if not queue:
                    del self._queues[key]
                holders[key] = waiter.owner
                waiter.future.set_result(None)
                return True
        if queue is not None:
            del self._queues[key]
        del holders[key]
        return True

    def _leave(self, key: str, waiter: _Waiter) -> None:
        queue = self._queues.get(key)
        if queue is None:
            return
        try:
            queue.remove(waiter)
        except ValueError:
            return
        self.waiting -= 1
        if not queue:
            del self._queues[key]

    def _expire(self, key: str, waiter: _Waiter) -> None:
        if not waiter.future.done():
            self._leave(key, waiter)
            waiter.future.set_exception(TimeoutError())
