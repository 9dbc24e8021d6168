"""Data: dataset files (``cifar10``), finding and decoding image files (``files``, ``images``), batched on-device
augmentation (``augment``) and the LightningDataModules (``datamodule``: the shared base and CIFAR-10; ``cifar100``;
``folder``: image folders). Only the modules with a DataModule import Lightning."""
