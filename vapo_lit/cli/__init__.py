"""Thin command-line entry points: parse, validate, call (logic lives in the package)."""
