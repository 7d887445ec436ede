"""`proxy run`: setup, the restart loop, one engine launch (its state, its start, its frames), the watchdog,
the pivot desk, status."""
