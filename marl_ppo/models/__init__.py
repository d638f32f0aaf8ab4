"""Networks: stacked per-agent MLP layers, action distributions, and the team model of actors and critics."""
