"""Layer 1: the tasks (Boyan chains, random MDPs), prompt layouts, prompt sampling and the float64 reference algorithms;
learning histories (`episodes`), Gymnasium environments (`environments`), the tabular learning rules (`learners`) and
the source agents that collect histories (`collect`)."""
