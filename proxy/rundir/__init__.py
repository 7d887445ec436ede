"""The run directory: its layout, the locks, the frozen experiment, phases, retention, pivots."""
