"""Tile IR -> Target IR for gpu."""
