"""Checkpoints: what one holds and its file (:mod:`.checkpointer`), the sharded format of an FSDP run
(:mod:`.sharded`), the trainer's position (:mod:`.train_state`) and RNG streams (:mod:`.rng`), a pretraining
checkpoint's matching weights (:mod:`.partial_pretrain`), the files of a run folder (:mod:`.run_files`) and the
pickle-free hand-off folder (:mod:`.handoff`, its image encoder: :mod:`.features`)."""
