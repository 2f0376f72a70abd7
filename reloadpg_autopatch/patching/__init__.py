"""What torch is taught: wrappers derived from its signatures, installed in its namespaces.

Everything here may import torch; nothing here owns a group's state (that is ``groups/``).
"""
