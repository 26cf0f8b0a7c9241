"""What a run leaves behind besides its checkpoints: on `model` and `modes`.

- `export.py`: the adapter (naming its base by its public name), the formats of
  `output.formats` and `summary.json`; `checks.py`: each format's pre-flight check.
- `merge_stream.py`: the merge streamed shard by shard; `gguf_export.py`: GGUF through
  llama.cpp's pinned converters.
- `samples.py`: the sample answers after training.
- `export_only.py`: `--export-only` (`ftjob export`), the formats again from a saved adapter.

It must not import the training loop or the recipe: an export runs without them
(`export_only.py`).
"""
