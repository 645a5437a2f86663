"""Tests of gridtnp.nn: every stage's components and the layers they share."""
