"""The built-in families, one home module each (numpy half) plus a `*_training` module (torch half).

Each home registers itself with `icrl_interp.registry` when imported; the registry imports the
homes on its first lookup. See docs/adding-a-family.md for writing a family of your own.
"""
