"""microgpt's supervising proxy: data, bandit, engine supervision, run directory."""
