"""The built-in families, one numpy home module each; each one's torch half (its training recipe) is in
`icrl_interp.train.recipes`.

Each home registers itself with `icrl_interp.families.registry` when imported; the registry imports the
homes on its first lookup. See docs/adding-a-family.md for writing a family of your own.
"""
