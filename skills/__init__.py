"""skills package (filled by later issues)."""
