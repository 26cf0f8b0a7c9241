"""Training data: read records with their line numbers, normalise each format, check, load."""
