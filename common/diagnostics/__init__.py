"""What a run tells about itself: the non-finite finder (:mod:`.nonfinite`), the step profiler (:mod:`.profiling`),
the run record (:mod:`.run_record`), FLOPs (:mod:`.flops`), the TensorBoard reader (:mod:`.tb_events`) and the
paper's figures (:mod:`.paper_results`)."""
