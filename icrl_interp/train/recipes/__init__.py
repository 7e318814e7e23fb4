"""The families' training recipes (the torch half of each family)."""
