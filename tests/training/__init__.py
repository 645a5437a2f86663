"""Tests of gridtnp.training and of training runs: checkpoints, resuming, scale-out, precision."""
