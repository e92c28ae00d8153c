"""Tile IR -> Target IR for rocm."""
