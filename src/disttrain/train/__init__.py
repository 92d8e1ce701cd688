"""L3: the trainer loop, lr schedules, checkpoints, metrics and fault injection."""
