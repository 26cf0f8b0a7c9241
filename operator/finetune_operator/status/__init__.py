"""What the FineTuneJob's status should say, computed purely from what the cluster shows.

Input: the job's spec (or why it is invalid), its batch Job, the Job's pods and the status as
it is now (`observation.Observation`). Output: the operator's fields of the status (never
`progress` or `lastCheckpoint`, which belong to the trainer) and the transitions worth an Event
(trouble only). Every module is pure functions of plain API dicts; no I/O, no clock.

| module | what it owns |
| --- | --- |
| `observation.py` | what one reconcile saw, and the reasons a job is refused before any Job exists |
| `conditions.py` | one API Condition as on the wire (its transition time kept), and their order |
| `pods.py` | how the pods ended: why one failed, attempts, the Failed reason, export failures, the OOM retry |
| `scheduling.py` | Scheduled for one pod or a gang, and whether a trainer runs (a gang's: every pod runs) |
| `queue.py` | Kueue's admission and preemptions: `status.queue`, the Admitted and Preempted conditions |
| `phase.py` | `compute`: the phase, its conditions and message; `hand_over` for the write's timing |
| `events.py` | the transitions between two statuses worth a Warning |
| `patch.py` | the operator's part of the status, whether it changed, and the merge patch that writes it |

Rules that users rely on:
- A job that trained but could not write a format of spec.output.formats (the trainer exits 0
  saying `ExportFailed: <format>: <cause>`) is Succeeded, with Exported=False (ExportFailed)
  naming the format and the cause, the message saying it and one Warning.
- Failed only when the Job itself has failed: a pod failure while the Job still has retries
  is a restart (counted in `restarts`), not a failure.
- The Failed reason is the trainer's own (from its termination message or exit code), or
  OOMKilled, DeadlineExceeded, BackoffLimitExceeded.
- Scheduled=False carries the scheduler's message.
- A job of several nodes (`nodes` > 1) is one gang: `status.nodes` counts its running pods; it is
  Running only when every pod runs (until then each launcher waits at the rendezvous and no
  trainer starts); a pod the scheduler cannot place is named with how many of the gang wait,
  e.g. `Unschedulable: 1 of 2 pods pending: 0/5 nodes are available: ...`; `restarts` counts
  gang attempts (failed pods over nodes, rounded up: one failed pod fails its peers' collectives).
- An attempt that ran out of GPU memory the first time (the trainer's OutOfMemoryRetry) is
  followed by one on a tighter plan: `status.oomRetry` keeps what the trainer said (where, the
  peak against the plan, the tighter plan), one Event says it, and the message says it while
  the retry runs. A second OOM fails the job with the trainer's OutOfMemory.
- A queued job (spec.placement.queueName) says what Kueue says, in Kueue's words: Queued with
  its reason and message while the Workload waits, Admitted, Preempted (by whom, when the
  preemptor is a job the operator knows) while the evicted pod stops, then Queued again.
"""
