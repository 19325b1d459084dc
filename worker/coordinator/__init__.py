"""The coordinator role: schedules collect and eval tasks, forwards data to the learner."""
