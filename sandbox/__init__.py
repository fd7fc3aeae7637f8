"""sandbox package (filled by later issues)."""
