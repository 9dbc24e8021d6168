"""Train and evaluate a ViT: a LightningCLI (vit.train.cli) driven by the YAML files in configs/.

    python train.py fit --config configs/cifar10_cpu15.yaml
    python train.py test --ckpt_path runs/<name>/version_0/checkpoints/best.ckpt
    python train.py fit --help
"""

from vit.train.cli import main

if __name__ == "__main__":
    main()
