"""Hugging Face ``config.json`` import: families.py (the family table), convert.py (ModelSpec)."""
