"""position stage."""
