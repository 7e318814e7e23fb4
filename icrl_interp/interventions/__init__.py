"""Layer 6: causal interventions on a model's forward pass: the causal test (`causal`, its entry) and its
parts (`edits`, `sites`, `experiment`, `statistics`, `baseline`)."""
