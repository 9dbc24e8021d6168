"""Train and evaluate a ViT on CIFAR-10.

    python train.py fit --config configs/cifar10_cpu15.yaml
    python train.py test --ckpt_path runs/<name>/version_0/checkpoints/best.ckpt
    python train.py fit --help
"""

from vit.cli import main

if __name__ == "__main__":
    main()
