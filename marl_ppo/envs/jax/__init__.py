"""JaxMARL's envs (SMAX, Overcooked, Hanabi, MPE) as one jitted, vmapped batch handed to torch by DLPack."""
