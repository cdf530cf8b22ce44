"""CIFAR-100 through torchvision (100 fine classes), downloaded into ``root`` where the network allows: the CIFAR-10
module with the other archive, statistics and classes."""

from __future__ import annotations

from .cifar10 import CIFAR10DataModule

URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
MEAN, STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)


class CIFAR100DataModule(CIFAR10DataModule):
    num_classes = 100
    classes = [
        "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle", "bowl", "boy",
        "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle", "chair", "chimpanzee", "clock",
        "cloud", "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur", "dolphin", "elephant", "flatfish",
        "forest", "fox", "girl", "hamster", "house", "kangaroo", "keyboard", "lamp", "lawn_mower", "leopard", "lion",
        "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain", "mouse", "mushroom", "oak_tree", "orange",
        "orchid", "otter", "palm_tree", "pear", "pickup_truck", "pine_tree", "plain", "plate", "poppy", "porcupine",
        "possum", "rabbit", "raccoon", "ray", "road", "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk",
        "skyscraper", "snail", "snake", "spider", "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank",
        "telephone", "television", "tiger", "tractor", "train", "trout", "tulip", "turtle", "wardrobe", "whale",
        "willow_tree", "wolf", "woman", "worm",
    ]
    dataset_class, url, folder, mean, std, title = "CIFAR100", URL, "cifar-100-python", MEAN, STD, "CIFAR-100"
    files = "train, test and meta"
