"""`proxy run`: setup, the restart loop, one engine launch (a segment), the watchdog, the pivot desk, status."""
