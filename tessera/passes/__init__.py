"""Passes, one per file, grouped by the boundary they cross; ``pipelines`` names the pipelines."""
