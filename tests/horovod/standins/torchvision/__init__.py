"""A stand-in for torchvision, for running Horovod's examples offline: tiny models of the
names the examples ask for, a synthetic MNIST, an ImageFolder over the files a test
writes, and the transforms the examples use.

Put on PYTHONPATH by tests/horovod/test_examples.py only; never part of the library.
"""

from . import datasets, models, transforms

__all__ = ["datasets", "models", "transforms"]
