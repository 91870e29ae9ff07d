"""Running a processor: holding segments, reading batches once, the loops and balance."""
