"""Ways to spread one model over the ranks of a process group (FSDP2 sharding: :mod:`common.parallel.fsdp`)."""
