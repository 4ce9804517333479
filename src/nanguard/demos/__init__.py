"""Short, readable demo scripts (``nanguard demo`` runs them)."""
