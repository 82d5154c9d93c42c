"""From jobs to launches: plan types (one registry), launches, nodes."""
