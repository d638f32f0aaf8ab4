"""From run directories to results: sweeps, reading logged scalars, statistics, reports and curves."""
