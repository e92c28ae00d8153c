"""Graph IR -> Graph IR transforms."""
