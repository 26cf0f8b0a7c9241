"""Each mode's memory on every GPU: one module per mode, and `mode.layout_for` to pick one.

A layout assigns `memory`'s per-component bytes to the GPUs the way that mode runs the model
(finetune_api.modes): `device_map` cuts the layers into blocks, one per GPU, `data_parallel` puts
a whole copy on each, `fsdp` shards every weight over them. Pure arithmetic on a shape, a recipe
and the hardware; which layout wins is the search's (`search`).
"""
