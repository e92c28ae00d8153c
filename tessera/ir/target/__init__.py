"""Target IR dialects, one file per target."""
