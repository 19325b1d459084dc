"""Using a trained policy outside training (private: the public names are :mod:`warren`'s).

* :mod:`.header`: what a policy file says about itself (the job that trained it; for the
  best policy, the eval that chose it);
* :mod:`.policy`: :func:`~worker.agent.policy.load_policy` and :class:`~worker.agent.policy.Policy`,
  the collectors' own actor built from a policy file, with no broker;
* :mod:`.episodes`: whole episodes of a policy in the job's env (``warren eval``);
* :mod:`.video`: mp4 files of episodes (``warren eval --video``, training-time videos);
* :mod:`.onnx_export`: a built-in actor as an ONNX graph (``warren export``).

:class:`warren.Job` (a job run from Python) lives in :mod:`warren.job`: it drives ``warren run``,
the command line's floor, which this package sits below.
"""
