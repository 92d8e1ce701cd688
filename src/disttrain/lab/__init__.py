"""L5: benchmarks, compare reports and the cost model."""
