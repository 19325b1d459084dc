"""Env plug-ins that ship with warren: gymnasium's registry (and, with ale-py, Atari)."""
