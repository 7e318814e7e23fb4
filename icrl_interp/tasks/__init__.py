"""Layer 1: the tasks (Boyan chains, random MDPs), prompt layouts, prompt sampling and the float64 reference algorithms."""
