"""Traces of agent turns: recorded after each reply (record.py), graded by outcome (grade.py),
exported for fine-tuning (export.py) and summed per prompt variant (report.py)."""
