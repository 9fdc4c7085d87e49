"""SIMULATED placeholder (rl-verify simulator) at the path of XTuner's LMDeploy rollout backend (the runbook's full
runs use it; the bitwise lane's SGLang runs bypass it).

Nothing here runs: the replay trainer is xtuner/rlsim/. The file exists so that the suite specs' path rules
(affects, bitwise.disabled_by) are checked against the same paths as on XTuner's own tree, and so that a
simulated commit can touch it.
"""
