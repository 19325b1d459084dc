"""The learner role: step data in, the job's algorithm trained, policy files out to the shared volume."""
