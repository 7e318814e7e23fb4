"""Layer 7: which algorithm the forward pass runs (candidates, behavioural evidence, causal evidence)."""
