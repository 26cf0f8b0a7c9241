"""The search: of the modes and loss chunk sizes the trainer can run, the layout that fits and
runs fastest, else the one closest to fitting and what would fit instead.

`make.make_plan` is the one entry (`parallelism.choose` calls it for a spec): it tries each
mode's layouts (`best`), then the savers that keep one pass of the micro-batch (the recomputing
layers' inputs in host memory, `one_pass`), then the pair split (`pair_split`), sizes the layers'
activations on what fits (`recompute`), and says what would fit where nothing does
(`suggestions`). The figures are the layouts' and `host`'s, the sentences `messages`'.
"""
