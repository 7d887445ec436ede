"""Unit tests of scripts/ (the benchmark and evaluation scripts), by their path."""
