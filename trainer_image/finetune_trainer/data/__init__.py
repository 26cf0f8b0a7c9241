"""Training data: read records with their line numbers, normalise each format, check, load.

It stands on `failures` alone: the tokenizer it is handed is the model's, but it never imports
the model, nor anything else of the trainer.
"""
