"""The processes of a run: distributed set-up (:mod:`.distributed`), preemption (:mod:`.preemption`) and logging
(:mod:`.logs`)."""
