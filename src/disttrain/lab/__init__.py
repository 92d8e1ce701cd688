"""L4: benchmarks, compare reports and the cost model."""
