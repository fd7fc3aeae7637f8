"""connectors package (filled by later issues)."""
