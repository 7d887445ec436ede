"""What the suites that start engines share: which engine they drive (engines.py), a frame-level
gate that holds a fast engine at a step (gate.py, gate_process.py), and the test's reaction delay
(reaction.py). tests/ is on sys.path (pyproject.toml, pytest's `pythonpath`), so this is `harness`.
"""
