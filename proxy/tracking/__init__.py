"""Experiment tracking: TensorBoard event files and Weights & Biases, written from the run's own records by a
process of their own (docs/OPERATIONS.md, "Tracking"). Nothing here is on the training path."""
