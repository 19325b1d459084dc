"""Model plug-ins that ship with warren: the encoders algorithms put their heads on."""
