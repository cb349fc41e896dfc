"""bionemo stage."""
