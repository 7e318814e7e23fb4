"""Layer 6: causal interventions on a model's forward pass."""
