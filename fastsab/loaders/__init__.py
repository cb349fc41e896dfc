"""loaders stage."""
