"""One module per CLI subcommand (see `icrl_interp.cli`)."""
