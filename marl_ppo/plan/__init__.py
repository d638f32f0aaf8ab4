"""The run settled once: every `auto` resolved on this machine and the env's layout read from one
probe copy, in a frozen `RunPlan` that the builders, the trainer, evaluation and the memory check take."""
