"""Analyzers: numpy / scikit-learn metrics on checkpoints and HDF5 recordings.

Nothing here imports torch or transformer_lens. Every analysis is a registered analyzer (`base`: the
protocol, `registry`: the one list, `keys`: the JSON keys and tolerant reading; docs/adding-an-analyzer.md),
one module each: weights (block sparsity, scaling manifold, sign pattern, TL heads), kernel (kernel
diagonality, the population kernel), convergence (value error by depth, VD/SS/IWS math), probes (the
streaming TD probes; td_probe: their statistics), td_step (Wang's VD/SS/IWS at the fitted batch-TD
step), readout (a foreign model's value error by depth through its own readout and a tuned lens);
inputs (input kinds and discovery, chunked reading), streams (what the streams share), analyze (the
driver: the JSON contract, batches in parallel processes). Which analyses apply is read from the
family registry's hints and the data present, never from a family's name.
"""
from . import convergence, kernel, readout, td_probe, weights
from .analyze import SCHEMA, AnalyzeOptions, analyze, analyze_many
from .base import Analyzer, Chunk, Column, Context
from .registry import register

__all__ = ["SCHEMA", "Analyzer", "AnalyzeOptions", "Chunk", "Column", "Context", "analyze", "analyze_many",
           "convergence", "kernel", "readout", "register", "td_probe", "weights"]
