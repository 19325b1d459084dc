"""A third party's plug-in package, with the faults plug-in authors meet first (warren's tests load it).

It is not installed: a test puts ``tests/faulty_plugins`` on ``PYTHONPATH``, where its
``warren_faulty_plugins-0.1.0.dist-info`` names the entry points, so every process of a
run finds the plug-ins as it finds an installed package's (distribution
``warren-faulty-plugins``, version 0.1.0).

* env plug-in ``grid`` (:mod:`.grid`): a corridor gridworld with a ``Dict`` observation;
  its env ids pick a fault (``grid`` has none).
* model plug-ins (:mod:`.model`): ``gridnet`` works; ``gridnet-wide`` returns one column
  more than its ``out_dim`` says; ``gridnet-nan`` returns NaN; ``gridnet-nan-training``
  returns NaN only in training mode (collectors act fine, the learner's updates go NaN).
"""
