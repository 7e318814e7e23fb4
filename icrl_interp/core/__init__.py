"""Layer 0: what every other layer uses (errors, validation, file integrity, output folders, resources, devices, the Dask cluster, CLI fields)."""
