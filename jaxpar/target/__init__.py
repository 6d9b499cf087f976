"""Time to a target: what a run aims at, how fast it progresses towards it, and how many steps
it will take at another batch.

- goal.py: the target (an accuracy or a loss) and when a run reached it;
- steps.py: the steps model, integrated along a reference run's noise trace;
- reference.py: a reference run, the record the steps model starts from (python -m
  jaxpar.target); reading.py reads one from its workdir or a JSON file;
- goodput.py: which batch and mesh make the most progress per second, and a schedule of them
  simulated along a trace;
- sync_factors.py: the approximate sync modes' steps over allreduce's.

The trainer, the bench and the planner import this package; it imports none of them. AdaScale's
gain (jaxpar/gain.py) sits below it: the optimiser and the steps model both import it.
"""

from jaxpar.target.goal import Target

__all__ = ["Target"]
