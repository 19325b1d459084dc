"""An example warren plug-in package: an env, a model and an algorithm of its own (see ``docs/plugins.md``)."""
