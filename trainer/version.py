"""The trainer's version, recorded in every summary and exported model.

Apart from ``trainer/__init__.py`` so the modules that record it need not import the package's front
(which imports ``trainer.train`` to offer ``train()``): no module of the trainer imports its package.
"""

__version__ = "0.1.0"
