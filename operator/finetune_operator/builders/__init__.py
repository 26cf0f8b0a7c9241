"""Pure functions from a validated FineTuneJob to the objects the operator creates: no I/O."""
