"""The numpy twin of the built-in algorithms' torch networks: what MLP jobs run, on collectors and on the learner.

On the small MLPs of classic-control jobs a torch step or forward pass is bound by
torch's per-op dispatch, not by its arithmetic: the same math written out in numpy costs
a third to a half, and a collector that acts in numpy never imports torch (~2.5 s of CPU
at its start). Each algorithm keeps its torch code as the readable specification and
writes its numpy twin beside it (``numpy_actor.py``, ``numpy_step.py``, and each loss's
twin with its gradient in ``losses.py``, next to the torch loss); what the twins share
lives here:

* :mod:`.layout`: the built-in mlp's tensor names and shapes, without torch;
* :mod:`.params`: one flat float32 vector of parameters with its gradient, as named views;
* :mod:`.layers`: linear layers over those views, forward and backward;
* :mod:`.adam`: torch's Adam and gradient clip on the flat vectors;
* :mod:`.actors`: the numpy actors' base, and the algorithms' choice between the two actors;
* :mod:`.step`: how a learner delegates its train step to torch or to numpy (one pattern);
* :mod:`.bridge`: the one module here that imports torch: copying between the twin and
  the torch networks and optimizers, and whether numpy can run a torch network.

Import the submodules directly; this package imports nothing itself.
"""
