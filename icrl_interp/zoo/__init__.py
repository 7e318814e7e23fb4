"""The zoo: models whose algorithm is known, and the runner that scores the verdict on them (docs/zoo.md)."""
