"""What the suites that start engines share, one job per module:

- engines.py: which engine they drive (MICROGPT_TEST_ENGINE: cpu, cuda or a path);
- shape.py: the one shape type (model, batch, optimizer) and the engine's command line for it;
- engine.py: the one wrapper of a running child (`Child`) and of a running engine (`Engine`);
- data.py: token rows, TRAIN frames and shards;
- fsync_shim.py (fsync_shim.c): slow or failing checkpoint writes, preloaded into an engine;
- gate.py, gate_process.py: a frame-level gate that holds a fast engine at a step;
- reaction.py: the test's reaction delay.

tests/ is on sys.path (pyproject.toml, pytest's `pythonpath`), so this is `harness`.
"""
