"""Data: benchmark readers (MNIST, CIFAR-10), PU split construction and volume datasets."""
