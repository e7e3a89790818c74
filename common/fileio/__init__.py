"""Safe file I/O: loading tensors without running pickled code (:mod:`.safe_load`) and the one atomic writer
(:mod:`.safe_write`)."""
