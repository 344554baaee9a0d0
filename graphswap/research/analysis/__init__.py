"""The third floor of research: measuring kernels on a model, on top of data and training.

evaluation (kernels side by side, optionally after fine-tuning), sweeping (the per-layer
sensitivity sweep), saliency (saliency maps: it reads images and writes PNGs, so it sits here
rather than in surgery/, whose `override` it uses).
"""
