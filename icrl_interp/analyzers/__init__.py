"""Analyzers: numpy / scikit-learn metrics on checkpoints and HDF5 recordings.

Nothing here imports torch or transformer_lens. Modules, one idea each:
weights (block sparsity, scaling manifold, sign pattern, TL heads), kernel
(kernel diagonality), td_probe (streaming ridge probes), convergence (value
error, VD/SS/IWS, the depth summary), readout (a foreign model's value error
by depth through its own readout and a tuned lens), inputs (input kinds and discovery, chunked reading), streams
(the per-chunk accumulators), analyze (the JSON contract, batches in parallel
processes). Which analyses apply is read from the family registry's hints and the
data present, never from a family's name.
"""
from .analyze import SCHEMA, AnalyzeOptions, analyze, analyze_many
from . import convergence, kernel, readout, td_probe, weights

__all__ = ["SCHEMA", "AnalyzeOptions", "analyze", "analyze_many", "convergence", "kernel", "readout", "td_probe",
           "weights"]
