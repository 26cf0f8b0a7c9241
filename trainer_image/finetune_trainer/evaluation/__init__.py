"""The base against the tuned model on the held-out split (`dataset.evalFraction` or
`dataset.eval`, `spec.evaluation`): the base is the same model with its adapter switched off, as
DPO's reference is, never a second copy.

- `passes.py`: the held-out pass, the objective's loss over held-out rows in eval micro-batches
  split over the ranks (the loop's evaluation at checkpoints takes it too).
- `measure.py`: one model's figures on the held-out rows (SFT: loss and perplexity; DPO and
  ORPO: loss, preference accuracy, reward accuracy and margin) and its per-example values.
- `generation.py`: both models' greedy answers to held-out examples with a reference answer,
  through the sample answers' machinery (outputs/samples.py).
- `metrics.py`: those answers scored by the libraries (ROUGE-L, chrF, BLEU, exact match).
- `files.py`: evaluation.json beside the adapter, written atomically, read back on a resume.
- `stages.py`: the stages the train stage calls (the base before the first step, the tuned model
  at checkpoints and after training) and what rank 0 reports of them.
"""
