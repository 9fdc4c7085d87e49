"""SIMULATED placeholder (rl-verify simulator) at the path of XTuner's FlashAttention ops (FA3 kernels: not batch-
invariant, off in the bitwise lane).

Nothing here runs: the replay trainer is xtuner/rlsim/. The file exists so that the suite specs' path rules
(affects, bitwise.disabled_by) are checked against the same paths as on XTuner's own tree, and so that a
simulated commit can touch it.
"""
