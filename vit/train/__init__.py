"""Training: the LightningModule (``classifier``), the optimizer and schedule (``optim``), callbacks, run-folder
policy (``runs``) and the ``train.py`` command line (``cli``). Only ``optim`` and ``runtime`` load without
Lightning."""
