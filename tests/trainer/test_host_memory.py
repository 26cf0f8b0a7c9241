"""The trainer's host-memory figures: the anonymous peak sees memory the process held and freed."""

import time

from finetune_trainer.hardware.host_memory import HostMemory


def test_the_anonymous_peak_keeps_memory_held_and_freed_since_start() -> None:
    memory = HostMemory(interval=0.02).start()
    before = memory.anon_peak_gib
    block = bytearray(256 * 2**20)  # zero-filled: every page is touched, so resident
    # Held until the sampling thread has seen it (its own peak, not a read that samples now),
    # however long a loaded machine keeps that thread waiting; 60 s is the ceiling.
    deadline = time.monotonic() + 60
    while memory._peak_kib / 2**20 - before < 0.2 and time.monotonic() < deadline:
        time.sleep(0.02)
    del block
    memory.stop()
    assert memory.anon_peak_gib - before >= 0.2
    assert memory.resident_peak_gib() >= memory.anon_peak_gib
