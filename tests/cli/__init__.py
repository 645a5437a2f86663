"""Tests of gridtnp.cli: the command line, its one-line errors and what it prints."""
