"""The collector worker: runs the job's actor in a batch of envs for the collect and eval tasks the broker
brings, and ships a collect task's samples as step files on the shared volume, their metadata through the broker."""
