"""L4: launching workers on one node or many, and the emulated cluster."""
