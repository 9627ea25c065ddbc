"""sb3-contrib 2.9.2's own tests for MaskablePPO and RecurrentPPO, run with the Scalable classes swapped in."""
