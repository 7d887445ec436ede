"""Unit tests of scripts/mixing/ (the mixing evaluation behind scripts/eval_mixing.py)."""
