"""warren's roles: collector, coordinator and learner, and the shared-volume storage."""
