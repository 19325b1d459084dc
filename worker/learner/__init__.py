"""The learner role: trains a DQN on the step data and publishes policies to the volume."""
