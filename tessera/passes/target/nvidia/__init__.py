"""Tile IR -> Target IR for nvidia."""
