"""Time to a target: what a run aims at, how fast it progresses towards it, and how many steps
it will take at another batch.

- goal.py: the target (an accuracy or a loss) and when a run reached it;
- gain.py: AdaScale's gain and Pollux's statistical efficiency, from the gradient noise scale.

The trainer, the bench and the planner import this package; it imports none of them.
"""

from jaxpar.target.goal import Target

__all__ = ["Target"]
