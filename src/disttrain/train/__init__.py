"""L4: the trainer loop, lr schedules, metrics and fault injection."""
