"""The model as this run trains it: on `data`, `hardware`, `memory` and `modes`.

- `loading.py`: the model config, the tokenizer and the NF4 model with LoRA, placed as the mode
  says (or on the meta device, for the mode to stream); `gpu_quantise.py`: quantising on the
  rank's GPU on the way to the host.
- `families.py`: the model family at run time, `targetModules`, the logit transform.
- `attention.py`: the fp32 attention registered with transformers (`sdpa_expanded`);
  `attention_choice.py`: which kernel runs, probed at start, and what the planner plans for it.
- `loss_head.py`: the loss inside the LM head; `precision_guard.py`: the fp32 guard;
  `dropout.py`: dropout off for a forward that must repeat.
- `tiny_model.py`: the tiny model and its data, for the tests, the demo and `ftjob`.

It must not import the objectives, the state, the outputs or the training loop: they all stand
on the model.
"""
