"""What rank 0 tells the world while it trains: on nothing of the trainer.

- `progress.py`: progress as JSON lines, TensorBoard, loss spikes.
- `status_patch.py`: the FineTuneJob's status patches (throttled).
- `curves.py`: the loss curve as a PNG beside the adapter, and the whole run's eval figures.
- `report.py`: report.html beside the adapter: the curves, evaluation.json's table and answers, the settings.

It must not import any other part of the trainer: every part may report, none is reported to.
"""
