"""Command-line tools: tessera-opt and the tessera CLI."""
