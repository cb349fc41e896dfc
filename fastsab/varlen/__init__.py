"""varlen stage."""
