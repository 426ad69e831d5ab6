"""A worked example of a splitinfer plugin (docs/extending.md): one defense and one attack.

- :mod:`splitinfer_example.mixing`: ``hidden-mix``, a secret orthogonal mixing of the hidden dimension
  blended into the states the local head sends (strength ``alpha``);
- :mod:`splitinfer_example.knn`: ``knn-match``, a k-nearest-neighbour matcher from a state to the tokens of the
  most similar states the attacker made itself with the public weights.

Each module registers its component with splitinfer's own decorators when imported; the package's entry points
(pyproject.toml) make splitinfer import them.
"""
