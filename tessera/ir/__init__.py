"""The four IR layers as xDSL dialects: graph, schedule, tile, target/<t>."""
