"""`make bench`: the reference recipe against our trainer on the same shape and GPUs."""
