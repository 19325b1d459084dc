"""Algorithm plug-ins that ship with warren, one room each, on the same contract as third-party ones."""
