"""The trainer's host-memory figures: the anonymous peak sees memory the process held and freed."""

import time

from finetune_trainer.host_memory import HostMemory


def test_the_anonymous_peak_keeps_memory_held_and_freed_since_start() -> None:
    memory = HostMemory(interval=0.02).start()
    before = memory.anon_peak_gib
    block = bytearray(256 * 2**20)  # zero-filled: every page is touched, so resident
    time.sleep(0.2)
    del block
    time.sleep(0.1)
    memory.stop()
    assert memory.anon_peak_gib - before >= 0.2
    assert memory.resident_peak_gib() >= memory.anon_peak_gib
