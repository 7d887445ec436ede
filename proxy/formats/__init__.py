"""On-disk and on-the-wire formats, each defined once (docs/FORMATS.md).

The proxy, the tests, the benchmarks and the dashboard all read and write
these files through this package: checkpoints, token shards, engine frames
and events, the loss log, `.state.json`, `.samples.json` and the engine's
command line.
"""
