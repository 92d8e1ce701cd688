"""L5: launching workers on one node or many (the emulated cluster is disttrain.cluster)."""
