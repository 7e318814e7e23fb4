"""Layer 4: probes on a model's forward pass and the HDF5 recordings they write: probe specs
(`probe_spec`), capture hooks (`capture`), where the prompts come from (`prompts`), the recorder
(`recorder`) and its writer thread (`background`), the file format with its writer and reader
(`format`), the HDF5 integrity checks (`integrity`), shards (`shards`), live reading (`live`) and size
budgets (`budget`)."""


def __getattr__(name: str):
    """`icrl_interp.recording.Recording` and the other names of the flat module this package replaced
    (now `recording.format`), for one release: see icrl_interp._compat."""
    from .._compat import old_attribute

    return old_attribute(__name__, name)
