"""Env plug-ins that ship with warren: gymnasium's registry (and, with ale-py, Atari).

Warren adds two partially observed ids to that registry (:mod:`.partial`).
"""
