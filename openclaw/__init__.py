"""openclaw package (filled by later issues)."""
