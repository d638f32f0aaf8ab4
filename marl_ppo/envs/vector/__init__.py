"""Vector envs: E adapted copies stepped in this process (`sync`) or in worker processes (`subprocess`,
over shared memory, started by `pool`), and the pickled env state that checkpoints carry."""
