"""Data: dataset files (``cifar10``), finding and decoding image files (``files``, ``images``), batched on-device
augmentation (``augment``) and the LightningDataModules (``datamodule``: the shared base and CIFAR-10; ``folder``:
image folders). Only ``datamodule`` and ``folder`` import Lightning."""
