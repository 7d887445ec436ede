"""The mixing evaluation behind scripts/eval_mixing.py: runs, their summary, the report."""
