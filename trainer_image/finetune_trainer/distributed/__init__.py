"""Data-parallel QLoRA: one process per GPU, every GPU computing at once.

The single-process trainer shards a model over the pod's GPUs with `device_map`, which runs the
layers one GPU after another: N GPUs give the speed of one. When the quantised model fits one
GPU, this mode instead keeps a full NF4 copy on every GPU, gives each its own micro-batches and
averages only the LoRA gradients (a few MB), so N GPUs do N micro-batches at once.
Launched with torchrun (`launch.py`); each rank runs `worker.py`.
"""
