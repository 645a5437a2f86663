"""Tests of gridtnp.models: whole models, presets and recipes."""
