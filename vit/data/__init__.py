"""Data: dataset files (``cifar10``), batched on-device augmentation (``augment``) and the LightningDataModules
(``datamodule``). Only ``datamodule`` imports Lightning."""
