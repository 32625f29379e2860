"""A corpus of real reported distributed-PyTorch hangs, reproduced on gloo CPU, and the score ddpwatch gets on it."""
