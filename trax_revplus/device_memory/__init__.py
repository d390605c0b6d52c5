"""Device memory of a training step, from XLA's figures for its programs."""
