"""The `proxy` subcommands other than `run`: status, checkpoint, stop, pivot, fork."""
