"""The machinery that keeps a burst of jobs fast, in the shape client-go gives a Go controller.

| module | what it holds |
| --- | --- |
| `streams.py` | list-and-watch of Jobs, pods and Kueue Workloads, resumed from the last version |
| `cache.py` | the newest body of every watched object, trimmed, read instead of the API server |
| `workqueue.py` | each job once, never twice at a time, the urgent first; retries with backoff |
| `pacing.py` | status and Event writes yield to Job creation during a burst |
| `resync.py` | every cached job queued again now and then |
| `coalesce.py` | a job's status changes short of the end wait until they have stood, then one write |
| `leader.py` | leader election on a Lease: one replica reconciles and writes, the others wait warm |

kopf watches the FineTuneJobs and starts the operator (handlers.py); everything here is built
without starting a thread, and started by handlers.py's `Operator.start()`.
"""
